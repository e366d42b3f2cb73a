"""How deep a greedy step's token search goes, side by side in one run (issue 24, item 3).

/v1 without ``top_k`` asks for the whole vocabulary as top_k. At temperature 0 a step now
searches only the candidates it keeps (``Sampling.search_k``: 100); before, it asked the
store for all 50,257 hits a token. Arms, interleaved, on the demo model in the embedded
store, 24 tokens through ``completion.complete`` each:

- ``kept``: the rule as shipped (a top-100 search);
- ``whole (before)``: the previous rule, patched in here only (a top-50,257 search);
- ``logprobs``: ``full=True``, every logit scored, as log-probabilities need (unchanged).

    .venv/bin/python benchmarks/greedy_search_depth.py [--repeat 5] [--tokens 24]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from unittest import mock

from puffergpt.app.completion import complete
from puffergpt.model import checkpoints, tokenizer
from puffergpt.model.sampling import Sampling
from puffergpt.search import load, manifest
from puffergpt.search.engine import Engine
from puffergpt.search.manifest import open_engine
from puffergpt.stores import open_store

PROMPT = "The quick brown fox jumps over the lazy dog"


def run(eng: Engine, ids: list[int], n: int, s: Sampling, full: bool) -> tuple[float, list[int], int]:
    """(seconds, tokens, hits the token searches returned) of one completion."""
    t = time.perf_counter()
    steps = list(complete(eng.open, ids, n, s, full=full))
    dt = time.perf_counter() - t
    returned = sum(r.returned for st in steps for r in st.requests if r.kind.startswith("wte."))
    return dt, [st.token_id for st in steps], returned


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=24)
    a = ap.parse_args()
    ckpt = checkpoints.load("demo")
    store = open_store("embedded", tempfile.mkdtemp(prefix="puffergpt-bench-"))
    try:
        key = manifest.model_key(ckpt.name)
        load.load(store, ckpt, key, progress=False)
        eng, ids, s = open_engine(store, ckpt.name, key), tokenizer.encode(PROMPT), Sampling(0, ckpt.config.n_vocab)
        before = mock.patch.object(Sampling, "search_k", lambda self, keep: self.top_k)
        arms = {"kept": (s, False, None), "whole (before)": (s, False, before), "logprobs": (s, True, None)}
        times, seen = {k: [] for k in arms}, {}
        run(eng, ids, 2, s, False)  # warm the store's files
        for _ in range(a.repeat):
            for name, (smp, full, patch) in arms.items():
                if patch:
                    with patch:
                        dt, toks, hits = run(eng, ids, a.tokens, smp, full)
                else:
                    dt, toks, hits = run(eng, ids, a.tokens, smp, full)
                times[name].append(dt)
                seen[name] = (toks, hits)
        base = statistics.median(times["kept"])
        for name, ts in times.items():
            toks, hits = seen[name]
            same = "same tokens" if toks == seen["kept"][0] else "DIFFERENT tokens"
            print(f"{name:15s} median {statistics.median(ts):6.3f} s for {len(toks)} tokens  "
                  f"{statistics.median(ts) / base:5.2f}x kept  token-search hits {hits:,}  {same}")
    finally:
        store.close()


if __name__ == "__main__":
    main()
