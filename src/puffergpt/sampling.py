"""Picking the next token from the candidates a top-k search returned."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 is greedy
    top_k: int = 40
    seed: int | None = None

    def check(self, n_vocab: int) -> "Sampling":
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature}")
        if not 1 <= self.top_k <= n_vocab:
            raise ValueError(f"top_k must be between 1 and the vocabulary size {n_vocab}, got {self.top_k}")
        return self


def probabilities(logits: np.ndarray, temperature: float) -> np.ndarray:
    """Softmax of logits / temperature over the candidates; temperature 0 puts all
    the mass on the best one (ties go to the first, which has the lowest rank)."""
    logits = np.asarray(logits, dtype=np.float64)
    if temperature == 0:
        p = np.zeros_like(logits)
        p[np.argmax(logits)] = 1.0
        return p
    with np.errstate(over="ignore"):  # a tiny temperature sends the others to -inf: exp gives 0, never NaN
        e = np.exp((logits - logits.max()) / temperature)
    return e / e.sum()


def pick(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Index of the chosen candidate."""
    return int(np.argmax(probs)) if probs.max() == 1.0 else int(rng.choice(len(probs), p=probs))
