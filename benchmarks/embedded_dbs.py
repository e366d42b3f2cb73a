"""Micro-benchmark: the embedded store's two hot searches, on each engine, next to numpy.

1. one exact product: every row of a 3,072 x 770 matrix (GPT-2 small's ``mlp.c_fc`` as
   inner-product documents) under a filter on its matrix;
2. the top 40 of 50,257 rows (``wte``, the next-token search).

Both matrices live in one collection, so the filter has to skip the other one. Engines:
numpy (``W @ x``), Qdrant Edge through ``puffergpt``'s embedded store (what the engine
pays, end to end), Qdrant Edge's binding directly (the ways of asking it, to find the
cheapest), and DuckDB (the previous embedded store; skipped with a note when not installed).
Timings are medians in one process, so compare rows with each other, not across runs.

Run: ``.venv/bin/python benchmarks/embedded_dbs.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

ROWS, VOCAB, DIM, BATCH, K = 3072, 50_257, 770, 16, 40


def timeit(fn, repeat: int) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def check_product(name: str, rows, scores, ref) -> None:
    got = np.full(ROWS, np.nan)
    got[np.asarray(rows)] = scores
    err = np.abs(got - ref).max()
    assert err < 1e-2, f"{name}: max error {err} against numpy"  # a benchmark of a wrong answer is no benchmark


def numpy_timings(W, V, x, X, repeat) -> dict[str, float]:
    return {"numpy W @ x": timeit(lambda: W @ x, repeat),
            f"numpy W @ X, {BATCH} queries (per query)": timeit(lambda: X @ W.T, repeat) / BATCH,
            f"numpy top-{K} of {VOCAB:,}": timeit(lambda: np.argpartition(-(V @ x), K)[:K], repeat)}


def store_timings(tmp, W, V, x, X, ref, repeat) -> dict[str, float]:
    """Qdrant Edge through puffergpt's store (the embedded store's fallback mode, where it holds the
    weights too): the requests the engine sends."""
    from puffergpt.stores import Query
    from puffergpt.stores.embedded import EmbeddedStore

    s = EmbeddedStore(f"{tmp}/store", fallback=True)
    s.create_namespace("m", DIM, {"matrix": "str", "row": "int"}, "inner_product")
    for name, M in (("c_fc", W), ("wte", V)):
        for a in range(0, len(M), 4096):
            b = min(a + 4096, len(M))
            s.upsert(
                "m", [f"{name}.{i}" for i in range(a, b)], M[a:b], {"matrix": [name] * (b - a), "row": np.arange(a, b)}
            )
    one = [Query(x, (("matrix", "=", "c_fc"),))]
    h = s.search("m", one, "inner_product", ("row",))
    check_product("store", h.attrs["row"], h.distance, ref)
    batch = [Query(v, (("matrix", "=", "c_fc"),)) for v in X]
    top = [Query(x, (("matrix", "=", "wte"),), top_k=K)]
    out = {
        "qdrant-edge store.search, 1 query": timeit(lambda: s.search("m", one, "inner_product", ("row",)), repeat),
        f"qdrant-edge store.search, {BATCH} queries (per query)": timeit(
            lambda: s.search("m", batch, "inner_product", ("row",)), repeat
        )
        / BATCH,
        f"qdrant-edge store.search top-{K} of {VOCAB:,}": timeit(
            lambda: s.search("m", top, "inner_product", ("row",)), repeat
        ),
    }
    out |= binding_timings(s.texts._get("m"), x, X, repeat)
    s.close()
    return out


def binding_timings(n, x, X, repeat) -> dict[str, float]:
    """The same product asked of the binding in different ways: what each costs."""
    import qdrant_edge as qe

    f = qe.Filter(must=[qe.FieldCondition("matrix", match=qe.MatchValue("c_fc"))])
    exact = qe.SearchParams(exact=True)

    def ask(limit, payload, v=x):
        return n.shard.query(qe.QueryRequest(limit=limit, query=qe.Query.Nearest(v, using="inner_product"), filter=f,
                                             with_payload=payload, with_vector=False, params=exact))

    def unpack(r):
        return np.fromiter((p.id for p in r), np.int64, len(r)), np.fromiter((p.score for p in r), np.float64, len(r))

    def reqs():
        return qe.QueryBatchRequest(
            [
                qe.QueryRequest(
                    limit=ROWS,
                    query=qe.Query.Nearest(v, using="inner_product"),
                    filter=f,
                    with_payload=False,
                    params=exact,
                )
                for v in X
            ]
        )
    total = len(n.slots)
    return {
        "binding: ids + scores, limit = rows": timeit(lambda: unpack(ask(ROWS, False)), repeat),
        f"binding: ids + scores, limit = all {total:,} docs": timeit(lambda: unpack(ask(total, False)), repeat),
        "binding: payload 'row' + scores, limit = rows": timeit(
            lambda: [(p.payload["row"], p.score) for p in ask(ROWS, ["row"])], repeat
        ),
        "binding: query only, no unpacking": timeit(lambda: ask(ROWS, False), repeat),
        "binding: limit 1 (the search alone)": timeit(lambda: ask(1, False), repeat),
        f"binding: query_batch of {BATCH} (per query)": timeit(
            lambda: [unpack(r) for r in n.shard.query_batch(reqs())], repeat
        )
        / BATCH,
    }


def duckdb_timings(tmp, W, V, x, X, ref, repeat) -> dict[str, float]:
    """DuckDB, the previous embedded store: array_inner_product over FLOAT[770] under a filter."""
    try:
        import duckdb
        import pyarrow as pa
    except ImportError:
        print("duckdb: not installed, so not measured (pip install duckdb pyarrow to compare)")
        return {}
    con = duckdb.connect(f"{tmp}/bench.duckdb")
    con.execute(f"CREATE TABLE docs (matrix VARCHAR, row INTEGER, vec FLOAT[{DIM}])")
    for name, M in (("c_fc", W), ("wte", V)):
        tbl = pa.table({"matrix": [name] * len(M), "row": np.arange(len(M), dtype=np.int32),  # noqa: F841 (read by DuckDB)
                        "vec": pa.FixedSizeListArray.from_arrays(pa.array(M.ravel()), DIM)})
        con.execute("INSERT INTO docs SELECT * FROM tbl")
    con.execute("CHECKPOINT")
    q = f"SELECT row, array_inner_product(vec, $1::FLOAT[{DIM}]) AS d FROM docs WHERE matrix = 'c_fc'"
    r = con.execute(q, [x.tolist()]).fetchnumpy()
    check_product("duckdb", r["row"], r["d"], ref)
    qb = (
        f"SELECT q.i, d.row, array_inner_product(d.vec, q.v) FROM docs d, "
        f"(SELECT unnest(range(len($1::FLOAT[{DIM}][]))) AS i, unnest($1::FLOAT[{DIM}][]) AS v) q WHERE d.matrix = 'c_fc'"
    )
    qt = f"SELECT row, array_inner_product(vec, $1::FLOAT[{DIM}]) AS d FROM docs WHERE matrix = 'wte' ORDER BY d DESC LIMIT {K}"
    return {
        "duckdb array_inner_product, 1 query": timeit(lambda: con.execute(q, [x.tolist()]).fetchnumpy(), repeat),
        f"duckdb batched, {BATCH} queries (per query)": timeit(
            lambda: con.execute(qb, [X.tolist()]).fetchnumpy(), repeat
        )
        / BATCH,
        f"duckdb top-{K} of {VOCAB:,}": timeit(lambda: con.execute(qt, [x.tolist()]).fetchnumpy(), repeat),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=30)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    W = (0.14 * rng.standard_normal((ROWS, DIM))).astype(np.float32)
    V = (0.14 * rng.standard_normal((VOCAB, DIM))).astype(np.float32)
    x = rng.standard_normal(DIM).astype(np.float32)
    X = rng.standard_normal((BATCH, DIM)).astype(np.float32)
    ref = W.astype(np.float64) @ x
    out = numpy_timings(W, V, x, X, a.repeat)
    with tempfile.TemporaryDirectory() as tmp:
        out |= store_timings(tmp, W, V, x, X, ref, a.repeat)
        out |= duckdb_timings(tmp, W, V, x, X, ref, a.repeat)
    base = out["numpy W @ x"]
    for k, v in out.items():
        print(f"{k:55s} {v:8.2f} ms  {v / base:6.1f}x numpy W @ x")


if __name__ == "__main__":
    main()
