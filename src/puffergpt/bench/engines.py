"""``puffergpt bench``: the engines side by side, in one run, on one model.

Each engine reads prompts and decodes tokens at several positions; the engines
take turns (interleaved) so that a noisy machine hurts them alike. Reported per
engine: decode ms a token (median, p90) at positions near 1, 64 and 512 (those that
fit the model's context), prefill ms for 16-, 128- and 512-token prompts, requests
and sequential round trips a token, bytes scanned a token, and the process's peak
RSS after the engine ran; ratios against numpy.
"""

from __future__ import annotations

import os
import platform
import resource
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from puffergpt.app.completion import Usage, complete
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run

GREEDY = Sampling(0.0, 40)


@dataclass
class Plan:
    decode_positions: tuple[int, ...] = (1, 64, 512)
    prefill_lengths: tuple[int, ...] = (16, 128, 512)
    decode_tokens: int = 8  # decode steps timed at each position
    rounds: int = 2  # interleaved rounds over the engines

    @classmethod
    def quick(cls) -> Plan:
        return cls(decode_positions=(1, 64), prefill_lengths=(16, 128), decode_tokens=3, rounds=1)

    def fit(self, n_ctx: int) -> Plan:
        ok = lambda n: n + self.decode_tokens + 1 <= n_ctx  # noqa: E731
        return Plan(tuple(p for p in self.decode_positions if ok(p)), tuple(p for p in self.prefill_lengths if ok(p)),
                    self.decode_tokens, self.rounds)


@dataclass
class Samples:
    decode: dict[int, list[float]] = field(default_factory=dict)
    prefill: dict[int, list[float]] = field(default_factory=dict)
    requests: list[int] = field(default_factory=list)
    round_trips: list[int] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    peak_rss_mb: float = 0.0


def prompt_of(n: int, n_vocab: int) -> list[int]:
    """n token ids of ordinary text-like variety, the same for every engine."""
    rng = np.random.default_rng(n)
    return [int(t) for t in rng.integers(0, min(n_vocab, 50000), n)]


def run_engine(open_run: Callable, plan: Plan, n_vocab: int, s: Samples) -> None:
    for n in plan.prefill_lengths:  # the prefill: read n tokens, then one top-k
        (step,) = list(complete(open_run, prompt_of(n, n_vocab), 1, GREEDY))
        s.prefill.setdefault(n, []).append(step.ms)
    for p in plan.decode_positions:
        steps = list(complete(open_run, prompt_of(p, n_vocab), plan.decode_tokens + 1, GREEDY))[1:]
        s.decode.setdefault(p, []).extend(st.ms for st in steps)
        for st in steps:
            u = Usage.of([st])
            s.requests.append(u.requests)
            s.round_trips.append(u.round_trips)  # the concurrent key writes are not among them
            s.bytes.append(sum(r.bytes for r in st.requests if r.op == "search"))
    s.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def transformers_products(ckpt_dir: str):
    """transformers' GPT-2 on torch, timed beside the runs (not a Run: its own forward), or None without torch."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    model = transformers.GPT2LMHeadModel.from_pretrained(ckpt_dir, torch_dtype=torch.float32).eval()
    return TorchEngine(model)


class TorchEngine:
    """transformers' GPT-2 with its own KV cache, shaped to Text's needs for timing."""

    def __init__(self, model):
        self.model = model

    def open(self):
        return _TorchText(self.model)


class _TorchText:
    def __init__(self, model):
        self.model = model

    def run(self, prompt: list[int], n: int) -> list[float]:
        import torch

        times = []
        with torch.no_grad():
            t0 = time.perf_counter()
            out = self.model(torch.tensor([prompt]), use_cache=True)
            times.append((time.perf_counter() - t0) * 1e3)
            past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
            for _ in range(n):
                t0 = time.perf_counter()
                out = self.model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
                times.append((time.perf_counter() - t0) * 1e3)
                past, tok = out.past_key_values, int(out.logits[0, -1].argmax())
        return times


def run_torch(engine: TorchEngine, plan: Plan, n_vocab: int, s: Samples) -> None:
    for n in plan.prefill_lengths:
        s.prefill.setdefault(n, []).append(engine.open().run(prompt_of(n, n_vocab), 0)[0])
    for p in plan.decode_positions:
        s.decode.setdefault(p, []).extend(engine.open().run(prompt_of(p, n_vocab), plan.decode_tokens)[1:])
    s.peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def summarize(name: str, s: Samples) -> dict:
    all_decode = [v for vs in s.decode.values() for v in vs] or [float("nan")]  # every run ended at <|endoftext|>
    return {
        "engine": name,
        "decode_ms_per_token": {"median": statistics.median(all_decode), "p90": float(np.percentile(all_decode, 90)),
                                "by_position": {str(p): statistics.median(v) for p, v in s.decode.items()}},
        "prefill_ms": {str(n): statistics.median(v) for n, v in s.prefill.items()},
        "requests_per_token": statistics.median(s.requests) if s.requests else 0,
        "round_trips_per_token": statistics.median(s.round_trips) if s.round_trips else 0,
        "bytes_scanned_per_token": statistics.median(s.bytes) if s.bytes else 0,
        "peak_rss_mb": round(s.peak_rss_mb, 1),
    }


def machine() -> dict:
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "numpy": np.__version__, "blas": blas_threads()}


def blas_threads() -> list[dict]:
    """How numpy's BLAS is threaded in this run (it changes numpy's times by about a third
    on two cores), and the environment variables that set it."""
    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "MKL_NUM_THREADS")
           if k in os.environ}
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return [{"env": env, "threads": "unknown (pip install threadpoolctl to see)"}]
    return [{"env": env, **{k: i.get(k) for k in ("internal_api", "num_threads", "architecture")}}
            for i in threadpool_info() if i.get("user_api") == "blas"]


def bench(ckpt, ckpt_dir: str, engines: dict[str, Callable], plan: Plan, with_torch: bool = True) -> dict:
    """engines: name -> open_run; numpy and (if installed) transformers are added."""
    plan = plan.fit(ckpt.config.n_ctx)
    runners: dict[str, Callable[[Samples], None]] = {
        "numpy": lambda s: run_engine(lambda: Run(NumpyWeights(ckpt)), plan, ckpt.config.n_vocab, s)}
    torch_engine = transformers_products(ckpt_dir) if with_torch else None
    if torch_engine is not None:
        runners["transformers"] = lambda s: run_torch(torch_engine, plan, ckpt.config.n_vocab, s)
    for name, open_run in engines.items():
        runners[name] = lambda s, o=open_run: run_engine(o, plan, ckpt.config.n_vocab, s)
    samples = {name: Samples() for name in runners}
    for _ in range(plan.rounds):  # interleaved: each round runs every engine once
        for name, run in runners.items():
            run(samples[name])
    results = [summarize(name, s) for name, s in samples.items()]
    base = next(r for r in results if r["engine"] == "numpy")
    for r in results:
        r["decode_vs_numpy"] = r["decode_ms_per_token"]["median"] / base["decode_ms_per_token"]["median"]
        r["prefill_vs_numpy"] = {n: r["prefill_ms"][n] / base["prefill_ms"][n] for n in r["prefill_ms"]}
        if "128" in r["prefill_ms"] and r["engine"] not in ("numpy", "transformers"):
            r["prefill_128_vs_128_decodes"] = r["prefill_ms"]["128"] / (128 * r["decode_ms_per_token"]["median"])
    return {"model": ckpt.name, "machine": machine(), "plan": plan.__dict__, "results": results}


def table(report: dict) -> str:
    rows = [
        (
            "engine",
            "decode ms/tok (med)",
            "p90",
            "x numpy",
            "prefill ms " + "/".join(report["results"][0]["prefill_ms"]),
            "requests/tok",
            "round trips/tok",
            "MB scanned/tok",
            "peak RSS MB",
        )
    ]
    for r in report["results"]:
        rows.append((r["engine"], f"{r['decode_ms_per_token']['median']:.1f}", f"{r['decode_ms_per_token']['p90']:.1f}",
                     f"{r['decode_vs_numpy']:.1f}", " / ".join(f"{v:.0f}" for v in r["prefill_ms"].values()),
                     f"{r['requests_per_token']:.0f}", f"{r['round_trips_per_token']:.0f}",
                     f"{r['bytes_scanned_per_token'] / 1e6:.1f}", f"{r['peak_rss_mb']:.0f}"))
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    m = report["machine"]
    blas = ", ".join(
        f"{b.get('internal_api', 'blas')} {b.get('num_threads', b.get('threads'))} threads" for b in m["blas"]
    )
    head = f"{report['model']} on {m['cores']} cores ({m['cpu']}), numpy {m['numpy']} with {blas or 'no BLAS found'}"
    return (
        head + "\n" + "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)) for row in rows)
    )


def chart(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["engine"] for r in report["results"]]
    ms = [r["decode_ms_per_token"]["median"] for r in report["results"]]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.barh(names, ms, color="#3b6ea5")
    ax.set_xscale("log")
    ax.set_xlabel("decode ms a token (median, log scale)")
    ax.set_title(f"puffergpt bench: {report['model']}")
    for i, v in enumerate(ms):
        ax.text(v, i, f" {v:.1f}", va="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
