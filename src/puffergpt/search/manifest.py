"""The manifest that vouches for a loaded model: the key it is stored under, reading it
(refusing one that is missing, unfinished, of another encoding or at odds with itself, with
the command that fixes it), and the engine opened over it.

``load.py`` writes it, last, once every document has been read back against it;
``verify.py`` reads the documents against it.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from puffergpt.search.documents import ENCODING_VERSION, Encoding
from puffergpt.search.engine import Engine
from puffergpt.search.verify import (
    StoreDamaged,
    check_on_open,
    damage_message,
    inconsistent,
    index_damage,
    index_message,
)
from puffergpt.stores.base import Store, StoreError


class NotLoaded(StoreError):
    """The store does not hold a complete, current copy of the model."""


def model_key(model: str) -> str:
    """The name a model is stored under: its own name, or for a directory its base name
    and a hash of its full path (two checkpoints never share a key). Stores take ASCII
    letters, digits, '_', '.' and '-' and a letter or digit first: other characters of a
    directory's name become '-', and what is left starts at its first letter or digit."""
    p = Path(model).expanduser()
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_\-]*", model) and not p.exists():
        return model
    base = re.sub(r"[^A-Za-z0-9_\-]+", "-", p.resolve().name).lstrip("_-")[:40].rstrip("_-") or "model"
    return f"{base}-{hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:8]}"


MANIFEST_FIELDS = ("complete", "version", "config", "metric", "namespaces", "matrices", "documents")


def stored_manifest(store: Store, key: str) -> dict | None:
    """The manifest as stored: None if there is none, or if it is broken (text that is not
    JSON, not a dict, fields missing), which a load then rewrites."""
    try:
        m = store.get_meta(f"manifest:{key}")
    except ValueError:  # JSON that does not parse, from a store that keeps text
        return None
    return m if isinstance(m, dict) else None


def broken(m) -> str | None:
    """What is wrong with a stored manifest's shape, or None."""
    if not isinstance(m, dict):
        return f"it is a {type(m).__name__}, not an object"
    missing = [f for f in MANIFEST_FIELDS if f not in m] if m.get("complete") else []
    if missing:
        return f"it lacks {', '.join(missing)}"
    if m.get("complete") and not (isinstance(m["namespaces"], dict) and isinstance(m["matrices"], dict)
                                  and isinstance(m["config"], dict)):
        return "its namespaces, matrices or config are not objects"
    return None


def read_manifest(store: Store, key: str, model: str) -> dict:
    """The manifest of a complete, current load, as stored (no document read), or NotLoaded
    (StoreDamaged where it disagrees with itself) saying which command fixes it."""
    fix = f"run `puffergpt load --model {model} {store.cli_args()}`"
    repair = f"run `puffergpt load --model {model} {store.cli_args()} --repair`"
    try:
        m = store.get_meta(f"manifest:{key}")
    except ValueError as e:  # a store that keeps the manifest as text, and the text is not JSON
        raise NotLoaded(f"the manifest of model {model!r} is broken (not JSON: {e}): {repair} to rewrite it") from None
    if m is None:
        raise NotLoaded(f"model {model!r} is not loaded into the {store.name} store: {fix}")
    if (why := broken(m)) is not None:
        raise NotLoaded(f"the manifest of model {model!r} is broken ({why}): {repair} to rewrite it")
    if m.get("version") != ENCODING_VERSION:
        raise NotLoaded(
            f"model {model!r} was stored with encoding version {m.get('version')}, "
            f"this puffergpt reads version {ENCODING_VERSION}: {fix} to rewrite it"
        )
    if not m.get("complete"):
        raise NotLoaded(f"the load of model {model!r} did not finish: {fix} to complete it")
    if (why := inconsistent(m, key)) is not None:
        raise StoreDamaged(damage_message(model, store, {"manifest": why}))
    return m


def manifest(store: Store, key: str, model: str, verify: bool = False, progress: bool = False) -> dict:
    """The manifest of a complete, current load, or NotLoaded saying which command fixes
    it: a store error never reaches the user raw. ``verify``: StoreDamaged unless the
    documents match it (``check_on_open``: read in full unless unchanged since verified)."""
    fix = f"run `puffergpt load --model {model} {store.cli_args()}`"
    m = read_manifest(store, key, model)
    try:
        for ns, n in m["namespaces"].items():  # before any is opened: a load writes a missing one
            if ns not in store.namespaces(ns):
                raise NotLoaded(f"namespace {ns} is missing (dropped; the manifest says it holds {n} documents): "
                                f"{fix} to write it again")
        if verify:
            check_on_open(store, key, model, m, progress)
        for ns, n in m["namespaces"].items():
            got = store.count(ns)
            if got != n:
                raise NotLoaded(
                    f"namespace {ns} holds {got} documents, the manifest says {n}: {fix} to repair it, "
                    "or `puffergpt verify` to see which matrix"
                )
    except (NotLoaded, StoreDamaged):
        raise
    except StoreError as e:  # a table or shard gone under us, mid-check
        raise NotLoaded(
            f"the stored model {model!r} could not be read ({e}): {fix} to repair it, "
            f"or `puffergpt verify` to see what is damaged"
        ) from None
    return m


def open_engine(store: Store, model: str, key: str | None = None, verify: bool = False, progress: bool = False,
                **options) -> Engine:
    """The model's engine on a store, over its manifest read (and with ``verify``, checked:
    ``manifest``) here, so the engine is handed one it can trust. ``options`` go to ``Engine``
    (``key_metric``, ``scheduler``)."""
    key = key or model_key(model)
    m = manifest(store, key, model, verify=verify, progress=progress)
    if (why := index_damage(store, m)) is not None:  # the approximate index's files, digested at every start
        options.setdefault("index_damage", index_message(model, store, why))
    return Engine(store, m, model, key, **options)


def stored_bytes(m: dict) -> int:
    """Bytes of the vectors a manifest's namespaces hold (float32)."""
    enc = Encoding(m["metric"])
    return sum(n * enc.dim(int(ns.rsplit(".", 1)[1])) * 4 for ns, n in m["namespaces"].items())
