"""Plain helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# Max abs difference of the engine's top-40 logits from numpy's, per encoding (see docs/how-it-works.md).
LOGIT_BOUNDS = {"inner_product": 1e-3, "euclidean_squared": 5e-3, "cosine_distance": 1e-3}

# Max abs error of y = x @ W + b through a store, which computes distances in float32.
STORE_BOUNDS = {"inner_product": 1e-4, "euclidean_squared": 4e-3, "cosine_distance": 1e-4}


def message(r) -> str:
    """An error answer's message: every error, on every path, is {"error": {"message", ...}}."""
    got = r.json()
    assert set(got) == {"error"} and set(got["error"]) == {"message", "type", "param", "code"}, got
    return got["error"]["message"]


def layer(rng, n_in=768, n_out=3072):
    """A layer with GPT-2-like scales and a layer-normed input: w (out, in), b (out,), x (4, in)."""
    w = (0.14 * rng.standard_normal((n_out, n_in))).astype(np.float32)
    b = (0.1 * rng.standard_normal(n_out)).astype(np.float32)
    x = rng.standard_normal((4, n_in)).astype(np.float32)
    return w, b, x


def encoding_error_through(store, metric: str) -> float:
    """Store a layer's rows under ``metric``'s encoding, search every row, and return the
    max abs error of the outputs against float64 numpy (asserted within STORE_BOUNDS)."""
    from puffergpt.search.documents import Encoding
    from puffergpt.stores import Query

    w, b, x = layer(np.random.default_rng(1))
    enc = Encoding(metric)
    docs, M = enc.documents(w, b)
    store.create_namespace("m", docs.shape[1], {"matrix": "str", "row": "int"}, metric)
    store.upsert(
        "m", [f"w.{i}" for i in range(len(docs))], docs, {"matrix": ["w"] * len(docs), "row": np.arange(len(docs))}
    )
    q = enc.queries(x)
    hits = store.search("m", [Query(v, (("matrix", "=", "w"),)) for v in q], metric, include=("row",))
    dist = np.zeros((len(q), len(docs)))
    dist[hits.query, hits.attrs["row"]] = hits.distance
    return assert_close(f"{metric} via {store.name}", enc.outputs(dist, q, M),
                        x.astype(np.float64) @ w.T.astype(np.float64) + b, STORE_BOUNDS[metric])


def report_diff(name: str, got: np.ndarray, want: np.ndarray) -> str:
    """llm.c style: the max difference and the first values that differ most."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    d = np.abs(got - want)
    i = np.unravel_index(np.argmax(d), d.shape) if d.size else ()
    where = tuple(int(j) for j in i)
    return f"{name}: max |diff| {d.max():.3g} at {where} (got {got[i]:.6g}, want {want[i]:.6g}), mean {d.mean():.3g}"


def assert_close(name: str, got, want, atol: float) -> float:
    msg = report_diff(name, got, want)
    md = float(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)).max())
    assert md <= atol, msg + f" > {atol}"
    return md


PROMPTS = [
    "Hello world",
    "The list",
    "A function is defined with the def keyword",
    "1, 2, 3, 4, 5,",
    "The quick brown fox jumps over the lazy dog.",
    "In Python, a dictionary maps keys to values",
    "<|endoftext|>",
    "import numpy as np\nx = np.",
    "Ünïcödé and emoji 🎉 are bytes too",
    "for i in range(10):",
]


def compare_with_reference(ckpt, text, prompt: str, n: int, metric: str = "inner_product") -> tuple[float, list[int]]:
    """Greedy-generate on ``text`` (a Text over the engine) and with numpy side by side,
    asserting at every step the same top-40 ids, logits within LOGIT_BOUNDS[metric] and the
    same token; closes ``text``. Returns (worst logit difference, tokens)."""
    from puffergpt.model import tokenizer
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.sampling import Sampling
    from puffergpt.model.session import Run
    from puffergpt.texts.text import Text

    ids = tokenizer.encode(prompt)
    ref = Text(Run(NumpyWeights(ckpt)))
    text.append(ids)
    ref.append(ids)
    worst, tokens = 0.0, []
    try:
        pairs = zip(text.generate(n, Sampling(0, 40)), ref.generate(n, Sampling(0, 40)), strict=True)
        for step, (got, want) in enumerate(pairs):
            g = {c["token_id"]: c["logit"] for c in got.candidates()}
            w = {c["token_id"]: c["logit"] for c in want.candidates()}
            assert set(g) == set(w), f"{prompt!r} step {step}: top-40 ids differ"
            worst = max(worst, assert_close(f"{prompt!r} step {step} top-40 logits", [g[t] for t in w],
                                            list(w.values()), LOGIT_BOUNDS[metric]))
            assert got.token_id == want.token_id, (
                f"{prompt!r} step {step}: token {got.token_id} != reference {want.token_id}"
            )
            tokens.append(got.token_id)
    finally:
        text.close()
    return worst, tokens


def open_run_for(kind: str, loaded, ckpt):
    """A factory of runs (``model.session.Run``) for ckpt: "search", the engine on a store it is loaded into
    (``loaded``, the conftest fixture); anything else ("numpy", "reference"), numpy."""
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.session import Run
    from puffergpt.search.manifest import open_engine

    if kind != "search":
        return lambda: Run(NumpyWeights(ckpt))
    store, key = loaded(ckpt)
    return open_engine(store, ckpt.name, key).open


def vector_file(data: Path, ns: str, vector) -> tuple[Path, int]:
    """Where the embedded store under ``data`` keeps this vector (float32) of namespace ns:
    (file, offset) in its vector files, zvec's Flat index or (fallback) Qdrant Edge's chunks."""
    want = np.asarray(vector, np.float32).tobytes()
    for p in sorted([*data.glob(f"zvec/{ns}/**/*.proxima"), *data.glob(f"qdrant/{ns}/**/vectors/chunk_*.mmap")]):
        at = p.read_bytes().find(want)
        if at >= 0:
            return p, at
    raise AssertionError(f"no vector file under {data} holds that vector of {ns}")


def flip_exponents(path: Path, offset: int, n: int = 64) -> None:
    """The probe's bit rot: the exponent byte of n float32s from offset flipped (each number
    doubled or halved: plausible values, so nothing fails downstream), the file's times restored."""
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(offset)
        b = bytearray(f.read(4 * n))
        b[3::4] = bytes(x ^ 0x01 for x in b[3::4])
        f.seek(offset)
        f.write(b)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


HOLDER = """
import sys, time
from puffergpt.stores import open_store
s = open_store(sys.argv[1], sys.argv[2])
print("holding", flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def held_by_another_process(backend: str, data_dir: Path) -> Iterator[int]:
    """An in-process store's data directory opened by another process for the block: its pid.
    The process is killed at the end, and its lock goes with it."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER, backend, str(data_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "holding"
        yield p.pid
    finally:
        p.kill()
        p.wait()
