"""Where a decode step's time goes: median ms per request kind, on one store.

    .venv/bin/puffergpt make-model /tmp/gpt2r --preset gpt2
    .venv/bin/python benchmarks/profile_decode.py /tmp/gpt2r [--data DIR] [--tokens 8]

Prints, per kind of request (h.*.mlp.c_fc, h.*.attn.scores, wte.top_k, ...), its median
latency, its share of the step, and the multiply-adds a second it achieved; then the
same products in numpy for scale.
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time
from collections import defaultdict

import numpy as np

from puffergpt.model import checkpoints
from puffergpt.model.sampling import Sampling
from puffergpt.search import load, manifest
from puffergpt.search.manifest import open_engine
from puffergpt.stores import open_store
from puffergpt.texts.text import Text


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--data", default=None)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument(
        "--prefill", type=int, default=0, help="profile the prefill of a prompt of this many tokens instead"
    )
    a = ap.parse_args()
    ckpt = checkpoints.load(a.model)
    store = open_store("embedded", a.data or tempfile.mkdtemp(prefix="puffergpt-profile-"))
    key = manifest.model_key(a.model)
    load.load(store, ckpt, key)
    text = Text(open_engine(store, a.model, key).open())
    if a.prefill:
        text.append([int(t) for t in np.random.default_rng(a.prefill).integers(0, 50000, a.prefill)])
        steps = list(text.generate(1, Sampling(0, 40)))  # the one step that reads the prompt
    else:
        text.append([464, 1893, 286, 4881, 318])  # "The capital of France is"
        steps = list(text.generate(a.tokens + 1, Sampling(0, 40)))[1:]
    by_kind: dict[str, list[float]] = defaultdict(list)
    macs: dict[str, int] = {}
    for st in steps:
        for r in st.requests:
            k = re.sub(r"^h\.\d+\.", "h.*.", r.kind) + (" (concurrent)" if r.concurrent else "")
            by_kind[k].append(r.ms)
            macs[k] = r.bytes // 4  # one multiply-add per float scanned
    step_ms = statistics.median(st.ms for st in steps)
    what = f"prefill of {a.prefill} tokens" if a.prefill else f"decode step: median over {len(steps)} tokens"
    print(f"{what}: {step_ms:.1f} ms, {len(steps[0].requests)} requests, "
          f"{sum(r.round_trips for r in steps[0].requests)} sequential (concurrent ones overlap the others)")
    print(f"{'kind':22s} {'n/token':>7s} {'ms each':>8s} {'share':>6s} {'GMAC/s':>7s}")
    for k, v in sorted(by_kind.items(), key=lambda kv: -sum(kv[1])):
        n = len(v) // len(steps)
        med = statistics.median(v)
        rate = macs[k] / med / 1e6 if med else 0
        print(f"{k:22s} {n:7d} {med:8.2f} {n * med / step_ms:6.0%} {rate:7.2f}")
    C = ckpt.config.n_embd
    W = ckpt.params["h.0.mlp.c_fc.weight"]
    x = np.random.default_rng(0).standard_normal((1, C)).astype(np.float32)
    t = time.perf_counter()
    for _ in range(100):
        x @ W
    dt = (time.perf_counter() - t) / 100
    print(f"numpy x @ c_fc: {dt * 1e3:.3f} ms ({W.size / dt / 1e9:.2f} GMAC/s)")
    text.close()


if __name__ == "__main__":
    main()
