"""Plain helpers shared by the tests (fixtures live in conftest.py)."""

from __future__ import annotations

import numpy as np


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
