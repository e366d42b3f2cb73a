"""Micro study (issues 24 and 30): the embedded store's weights on zvec, a read-only Flat
collection per matrix, against the same on Qdrant Edge (its fallback mode, and the default
before), each through the puffergpt store, next to numpy, at GPT-2 small's shapes.

One namespace of 769-wide inner-product documents laid out as GPT-2 small's ``K.768``
(``wte`` 50,257 rows, ``wpe`` 1,024, and each of 12 layers' ``attn.c_attn`` 2,304,
``attn.c_proj`` 768 and ``mlp.c_fc`` 3,072: 125,009 documents), created as the load creates
it (``partition="matrix"``: on zvec a collection per matrix; Qdrant Edge filters one shard);
and one of a text's keys (12 layers x 12 heads x 512 positions, 64 wide, on Qdrant Edge in
both modes), searched as decode's attention is. Arms:

1. one product: every row of ``h.5.mlp.c_fc`` (3,072 x 769), all scores;
2. a batch of 16 such queries (a short prefill's product), per query;
3. the top 40 of ``wte``'s 50,257 rows (the next-token search);
4. decode's attention for one layer: 12 queries (one a head), each over its head's keys
   before position 511;
5. the GIL: the same product searched N times on one thread, then N times on each of
   two threads at once; a ratio of wall times near 1 means the searches ran in parallel.

zvec runs with ``threads=1`` (each query on the calling thread) and ``threads`` = the cores
(the store's default: a batch's queries on a pool of a thread per core; a lone query is not split).
The arms take turns, round after round (interleaved), so that a noisy machine hurts
them alike; the figures are medians. Every arm's scores are checked against float64
numpy first (a benchmark of a wrong answer is no benchmark) and the max difference printed.

Run: ``.venv/bin/python benchmarks/zvec_vs_qdrant.py [--rounds N]`` (a few minutes: the fill).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

import numpy as np

from puffergpt.stores import Query
from puffergpt.stores.embedded import EmbeddedStore

DIM, ROWS, VOCAB, BATCH, K = 769, 3072, 50_257, 16, 40
SCHEMA = {"matrix": "str", "row": "int", "norm2": "float"}
KEYS = {"layer": "int", "head": "int", "pos": "int"}
MATRIX = "h.5.mlp.c_fc"


def layout() -> list[tuple[str, int]]:
    return [("wte", VOCAB), ("wpe", 1024)] + [
        (f"h.{i}.{m}", r) for i in range(12) for m, r in (("attn.c_attn", 2304), ("attn.c_proj", 768),
                                                          ("mlp.c_fc", ROWS))]


def fill(store, rng) -> dict[str, np.ndarray]:
    """The weights namespace and the keys namespace; returns the matrices numpy compares with."""
    kept = {}
    store.create_namespace("w", DIM, SCHEMA, "inner_product", partition="matrix")
    for name, rows in layout():
        M = (0.1 * rng.standard_normal((rows, DIM))).astype(np.float32)
        if name in (MATRIX, "wte"):
            kept[name] = M
        for a in range(0, rows, 4096):
            b = min(a + 4096, rows)
            store.upsert("w", [f"{name}.{i}" for i in range(a, b)], M[a:b],
                         {"matrix": [name] * (b - a), "row": np.arange(a, b),
                          "norm2": (M[a:b].astype(np.float64) ** 2).sum(1)})
    store.create_namespace("k", 64, KEYS, "inner_product", ephemeral=True)
    keys = rng.standard_normal((12, 12, 512, 64)).astype(np.float32)  # (layer, head, pos, hd)
    L, H, P = np.meshgrid(range(12), range(12), range(512), indexing="ij")
    for a in range(0, L.size, 8192):
        sl = slice(a, a + 8192)
        store.upsert("k", [f"{l}.{h}.{p}" for l, h, p in zip(L.ravel()[sl], H.ravel()[sl], P.ravel()[sl], strict=True)],
                     keys.reshape(-1, 64)[sl], {"layer": L.ravel()[sl], "head": H.ravel()[sl], "pos": P.ravel()[sl]})
    kept["keys"] = keys[5]  # layer 5: (head, pos, hd)
    return kept


def arms(store, kept, x, X, q) -> dict[str, callable]:
    one = [Query(x, (("matrix", "=", MATRIX),))]
    batch = [Query(v, (("matrix", "=", MATRIX),)) for v in X]
    top = [Query(x, (("matrix", "=", "wte"),), top_k=K)]
    att = [Query(q[h], (("layer", "=", 5), ("head", "=", h), ("pos", "<", 511))) for h in range(12)]
    return {
        "product": lambda: store.search("w", one, "inner_product", ("row",)),
        "batch": lambda: store.search("w", batch, "inner_product", ("row",)),
        "top40": lambda: store.search("w", top, "inner_product", ("row",)),
        "attention": lambda: store.search("k", att, "inner_product", ("head", "pos")),
    }


def check(name: str, kept, x, X, q, run) -> None:
    """Each arm's scores against float64 numpy: prints the max difference, fails on a wrong answer."""
    W, V, keys = (kept[k].astype(np.float64) for k in (MATRIX, "wte", "keys"))
    h = run["product"]()
    got = np.full(ROWS, np.nan)
    got[h.attrs["row"]] = h.distance
    d1 = np.abs(got - W @ x).max()
    h = run["batch"]()
    got = np.full((BATCH, ROWS), np.nan)
    got[h.query, h.attrs["row"]] = h.distance
    d2 = np.abs(got - X.astype(np.float64) @ W.T).max()
    h = run["top40"]()
    assert h.attrs["row"].tolist() == np.argsort(-(V @ x))[:K].tolist(), f"{name}: another top 40"
    h = run["attention"]()
    want = np.einsum("hpi,hi->hp", keys[:, :511], q.astype(np.float64))
    d3 = np.abs(h.distance - want[h.attrs["head"], h.attrs["pos"]]).max()
    assert len(h.query) == 12 * 511 and max(d1, d2, d3) < 1e-3, (name, d1, d2, d3)
    print(f"{name}: max |score - numpy float64|: product {d1:.1e}, batch {d2:.1e}, attention {d3:.1e}")


def gil(search, n: int = 20) -> tuple[float, float]:
    """Wall ms of n searches on one thread, and of n on each of two threads at once."""
    search()  # warm
    t = time.perf_counter()
    for _ in range(n):
        search()
    one = time.perf_counter() - t
    ts = [threading.Thread(target=lambda: [search() for _ in range(n)]) for _ in range(2)]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return one * 1e3, (time.perf_counter() - t) * 1e3


def gil_rounds(engines: dict, rounds: int) -> None:
    """gil() for each engine, round after round (interleaved), medians printed."""
    got = {name: [] for name in engines}
    for _ in range(rounds):
        for name, search in engines.items():
            got[name].append(gil(search))
    for name, runs in got.items():
        one, two = (statistics.median(x) for x in zip(*runs, strict=True))
        print(f"GIL, {name}: 20 products on 1 thread {one:.0f} ms; 20 on each of 2 threads at once "
              f"{two:.0f} ms (x{two / one:.2f} the wall time for x2 the work; medians of {rounds} rounds)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    x, X = rng.standard_normal(DIM).astype(np.float32), rng.standard_normal((BATCH, DIM)).astype(np.float32)
    q = rng.standard_normal((12, 64)).astype(np.float32)
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="zvec-vs-qdrant-") as tmp:
        stores, kept = {}, None
        for name, fallback in (("qdrant edge", True), ("zvec", False)):
            t = time.perf_counter()
            stores[name] = EmbeddedStore(f"{tmp}/{name}", fallback=fallback)
            kept = fill(stores[name], np.random.default_rng(1))  # the same documents in both
            print(f"{name}: wrote {sum(r for _, r in layout()) + 12 * 12 * 512:,} documents in "
                  f"{time.perf_counter() - t:.1f} s")
        W, V = kept[MATRIX], kept["wte"]
        runs = {"numpy": {"product": lambda: W @ x, "batch": lambda: X @ W.T,
                          "top40": lambda: np.argpartition(-(V @ x), K)[:K],
                          "attention": lambda: np.einsum("hpi,hi->hp", kept["keys"][:, :511], q)},
                "qdrant edge": arms(stores["qdrant edge"], kept, x, X, q)}
        zv = stores["zvec"].weights
        for t in sorted({1, cores}):
            runs[f"zvec threads={t}"] = {k: (lambda f=f, t=t: (setattr(zv, "threads", t), f())[1])
                                         for k, f in arms(stores["zvec"], kept, x, X, q).items()}
        for name, run in runs.items():
            if name != "numpy":
                check(name, kept, x, X, q, run)
        times = {(n, a): [] for n in runs for a in runs[n]}
        for _ in range(args.rounds):  # interleaved: every arm of every engine once a round
            for a in ("product", "batch", "top40", "attention"):
                for n, run in runs.items():
                    t = time.perf_counter()
                    run[a]()
                    times[n, a].append((time.perf_counter() - t) * 1e3)
        report(runs, times)
        zv.threads = 1
        gil_rounds({"qdrant edge": runs["qdrant edge"]["product"], "zvec": runs["zvec threads=1"]["product"]},
                   max(3, args.rounds // 2))
        for s in stores.values():
            s.close()


def report(runs, times) -> None:
    """Medians, then minimums (on a machine shared with other jobs the least disturbed round)."""
    for what, f in (("median", statistics.median), ("minimum", min)):
        best = {k: f(v) for k, v in times.items()}
        print(f"\n{what} ms over {len(next(iter(times.values())))} interleaved rounds, {os.cpu_count()} CPUs "
              f"(batch: per query); in brackets, x numpy")
        print(f"| engine | 1 product 3,072x769 | batch of {BATCH}, per query | top-{K} of {VOCAB:,} "
              "| attention, 12 heads |")
        print("|---|---|---|---|---|")
        for n in runs:
            cells = []
            for a in ("product", "batch", "top40", "attention"):
                m = best[n, a] / (BATCH if a == "batch" else 1)
                ref = best["numpy", a] / (BATCH if a == "batch" else 1)
                cells.append(f"{m:.3f}" + ("" if n == "numpy" else f" ({m / ref:.1f}x)"))
            print(f"| {n} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
