"""Shared fixtures: checkpoints the project makes or ships, and stores loaded with them."""

from __future__ import annotations

import numpy as np
import pytest

from puffergpt import checkpoints, loading
from puffergpt.stores import open_store


def report_diff(name: str, got: np.ndarray, want: np.ndarray) -> str:
    """llm.c style: the max difference and the first values that differ most."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    d = np.abs(got - want)
    i = np.unravel_index(np.argmax(d), d.shape) if d.size else ()
    return f"{name}: max |diff| {d.max():.3g} at {tuple(int(j) for j in i)} (got {got[i]:.6g}, want {want[i]:.6g}), mean {d.mean():.3g}"


def assert_close(name: str, got, want, atol: float) -> float:
    msg = report_diff(name, got, want)
    md = float(np.abs(np.asarray(got, np.float64) - np.asarray(want, np.float64)).max())
    assert md <= atol, msg + f" > {atol}"
    return md


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return checkpoints.make_model(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    return checkpoints.load(str(tiny_dir))


@pytest.fixture(scope="session")
def demo():
    # The demo model ships in the package: its absence is a failure, not a skip.
    return checkpoints.load("demo")


@pytest.fixture(scope="session")
def loaded(tmp_path_factory):
    """loaded(ckpt, metric) -> (store, key): a store holding ckpt's documents, made once per session."""
    made = {}

    def get(ckpt, metric="inner_product"):
        k = (ckpt.name, metric)
        if k not in made:
            store = open_store("embedded", tmp_path_factory.mktemp(f"store-{metric}"))
            key = loading.model_key(ckpt.name)
            loading.load(store, ckpt, key, metric=metric, progress=False)
            made[k] = (store, key)
        return made[k]

    yield get
    for store, _ in made.values():
        store.close()


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
