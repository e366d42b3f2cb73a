"""Writing a checkpoint into a store as documents, and the manifest that vouches for it.

Where each row goes and what it is called (namespaces, ids, attributes) is the document
scheme in ``documents.py``; what each vector holds, the encodings there too.

``load`` is idempotent and resumable: it upserts matrix by matrix, records the
matrices done, and ends by reading every document back against its checksum,
rewriting any matrix that does not match. Only then does it write the manifest. The
check covers everything a search returns and the engine uses: ids, vectors and
attributes.

A store whose files this process can read (the embedded one: ``Store.stamp``) is read
back through the database when it is opened to serve (``check_on_open``), unless its
files hash, read in full at every start (mtimes are not trusted: bit rot leaves them
alone), to the digests last found to match the manifest (the stamp under
``verified:KEY``). The read-back runs where the database may abort
(``Store.read_isolated``): Qdrant aborts the process on some damaged files.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import numpy as np

from puffergpt.model import untrained
from puffergpt.model.checkpoints import Checkpoint, GPT2Config
from puffergpt.search.documents import (
    ENCODING_VERSION,
    PARTITION,
    SCHEMA,
    Encoding,
    doc_id,
    ids,
    matrices,
    n_in_of,
    namespace,
    norms,
    whole_matrix,
)
from puffergpt.search.engine import INDEX_VERSION, Engine
from puffergpt.stores.base import Query, ReaderDied, Store, StoreError

BATCH = 2048
VERIFIED = "verified:"  # + key: the stamp of the files last found to match the manifest


class NotLoaded(StoreError):
    """The store does not hold a complete, current copy of the model."""


class StoreDamaged(StoreError):
    """What is stored does not match the manifest: the message names what, and the command
    that rewrites it (the same message from `puffergpt verify` and from serve/generate)."""


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


def row_norm2(docs: np.ndarray, n_in: int) -> np.ndarray:
    """|w|^2 of each document's weight row (the first n_in numbers): (rows, dim) -> (rows,)"""
    return (np.asarray(docs[:, :n_in], np.float64) ** 2).sum(axis=1)


def plan(
    ckpt: Checkpoint, enc: Encoding, key: str
) -> Iterator[tuple[str, str, Callable[[], tuple[np.ndarray, float]], list[str]]]:
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
        store.upsert(
            ns, doc_ids[s:e], docs[s:e], {"matrix": [name] * (e - s), "row": np.arange(s, e), "norm2": norm2[s:e]}
        )
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
    if old and old.get("complete") and all(old.get(k) == v for k, v in ident.items()) and _broken(old) is None:
        keep, unreadable = _intact(store, key, old, repair, progress)
        if keep:
            if "untrained" not in old:  # loaded by an older puffergpt: record the untrained rows now
                old["untrained"] = untrained.manifest_field(ckpt.params["wte.weight"])
                store.put_meta(f"manifest:{key}", old)
                record_verified(store, key, old)  # the documents were just found to match
            return old  # already loaded: nothing to do
        for ns in unreadable:  # files the store's reader dies on: written again from scratch
            store.drop_namespace(ns)
    progress_key = f"loading:{key}"
    state = store.get_meta(progress_key)
    if not state or state.get("ident") != ident:  # another checkpoint or encoding: start over
        for ns in store.namespaces(f"{key}."):
            store.drop_namespace(ns)
        state = {"ident": ident, "done": {}}
        store.put_meta(progress_key, state)
    store.put_meta(f"manifest:{key}", {"complete": False, **ident})  # the engine refuses it until the end
    for n_in in sorted({n for _, n in matrices(c)}):  # every search of the weights names its matrix
        store.create_namespace(namespace(key, n_in), enc.dim(n_in), SCHEMA, metric, partition=PARTITION)

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
                raise StoreError(
                    f"{name}: {problem} even after rewriting it; the store is not keeping what it is given"
                )
    counts = {}
    for ns, _, _, doc_ids in items:
        counts[ns] = counts.get(ns, 0) + len(doc_ids)
    manifest = {
        "complete": True,
        "key": key,
        **ident,
        "documents": total,
        "namespaces": counts,
        "matrices": mats,
        "untrained": untrained.manifest_field(ckpt.params["wte.weight"]),
    }
    store.put_meta(f"manifest:{key}", manifest)
    # Every document was just read back against it. Qdrant compacts a written shard's journals
    # when it next opens it (same documents, other bytes): reopened first, so that the stamp
    # is that of the files the next start finds.
    names = list(manifest["namespaces"])
    if store.stamp([]) is not None:
        store.release(names)
        for ns in names:
            store.count(ns)
        store.release(names)
    record_verified(store, key, manifest)
    return manifest


# HNSW's links a node, its build list, its search list. m 24 over 16: pgvector's graph found the demo
# model's newline token (its longest vector) at ef 400 with 24, missed it 20 times in 391 with 16.
OUTPUT_INDEX = {"m": 24, "ef_construction": 100, "ef": 400}


def build_output_index(store: Store, key: str, model: str, params: dict | None = None,
                       progress: bool = True, rebuild: bool = False) -> dict:
    """Build the approximate index over the token vectors (wte) that ``--output-search
    approximate`` searches, check it against the exact search and record both in the manifest
    (``indexes``, with INDEX_VERSION). Kept as it is where one alike is built, unless ``rebuild``.
    The weights are not touched: a store whose files were verified stays verified. -> the manifest"""
    from tqdm import tqdm

    params = {**OUTPUT_INDEX, **(params or {})}
    m = read_manifest(store, key, model)
    ns = m["matrices"]["wte"]["namespace"]
    old = m.get("indexes", {}).get("wte")
    if (not rebuild and old and old.get("version") == INDEX_VERSION and all(old.get(p) == params[p] for p in params)
            and store.has_index(ns, (PARTITION, "wte"), m["metric"])):
        return m  # built already, alike
    verified = store.stamp([]) is not None and _unchanged_since_verified(store, key, m)

    def went_in(done: int, total: int) -> None:
        # The store counts the vectors that go into the graph: identical rows go in once (the demo's
        # untrained tokens share one vector), so its total may be fewer than the rows.
        if bar.total != total:
            bar.total = total
            bar.set_description(f"index {key} wte ({total:,} distinct vectors of {rows:,} rows)")
        bar.update(done - bar.n)
        if done == total:
            bar.set_postfix_str("building the graph")

    rows = m["matrices"]["wte"]["rows"]
    with tqdm(total=rows, unit="vector", desc=f"index {key} wte", disable=not progress) as bar:
        built = store.build_index(ns, (PARTITION, "wte"), m["metric"], params, went_in)
        bar.set_postfix_str(f"built: all {rows:,} rows found through the graph")
    probe = index_recall(store, ns, m, int(params["ef"]))
    m = {**m, "indexes": {"wte": {**built, "ef": int(params["ef"]), "recall_at_build": probe,
                                  "version": INDEX_VERSION}}}
    store.put_meta(f"manifest:{key}", m)
    if verified:
        record_verified(store, key, m)  # the same files, under the manifest that now names the index
    return m


def index_recall(store: Store, ns: str, m: dict, ef: int, n: int = 32, k: int = 40) -> float:
    """recall@k of the index against the exact search, with n token vectors (seeded) as the queries:
    a check that the graph answers, and a first figure (real hidden states: ``puffergpt bench
    --output-search``). Two requests: the exact top k of all n, the approximate of each."""
    rows = np.random.default_rng(0).choice(m["matrices"]["wte"]["rows"], n, replace=False)
    enc, c = Encoding(m["metric"]), GPT2Config(**m["config"])
    q = enc.queries(enc.rows(store.fetch(ns, [doc_id("wte", r) for r in rows]), c.n_embd))  # (n, dim)
    exact = store.search(ns, [Query(v, (("matrix", "=", "wte"),), top_k=k) for v in q], m["metric"], ("row",))
    approx = store.search_approximate(ns, (PARTITION, "wte"), [Query(v, top_k=k) for v in q], m["metric"],
                                      ("row",), ef)
    got = [len(set(approx.attrs["row"][approx.query == i]) & set(exact.attrs["row"][exact.query == i])) / k
           for i in range(n)]
    return round(float(np.mean(got)), 4)


def _intact(store: Store, key: str, m: dict, repair: bool, progress: bool) -> tuple[bool, set[str]]:
    """Whether a complete load can be kept as it is, and the namespaces whose files the
    store's reader died on (dropped before the rewrite, which reads in this process)."""
    if store.stamp([]) is None:  # a database on a server: its counts, as the engine checks them
        return not repair and inconsistent(m, key) is None and _counts_ok(store, m), set()
    if not repair and _unchanged_since_verified(store, key, m):
        return True, set()
    bad, unreadable = check(store, m, key, progress)
    if not bad and not repair:
        record_verified(store, key, m)
    return not bad and not repair, unreadable


def weights_digest(ckpt: Checkpoint) -> str:
    """A digest of the float32 weights, so a reload notices a changed checkpoint."""
    h = hashlib.sha256()
    for k in sorted(ckpt.params):
        h.update(k.encode())
        h.update(np.ascontiguousarray(ckpt.params[k]).tobytes())
    return h.hexdigest()


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
                for msg in store.read_isolated("puffergpt.search.loading:_verify_lines", {"manifest": m, "names": todo},
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


def _unchanged_since_verified(store: Store, key: str, m: dict) -> bool:
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
    if not force and (store.stamp([]) is None or _unchanged_since_verified(store, key, m)):
        return
    bad, _ = check(store, m, key, progress)
    if bad:
        raise StoreDamaged(damage_message(model, store, bad))
    record_verified(store, key, m)


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
    if (why := _broken(m)) is not None:
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
    return Engine(store, manifest(store, key, model, verify=verify, progress=progress), model, key, **options)


def stored_bytes(m: dict) -> int:
    """Bytes of the vectors a manifest's namespaces hold (float32)."""
    enc = Encoding(m["metric"])
    return sum(n * enc.dim(int(ns.rsplit(".", 1)[1])) * 4 for ns, n in m["namespaces"].items())


def verify(store: Store, m: dict, progress: bool = False) -> dict[str, str]:
    """Every matrix (or namespace, or the manifest) that does not match the manifest, with what is wrong."""
    return check(store, m, progress=progress)[0]
