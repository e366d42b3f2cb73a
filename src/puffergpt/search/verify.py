"""Reading a loaded model back against its manifest: every document's vector against its
matrix's checksum, and the attributes a search returns (ids, row numbers, |w|²).

A store whose files this process can read (the embedded one: ``Store.stamp``) is read
back through the database when it is opened to serve (``check_on_open``), unless its
files hash, read in full at every start (mtimes are not trusted: bit rot leaves them
alone), to the digests last found to match the manifest (the stamp under
``verified:KEY``). The read-back runs where the database may abort
(``Store.read_isolated``): Qdrant aborts the process on some damaged files.

The approximate index over the token vectors (``load --output-index``) is checked the same way:
its files' digests are recorded in the manifest when it is built, and read in full by ``verify``
and when an engine opens (``index_damage``); where the store can't digest them (a server's
database), one approximate search must answer. Damage is refused naming
``puffergpt load --output-index --repair`` (``index_message``), never with a traceback.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator

import numpy as np

from puffergpt.model.checkpoints import GPT2Config
from puffergpt.search.documents import PARTITION, doc_id, ids, matrices, n_in_of, namespace, norms, whole_matrix
from puffergpt.stores.base import Query, ReaderDied, Store, StoreError

BATCH = 2048  # documents a request writes or fetches
VERIFIED = "verified:"  # + key: the stamp of the files last found to match the manifest


class StoreDamaged(StoreError):
    """What is stored does not match the manifest: the message names what, and the command
    that rewrites it (the same message from `puffergpt verify` and from serve/generate)."""


def checksum(docs: np.ndarray) -> str:
    # + 0 turns -0.0 into 0.0: stores may keep either, and they are the same number.
    return hashlib.sha256(np.ascontiguousarray(np.asarray(docs, np.float32) + np.float32(0)).tobytes()).hexdigest()


def row_norm2(docs: np.ndarray, n_in: int) -> np.ndarray:
    """|w|^2 of each document's weight row (the first n_in numbers): (rows, dim) -> (rows,)"""
    return (np.asarray(docs[:, :n_in], np.float64) ** 2).sum(axis=1)


def verify_matrix(store: Store, ns: str, name: str, doc_ids: list[str], sha256: str, metric: str) -> str | None:
    """None if the stored documents of a matrix match their checksum, else what is wrong."""
    try:
        return _read_matrix(store, ns, name, doc_ids, sha256, metric)
    except StoreError as e:
        return str(e)


def _read_matrix(store: Store, ns: str, name: str, doc_ids: list[str], sha256: str, metric: str) -> str | None:
    """verify_matrix, where the store failing to read raises (its files are damaged)."""
    if ns not in store.namespaces(ns):
        return f"its namespace {ns} is missing (dropped)"
    n = store.count(ns, (("matrix", "=", name),))
    if n != len(doc_ids):
        return f"{n} documents stored, {len(doc_ids)} expected"
    docs = np.concatenate([store.fetch(ns, doc_ids[s:s + BATCH]) for s in range(0, len(doc_ids), BATCH)])
    if checksum(docs) != sha256:
        return "its documents do not match the checksum in the manifest (altered)"
    return verify_attributes(store, ns, name, doc_ids, row_norm2(docs, n_in_of(ns)), metric, docs.shape[1])


def verify_attributes(store: Store, ns: str, name: str, doc_ids: list[str], norm2: np.ndarray, metric: str,
                      dim: int) -> str | None:
    """None if every document of the matrix carries its own row number and |w|^2, else what
    is wrong. Exact searches return them all, as the engine's searches would."""
    probe = np.zeros(dim, np.float32)
    probe[0] = 1.0  # any vector will do (not zero: cosine would have no direction); the distances are unused
    queries = [Query(probe, f) for f in whole_matrix(name, len(doc_ids), store.max_top_k)]
    hits = store.search(ns, queries, metric, include=("id", "row", "norm2"))  # split at max_queries by the store
    a = hits.attrs
    at = {i: k for k, i in enumerate(a["id"].tolist())}
    k = np.array([at.get(i, -1) for i in doc_ids], np.int64)  # each document's hit (-1: none)
    if not at:
        return f"document {doc_ids[0]} is missing from the search results"
    row, n2 = a["row"][k].astype(np.int64), a["norm2"][k].astype(np.float64)
    bad = (k < 0) | (row != np.arange(len(doc_ids))) | ~np.isclose(n2, norm2, rtol=1e-4, atol=1e-6)
    if not bad.any():
        return None
    r = int(np.argmax(bad))  # the first, in row order
    i = doc_ids[r]
    if k[r] < 0:
        return f"document {i} is missing from the search results"
    if row[r] != r:
        return f"document {i} says it is row {row[r]} (an altered attribute)"
    return f"document {i} carries norm2 {n2[r]:.6g}, its row's is {norm2[r]:.6g} (an altered attribute)"


def _rows(c: GPT2Config, name: str) -> int:
    """Documents of a stored matrix: one per output row (Conv1D bias length), 2 per layer norm."""
    if name in ("wte", "wpe"):
        return c.n_vocab if name == "wte" else c.n_ctx
    for end, rows in ((".c_attn", 3 * c.n_embd), (".c_fc", 4 * c.n_embd), (".c_proj", c.n_embd)):
        if name.endswith(end):
            return rows
    return 2


def inconsistent(m: dict, key: str) -> str | None:
    """What in a complete manifest disagrees with itself (its config, its matrices and its
    counts), or None. Cheap: no document is read."""
    try:
        c = GPT2Config(**m["config"])
        want = {name: [namespace(key, n_in), _rows(c, name)] for name, n_in in matrices(c)}
        want |= {name: [namespace(key, c.n_embd), 2] for name in norms(c)}
    except (TypeError, ValueError) as e:
        return f"its config is not a GPT-2 configuration ({e})"
    got = {n: [i.get("namespace"), i.get("rows")] if isinstance(i, dict) else None for n, i in m["matrices"].items()}
    if set(got) != set(want):
        gone, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        return f"its matrices are not those of its config (missing {gone[:3]}, extra {extra[:3]})"
    for name, w in want.items():
        if got[name] != w or not isinstance(m["matrices"][name].get("sha256"), str):
            return f"it lists matrix {name} as {got[name]}, its config gives {w} (and a sha256)"
    counts = Counter()
    for ns, rows in want.values():
        counts[ns] += rows
    if m["namespaces"] != dict(counts):
        return f"its namespace counts {m['namespaces']} are not its matrices' rows {dict(counts)}"
    if m["documents"] != counts.total():
        return f"it says {m['documents']} documents, its matrices hold {counts.total():,}"
    return None


def _verify_lines(store: Store, payload: dict) -> Iterator[dict]:
    """Run by ``read_isolated`` (where the database may abort): for each namespace an "open"
    line, then its count; for each matrix a "start" line, then what is wrong with it."""
    m = payload["manifest"]
    by_ns: dict[str, list[str]] = {}
    for name in payload["names"]:
        by_ns.setdefault(m["matrices"][name]["namespace"], []).append(name)
    for ns, names in by_ns.items():
        yield {"open": ns}
        try:
            yield {"ns": ns, "count": store.count(ns) if ns in store.namespaces(ns) else None}
        except StoreError as e:  # its shard can't be opened: one problem for all its matrices
            yield {"ns": ns, "count": None, "problem": str(e)}
            yield from ({"name": name, "problem": None} for name in names)
            continue
        for name in names:
            yield {"start": name}
            info = m["matrices"][name]
            try:
                yield {
                    "name": name,
                    "problem": _read_matrix(store, ns, name, ids(name, info["rows"]), info["sha256"], m["metric"]),
                }
            except StoreError as e:  # the database can't read it: rewritten with its namespace
                yield {"name": name, "problem": str(e), "unreadable": ns}


def check(store: Store, m: dict, key: str | None = None, progress: bool = False) -> tuple[dict[str, str], set[str]]:
    """Read every document back against the manifest: (what is wrong, by matrix or
    namespace; the namespaces whose files the store's reader died on). Never raises on
    damage: a reader that dies is damage too, and the rest is read by a new one."""
    from tqdm import tqdm

    key = key or m.get("key") or next(iter(m["namespaces"])).rsplit(".", 1)[0]
    if (why := inconsistent(m, key)) is not None:
        return {"manifest": why}, set()
    bad: dict[str, str] = {}
    unreadable: set[str] = set()
    counts: dict[str, str] = {}  # namespace -> its count, where it is not the manifest's
    todo = list(m["matrices"])
    with tqdm(total=m["documents"], unit="doc", desc=f"verify {key}", disable=not progress) as bar:
        while todo:
            opening = current = None
            try:
                for msg in store.read_isolated("puffergpt.search.verify:_verify_lines", {"manifest": m, "names": todo},
                                               list(m["namespaces"])):
                    if "open" in msg:
                        opening = msg["open"]
                    elif "ns" in msg:
                        if msg.get("problem"):
                            unreadable.add(msg["ns"])
                        _count_problem(bad, counts, m, msg)
                    elif "start" in msg:
                        current = msg["start"]
                    elif "name" in msg:
                        unreadable.add(msg.get("unreadable"))
                        todo.remove(msg["name"])
                        bar.update(m["matrices"][msg["name"]]["rows"])
                        if msg["problem"]:
                            bad[msg["name"]] = msg["problem"]
                todo = []
            except ReaderDied as e:  # the namespace it was reading is left out of the next reader's
                unreadable.add(opening)
                where = f" (reading {current})" if current else " (opening it)"
                bad[f"namespace {opening}" if opening else "store"] = \
                    f"its files are damaged{where}: {e}" if opening else f"it could not be read: {e}"
                for name in [n for n in todo if opening is None or m["matrices"][n]["namespace"] == opening]:
                    todo.remove(name)
                    bar.update(m["matrices"][name]["rows"])
    unreadable.discard(None)
    for ns, why in counts.items():  # a count no matrix accounts for: documents that belong to none
        if not any(m["matrices"][n]["namespace"] == ns for n in bad if n in m["matrices"]):
            bad[f"namespace {ns}"] = why
    return bad, unreadable


def _count_problem(bad: dict, counts: dict, m: dict, msg: dict) -> None:
    ns, n, want = msg["ns"], msg["count"], m["namespaces"][msg["ns"]]
    if msg.get("problem"):
        bad[f"namespace {ns}"] = msg["problem"]
    elif n is not None and n != want:
        counts[ns] = f"it holds {n:,} documents, the manifest says {want:,}"


def _digest(m: dict) -> str:
    return hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()


def unchanged_since_verified(store: Store, key: str, m: dict) -> bool:
    """Whether the store's files and the manifest are those last found to match."""
    try:
        known = store.get_meta(VERIFIED + key)
    except ValueError:
        return False
    if not isinstance(known, dict) or known.get("manifest") != _digest(m) or not isinstance(known.get("files"), dict):
        return False
    return store.stamp(list(m["namespaces"])) == known["files"]


def record_verified(store: Store, key: str, m: dict) -> None:
    """Remember that the store's files match the manifest ``m`` (stores that can stamp them)."""
    files = store.stamp(list(m["namespaces"]))
    if files is not None:
        store.put_meta(VERIFIED + key, {"manifest": _digest(m), "files": files})


def damage_message(model: str, store: Store, bad: dict[str, str], shown: int = 12) -> str:
    """What `puffergpt verify` says of a damaged store, and what serve/generate refuse with."""
    lines = [f"  {name}: {why}" for name, why in list(bad.items())[:shown]]
    if len(bad) > shown:
        lines.append(f"  ... and {len(bad) - shown} more")
    return (f"the stored model {model!r} does not match its manifest ({len(bad)} problems):\n" + "\n".join(lines) +
            f"\nrun `puffergpt load --model {model} {store.cli_args()} --repair` to rewrite it")


def check_on_open(store: Store, key: str, model: str, m: dict, progress: bool = False, force: bool = False) -> None:
    """StoreDamaged unless the stored documents match the manifest ``m``. They are read in
    full (``force``: always) unless the store's files are those last verified; a store that
    can't stamp its files (a server's database) is read in full only when ``force``d."""
    if not force and (store.stamp([]) is None or unchanged_since_verified(store, key, m)):
        return
    bad, _ = check(store, m, key, progress)
    if bad:
        raise StoreDamaged(damage_message(model, store, bad))
    record_verified(store, key, m)


def counts_ok(store: Store, manifest: dict) -> bool:
    try:
        return all(store.count(ns) == n for ns, n in manifest["namespaces"].items())
    except StoreError:
        return False


def verify(store: Store, m: dict, progress: bool = False) -> dict[str, str]:
    """Every matrix (or namespace, or the manifest) that does not match the manifest, with what is wrong."""
    return check(store, m, progress=progress)[0]


# --- the approximate index over the token vectors ---

def index_damage(store: Store, m: dict) -> str | None:
    """What is wrong with the approximate index the manifest ``m`` records, or None (none recorded,
    or it matches): its files against their digests where the store can read them (in full: bit
    rot leaves the mtime alone), else one approximate search that must answer."""
    info = m.get("indexes", {}).get("wte")
    if info is None:
        return None
    ns, on, metric = m["matrices"]["wte"]["namespace"], (PARTITION, "wte"), m["metric"]
    try:
        if not store.has_index(ns, on, metric):
            return "the manifest records it, the store does not hold it"
        files = store.index_stamp(ns, on, metric)
        want = info.get("files")
        if files is not None and isinstance(want, dict):
            return _files_differ(files, want)
        q = store.fetch(ns, [doc_id("wte", 0)])[0]  # a token's own vector: the index must find one hit
        hits = store.search_approximate(ns, on, [Query(q, top_k=1)], metric, ("row",), int(info.get("ef", 128)))
        return None if len(hits.query) == 1 else f"a search through it returned {len(hits.query)} hits, not 1"
    except StoreError as e:
        return str(e)


def _files_differ(got: dict, want: dict) -> str | None:
    for name in sorted(set(got) | set(want)):
        if name not in got:
            return f"its file {name} is missing"
        if name not in want:
            return f"its file {name} was not there when it was built"
        if got[name][0] != want[name][0]:
            return (f"its file {name} holds {got[name][0]:,} bytes, {want[name][0]:,} when it was built "
                    "(truncated or rewritten)")
        if got[name][1] != want[name][1]:
            return f"its file {name} does not match its digest (altered)"
    return None


def index_message(model: str, store: Store, why: str) -> str:
    """What `puffergpt verify` says of a damaged index, and what an approximate search is refused with."""
    return (f"the approximate index of model {model!r} over its token vectors is damaged ({why}): run "
            f"`puffergpt load --model {model} {store.cli_args()} --output-index --repair` to build it again")
