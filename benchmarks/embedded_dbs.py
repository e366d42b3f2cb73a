"""Micro-benchmark: one exact search returning every row of a 3072 x 770 matrix.

This is the cost of one ``mlp.c_fc`` product of GPT-2 small as a search, on the
embedded databases that can do it exactly, next to numpy ``W @ x``. It chose the
embedded backend. Run: ``.venv/bin/python benchmarks/embedded_dbs.py``.
"""

from __future__ import annotations

import sqlite3
import statistics
import tempfile
import time

import duckdb
import numpy as np

ROWS, DIM, BATCH, REPEAT = 3072, 770, 16, 30


def timeit(fn, repeat=REPEAT) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main() -> None:
    rng = np.random.default_rng(0)
    W = rng.standard_normal((ROWS, DIM), dtype=np.float32)
    other = rng.standard_normal((ROWS, DIM), dtype=np.float32)  # a second matrix the filter must skip
    x = rng.standard_normal(DIM, dtype=np.float32)
    X = rng.standard_normal((BATCH, DIM), dtype=np.float32)
    ref = W @ x
    out = {"numpy W @ x": timeit(lambda: W @ x)}

    tmp = tempfile.mkdtemp()
    con = duckdb.connect(f"{tmp}/bench.duckdb")
    con.execute(f"CREATE TABLE docs (matrix VARCHAR, row INTEGER, vec FLOAT[{DIM}])")
    import pyarrow as pa  # noqa: F401  (duckdb ingests numpy via pandas-free arrow path)
    for name, M in (("a", W), ("b", other)):
        tbl = pa.table({"matrix": [name] * ROWS, "row": np.arange(ROWS, dtype=np.int32),
                        "vec": pa.FixedSizeListArray.from_arrays(pa.array(M.ravel()), DIM)})
        con.execute("INSERT INTO docs SELECT * FROM tbl")
    con.execute("CHECKPOINT")
    q = f"SELECT row, array_inner_product(vec, $1::FLOAT[{DIM}]) FROM docs WHERE matrix = 'a'"
    got = np.zeros(ROWS, np.float32)
    r = con.execute(q, [x.tolist()]).fetchnumpy()
    got[r["row"]] = r[list(r)[1]]
    assert np.abs(got - ref).max() < 1e-3
    out["duckdb array_inner_product, 1 query"] = timeit(lambda: con.execute(q, [x.tolist()]).fetchnumpy())
    qb = (f"SELECT q.i, d.row, array_inner_product(d.vec, q.v) FROM docs d, "
          f"(SELECT unnest(range(len($1::FLOAT[{DIM}][]))) AS i, unnest($1::FLOAT[{DIM}][]) AS v) q WHERE d.matrix = 'a'")
    out[f"duckdb batched, {BATCH} queries (per query)"] = timeit(lambda: con.execute(qb, [X.tolist()]).fetchnumpy()) / BATCH

    out |= lancedb_timing(tmp, W, other, x, ref)

    import sqlite_vec
    db = sqlite3.connect(f"{tmp}/bench.sqlite")
    if not hasattr(db, "enable_load_extension"):  # this Python's sqlite3 was built without extensions
        print("sqlite-vec: skipped, this Python's sqlite3 cannot load extensions")
        return report(out)
    db.enable_load_extension(True)
    sqlite_vec.load(db)
    db.execute("CREATE TABLE docs (matrix TEXT, row INTEGER, vec BLOB)")
    db.execute("CREATE INDEX docs_m ON docs(matrix)")
    for name, M in (("a", W), ("b", other)):
        db.executemany("INSERT INTO docs VALUES (?, ?, ?)", [(name, i, M[i].tobytes()) for i in range(ROWS)])
    db.commit()
    sq = "SELECT row, vec_distance_l2(vec, ?) FROM docs WHERE matrix = 'a'"
    out["sqlite-vec vec_distance_l2, 1 query"] = timeit(lambda: db.execute(sq, [x.tobytes()]).fetchall())

    report(out)


def lancedb_timing(tmp: str, W, other, x, ref) -> dict[str, float]:
    """LanceDB, brute force (no index) under a prefilter, dot product."""
    try:
        import lancedb
    except ImportError:
        print("lancedb: skipped, not installed (pip install lancedb)")
        return {}
    import pyarrow as pa

    db = lancedb.connect(f"{tmp}/lance")
    rows = lambda name, M: pa.table({"matrix": [name] * ROWS, "row": np.arange(ROWS, dtype=np.int32),  # noqa: E731
                                     "vector": pa.FixedSizeListArray.from_arrays(pa.array(M.ravel()), DIM)})
    t = db.create_table("docs", rows("a", W))
    t.add(rows("b", other))

    def q():
        return t.search(x).distance_type("dot").where("matrix = 'a'", prefilter=True).limit(ROWS).to_arrow()

    r = q()
    assert r.num_rows == ROWS and r["row"][0].as_py() == int(np.argmax(ref))  # every row, best first
    return {"lancedb dot, 1 query (no index)": timeit(q)}


def report(out: dict[str, float]) -> None:
    for k, v in out.items():
        print(f"{k:45s} {v:8.2f} ms")


if __name__ == "__main__":
    main()
