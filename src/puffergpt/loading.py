"""Writing a checkpoint into a store as documents, and the manifest that vouches for it.

Layout, for a model stored under key K with width C (see documents.py for the vectors):

- namespace ``K.C`` holds every matrix whose input has C numbers: each layer's
  ``attn.c_attn``, ``attn.c_proj`` and ``mlp.c_fc``, the token embeddings ``wte``
  (which are also the next-token matrix), the position embeddings ``wpe``, and the
  layer-norm parameters (``h.0.ln_1`` row 0 is the gain, row 1 the bias);
- namespace ``K.4C`` holds each layer's ``mlp.c_proj``, whose input has 4C.

A document's id is its matrix and row, ``h.3.mlp.c_fc.17`` (``doc_id``, the one
place ids are spelt); its attributes are ``matrix`` and ``row``, so a filter on
``matrix`` picks one whole matrix, and ``norm2``, the squared length of the weight
row it carries (so that cosine similarity between token vectors is one search too).

``load`` is idempotent and resumable: it upserts matrix by matrix, records the
matrices done, and ends by reading every document back against its checksum,
rewriting any matrix that does not match. Only then does it write the manifest. The
check covers everything a search returns and the engine uses: ids, vectors and
attributes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from puffergpt import untrained
from puffergpt.checkpoints import Checkpoint, GPT2Config
from puffergpt.documents import ENCODING_VERSION, Encoding
from puffergpt.stores.base import Hits, Query, Store, StoreError

SCHEMA = {"matrix": "str", "row": "int", "norm2": "float"}
BATCH = 2048


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


def namespace(key: str, n_in: int) -> str:
    return f"{key}.{n_in}"


def matrices(c: GPT2Config) -> Iterator[tuple[str, int]]:
    """(matrix name, input width) of every matrix stored as documents."""
    for i in range(c.n_layer):
        yield f"h.{i}.attn.c_attn", c.n_embd
        yield f"h.{i}.attn.c_proj", c.n_embd
        yield f"h.{i}.mlp.c_fc", c.n_embd
        yield f"h.{i}.mlp.c_proj", 4 * c.n_embd
    yield "wte", c.n_embd
    yield "wpe", c.n_embd


def norms(c: GPT2Config) -> list[str]:
    return [f"h.{i}.{n}" for i in range(c.n_layer) for n in ("ln_1", "ln_2")] + ["ln_f"]


def matrix_documents(ckpt: Checkpoint, name: str, enc: Encoding) -> tuple[np.ndarray, float]:
    """The documents of one matrix, one per output row: (rows, dim), and their length M."""
    p = ckpt.params
    if name in ("wte", "wpe"):
        return enc.documents(p[f"{name}.weight"])  # embeddings: rows are the vectors, bias 0
    return enc.documents(p[f"{name}.weight"].T, p[f"{name}.bias"])  # Conv1D (in, out) -> rows (out, in)


def norm_documents(ckpt: Checkpoint, name: str, dim: int) -> np.ndarray:
    """Layer-norm gain (row 0) and bias (row 1) as raw vectors, zero-padded to the namespace's length."""
    v = np.stack([ckpt.params[f"{name}.weight"], ckpt.params[f"{name}.bias"]])
    return np.pad(v, ((0, 0), (0, dim - v.shape[1])))


def checksum(docs: np.ndarray) -> str:
    # + 0 turns -0.0 into 0.0: stores may keep either, and they are the same number.
    return hashlib.sha256(np.ascontiguousarray(np.asarray(docs, np.float32) + np.float32(0)).tobytes()).hexdigest()


def doc_id(name: str, row: int) -> str:
    """The id of a matrix's row: ``wte.50256``, ``h.3.ln_1.0``."""
    return f"{name}.{int(row)}"


def ids(name: str, rows: int) -> list[str]:
    return [doc_id(name, r) for r in range(rows)]


def row_norm2(docs: np.ndarray, n_in: int) -> np.ndarray:
    """|w|^2 of each document's weight row (the first n_in numbers): (rows, dim) -> (rows,)"""
    return (np.asarray(docs[:, :n_in], np.float64) ** 2).sum(axis=1)


def n_in_of(ns: str) -> int:
    return int(ns.rsplit(".", 1)[1])


def plan(ckpt: Checkpoint, enc: Encoding, key: str) -> Iterator[tuple[str, str, Callable[[], tuple[np.ndarray, float]], list[str]]]:
    """(namespace, matrix, documents(), ids) for everything a model stores, in load order."""
    c = ckpt.config
    for name, n_in in matrices(c):
        rows = c.n_vocab if name == "wte" else c.n_ctx if name == "wpe" else ckpt.params[f"{name}.bias"].shape[0]
        yield namespace(key, n_in), name, (lambda name=name: matrix_documents(ckpt, name, enc)), ids(name, rows)
    dim = enc.dim(c.n_embd)
    for name in norms(c):
        yield namespace(key, c.n_embd), name, (lambda name=name: (norm_documents(ckpt, name, dim), 0.0)), ids(name, 2)


def _write(store: Store, ns: str, name: str, docs: np.ndarray, doc_ids: list[str], bar, interrupt) -> None:
    norm2 = row_norm2(docs, n_in_of(ns))
    for s in range(0, len(doc_ids), BATCH):
        e = min(s + BATCH, len(doc_ids))
        store.upsert(ns, doc_ids[s:e], docs[s:e], {"matrix": [name] * (e - s), "row": np.arange(s, e), "norm2": norm2[s:e]})
        bar.update(e - s)
        if interrupt:
            interrupt()


def load(store: Store, ckpt: Checkpoint, key: str, metric: str | None = None, progress: bool = True,
         repair: bool = False, interrupt: Callable[[], None] | None = None) -> dict:
    """Write ``ckpt`` into ``store`` under ``key``; returns the manifest. A complete load is
    left as it is unless ``repair``, which reads every document back and rewrites what
    differs. ``interrupt`` is called after each batch (tests use it to stop a load half-way)."""
    from tqdm import tqdm

    metric = metric or store.metrics[0]
    if metric not in store.metrics:
        raise StoreError(f"the {store.name} store has no exact {metric!r} search; it has {', '.join(store.metrics)}")
    enc = Encoding(metric)
    c = ckpt.config
    source = {k: v for k, v in ckpt.source.items() if k != "name"}  # not how the user spelt it
    ident = {"checkpoint": source, "config": asdict(c), "metric": metric, "version": ENCODING_VERSION,
             "weights_sha256": weights_digest(ckpt)}
    old = _stored_manifest(store, key)
    if not repair and old and old.get("complete") and all(old.get(k) == v for k, v in ident.items()) and _counts_ok(store, old):
        if "untrained" not in old:  # loaded by an older puffergpt: record the untrained rows now
            old["untrained"] = untrained.manifest_field(ckpt.params["wte.weight"])
            store.put_meta(f"manifest:{key}", old)
        return old  # already loaded: nothing to do
    progress_key = f"loading:{key}"
    state = store.get_meta(progress_key)
    if not state or state.get("ident") != ident:  # another checkpoint or encoding: start over
        for ns in store.namespaces(f"{key}."):
            store.drop_namespace(ns)
        state = {"ident": ident, "done": {}}
        store.put_meta(progress_key, state)
    store.put_meta(f"manifest:{key}", {"complete": False, **ident})  # the engine refuses it until the end
    for n_in in sorted({n for _, n in matrices(c)}):
        store.create_namespace(namespace(key, n_in), enc.dim(n_in), SCHEMA, metric)

    items = list(plan(ckpt, enc, key))
    total = sum(len(i) for _, _, _, i in items)
    done_rows = sum(len(i) for _, name, _, i in items if name in state["done"])
    mats = {}
    with tqdm(total=total, initial=done_rows, unit="doc", desc=f"load {key}", disable=not progress) as bar:
        for ns, name, make, doc_ids in items:
            docs, M = make()
            mats[name] = {"namespace": ns, "rows": len(doc_ids), "M": M, "sha256": checksum(docs)}
            if state["done"].get(name) != mats[name]["sha256"]:
                _write(store, ns, name, docs, doc_ids, bar, interrupt)
                state["done"][name] = mats[name]["sha256"]
                store.put_meta(progress_key, state)
    # Read everything back; rewrite what does not match (a resumed or damaged load).
    for ns, name, make, doc_ids in items:
        if verify_matrix(store, ns, name, doc_ids, mats[name]["sha256"], metric) is not None:
            docs, _ = make()
            store.delete(ns, (("matrix", "=", name),))
            _write(store, ns, name, docs, doc_ids, tqdm(disable=True), None)
            problem = verify_matrix(store, ns, name, doc_ids, mats[name]["sha256"], metric)
            if problem:
                raise StoreError(f"{name}: {problem} even after rewriting it; the store is not keeping what it is given")
    counts = {}
    for ns, _, _, doc_ids in items:
        counts[ns] = counts.get(ns, 0) + len(doc_ids)
    manifest = {"complete": True, "key": key, **ident, "documents": total,
                "namespaces": counts, "matrices": mats, "untrained": untrained.manifest_field(ckpt.params["wte.weight"])}
    store.put_meta(f"manifest:{key}", manifest)
    return manifest


def weights_digest(ckpt: Checkpoint) -> str:
    """A digest of the float32 weights, so a reload notices a changed checkpoint."""
    h = hashlib.sha256()
    for k in sorted(ckpt.params):
        h.update(k.encode())
        h.update(np.ascontiguousarray(ckpt.params[k]).tobytes())
    return h.hexdigest()


def verify_matrix(store: Store, ns: str, name: str, doc_ids: list[str], sha256: str, metric: str) -> str | None:
    """None if the stored documents of a matrix match their checksum, else what is wrong."""
    if ns not in store.namespaces(ns):
        return f"its namespace {ns} is missing (dropped)"
    n = store.count(ns, (("matrix", "=", name),))
    if n != len(doc_ids):
        return f"{n} documents stored, {len(doc_ids)} expected"
    try:
        docs = np.concatenate([store.fetch(ns, doc_ids[s:s + BATCH]) for s in range(0, len(doc_ids), BATCH)])
    except StoreError as e:
        return str(e)
    if checksum(docs) != sha256:
        return "its documents do not match the checksum in the manifest (altered)"
    return verify_attributes(store, ns, name, doc_ids, row_norm2(docs, n_in_of(ns)), metric, docs.shape[1])


def whole_matrix(store: Store, name: str, rows: int) -> list[tuple]:
    """The filters that, together, match every row of a matrix: one, or row ranges where the
    store returns at most ``max_top_k`` hits a query (turbopuffer)."""
    cap = getattr(store, "max_top_k", None) or rows
    if cap >= rows:
        return [(("matrix", "=", name),)]
    return [(("matrix", "=", name), ("row", ">=", a), ("row", "<", min(a + cap, rows))) for a in range(0, rows, cap)]


def verify_attributes(store: Store, ns: str, name: str, doc_ids: list[str], norm2: np.ndarray, metric: str,
                      dim: int) -> str | None:
    """None if every document of the matrix carries its own row number and |w|^2, else what
    is wrong. Exact searches return them all, as the engine's searches would."""
    probe = np.zeros(dim, np.float32)
    probe[0] = 1.0  # any vector will do (not zero: cosine would have no direction); the distances are unused
    queries = [Query(probe, f) for f in whole_matrix(store, name, len(doc_ids))]
    n = store.max_queries
    hits = Hits.concat([store.search(ns, queries[s:s + n], metric, include=("id", "row", "norm2"))
                        for s in range(0, len(queries), n)], ("id", "row", "norm2"))
    got = dict(zip(hits.attrs["id"].tolist(), zip(hits.attrs["row"].tolist(), hits.attrs["norm2"].tolist())))
    for r, i in enumerate(doc_ids):
        if i not in got:
            return f"document {i} is missing from the search results"
        row, n2 = got[i]
        if int(row) != r:
            return f"document {i} says it is row {row} (an altered attribute)"
        if not np.isclose(n2, norm2[r], rtol=1e-4, atol=1e-6):
            return f"document {i} carries norm2 {n2:.6g}, its row's is {norm2[r]:.6g} (an altered attribute)"
    return None


def _counts_ok(store: Store, manifest: dict) -> bool:
    try:
        return all(store.count(ns) == n for ns, n in manifest["namespaces"].items())
    except StoreError:
        return False


MANIFEST_FIELDS = ("complete", "version", "config", "metric", "namespaces", "matrices", "documents")


def _stored_manifest(store: Store, key: str) -> dict | None:
    """The manifest as stored: None if there is none, or if it is broken (text that is not
    JSON, not a dict, fields missing), which a load then rewrites."""
    try:
        m = store.get_meta(f"manifest:{key}")
    except ValueError:  # JSON that does not parse, from a store that keeps text
        return None
    return m if isinstance(m, dict) else None


def _broken(m) -> str | None:
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


def manifest(store: Store, key: str, model: str) -> dict:
    """The manifest of a complete, current load, or NotLoaded saying which command fixes
    it: a store error never reaches the user raw."""
    fix = f"run `puffergpt load --model {model} {store.cli_args()}`"
    repair = f"run `puffergpt load --model {model} {store.cli_args()} --repair`"
    try:
        m = store.get_meta(f"manifest:{key}")
    except ValueError as e:  # a store that keeps the manifest as text, and the text is not JSON
        raise NotLoaded(f"the manifest of model {model!r} is broken (not JSON: {e}): {repair} to rewrite it") from None
    if m is None:
        raise NotLoaded(f"model {model!r} is not loaded into the {store.name} store: {fix}")
    if (why := _broken(m)) is not None:
        raise NotLoaded(f"the manifest of model {model!r} is broken ({why}): {repair} to rewrite it")
    if m.get("version") != ENCODING_VERSION:
        raise NotLoaded(f"model {model!r} was stored with encoding version {m.get('version')}, this puffergpt reads version {ENCODING_VERSION}: {fix} to rewrite it")
    if not m.get("complete"):
        raise NotLoaded(f"the load of model {model!r} did not finish: {fix} to complete it")
    try:
        for ns, n in m["namespaces"].items():
            if ns not in store.namespaces(ns):
                raise NotLoaded(f"namespace {ns} is missing (dropped; the manifest says it holds {n} documents): "
                                f"{fix} to write it again")
            got = store.count(ns)
            if got != n:
                raise NotLoaded(f"namespace {ns} holds {got} documents, the manifest says {n}: {fix} to repair it, or `puffergpt verify` to see which matrix")
    except NotLoaded:
        raise
    except StoreError as e:  # a table or shard gone under us, mid-check
        raise NotLoaded(f"the stored model {model!r} could not be read ({e}): {fix} to repair it, "
                        f"or `puffergpt verify` to see what is damaged") from None
    return m


def stored_bytes(m: dict) -> int:
    """Bytes of the vectors a manifest's namespaces hold (float32)."""
    enc = Encoding(m["metric"])
    return sum(n * enc.dim(int(ns.rsplit(".", 1)[1])) * 4 for ns, n in m["namespaces"].items())


def verify(store: Store, m: dict) -> dict[str, str]:
    """Every matrix that does not match the manifest, with what is wrong."""
    bad = {}
    for name, info in m["matrices"].items():
        problem = verify_matrix(store, info["namespace"], name, ids(name, info["rows"]), info["sha256"], m["metric"])
        if problem:
            bad[name] = problem
    return bad
