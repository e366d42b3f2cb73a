"""Writing a checkpoint into a store as documents, and the approximate index over its token vectors.

Where each row goes and what it is called (namespaces, ids, attributes) is the document
scheme in ``documents.py``; what each vector holds, the encodings there too.

``load`` is idempotent and resumable: it upserts matrix by matrix, records the
matrices done, and ends by reading every document back against its checksum
(``verify.py``), rewriting any matrix that does not match. Only then does it write the
manifest (``manifest.py``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import asdict

import numpy as np

from puffergpt.model import untrained
from puffergpt.model.checkpoints import Checkpoint, GPT2Config
from puffergpt.search import space
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
)
from puffergpt.search.engine import INDEX_VERSION
from puffergpt.search.manifest import broken, read_manifest, stored_manifest
from puffergpt.search.verify import (
    BATCH,
    check,
    checksum,
    counts_ok,
    inconsistent,
    index_damage,
    record_verified,
    row_norm2,
    unchanged_since_verified,
    verify_matrix,
)
from puffergpt.stores.base import Query, Store, StoreError


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


def weights_digest(ckpt: Checkpoint) -> str:
    """A digest of the float32 weights, so a reload notices a changed checkpoint."""
    h = hashlib.sha256()
    for k in sorted(ckpt.params):
        h.update(k.encode())
        h.update(np.ascontiguousarray(ckpt.params[k]).tobytes())
    return h.hexdigest()


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
    old = stored_manifest(store, key)
    if old and old.get("complete") and all(old.get(k) == v for k, v in ident.items()) and broken(old) is None:
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
    items = list(plan(ckpt, enc, key))
    space.check(store, space.load_bytes([(len(i), enc.dim(n_in_of(ns))) for ns, name, _, i in items
                                         if name not in state["done"]]), f"loading {key}")
    store.put_meta(f"manifest:{key}", {"complete": False, **ident})  # the engine refuses it until the end
    for n_in in sorted({n for _, n in matrices(c)}):  # every search of the weights names its matrix
        store.create_namespace(namespace(key, n_in), enc.dim(n_in), SCHEMA, metric, partition=PARTITION)

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
    (``indexes``, with INDEX_VERSION, and its files' digests where the store can read them: ``verify``
    and the start check them). Kept as it is where one alike is built and whole, unless ``rebuild``.
    The weights are not touched: a store whose files were verified stays verified. -> the manifest"""
    from tqdm import tqdm

    params = {**OUTPUT_INDEX, **(params or {})}
    m = read_manifest(store, key, model)
    ns = m["matrices"]["wte"]["namespace"]
    old = m.get("indexes", {}).get("wte")
    if (not rebuild and old and old.get("version") == INDEX_VERSION and all(old.get(p) == params[p] for p in params)
            and index_damage(store, m) is None):
        return m  # built already, alike, and whole
    verified = store.stamp([]) is not None and unchanged_since_verified(store, key, m)

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
    files = store.index_stamp(ns, (PARTITION, "wte"), m["metric"])  # what verify and the start digest again
    m = {**m, "indexes": {"wte": {**built, "ef": int(params["ef"]), "recall_at_build": probe,
                                  "version": INDEX_VERSION} | ({"files": files} if files is not None else {})}}
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
        return not repair and inconsistent(m, key) is None and counts_ok(store, m), set()
    if not repair and unchanged_since_verified(store, key, m):
        return True, set()
    bad, unreadable = check(store, m, key, progress)
    if not bad and not repair:
        record_verified(store, key, m)
    return not bad and not repair, unreadable
