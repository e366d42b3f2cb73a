"""Picking the next token: from the candidates a top-k search returned, or from the
whole vocabulary's scores (one search over every wte row) when the request needs the
exact distribution (``top_p``, OpenAI's log-probabilities)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 is greedy
    top_k: int = 40
    seed: int | None = None
    top_p: float = 1.0  # nucleus: below 1, sampling keeps the smallest set of tokens with this much mass

    def check(self, n_vocab: int) -> Sampling:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature}")
        if not 1 <= self.top_k <= n_vocab:
            raise ValueError(f"top_k must be between 1 and the vocabulary size {n_vocab}, got {self.top_k}")
        if not np.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p}")
        return self

    def search_k(self, keep: int) -> int:
        """How many candidates a step's top-k search must return: above temperature 0 the
        draw is over all top_k; at 0 the pick is the best one whatever top_k is, so only
        the ``keep`` a step holds for the page (top_k when fewer), never the whole
        vocabulary (that is for log-probabilities and top_p, which need every logit)."""
        return min(self.top_k, keep) if self.temperature == 0 else self.top_k


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


def distribution(logits: np.ndarray, s: Sampling) -> np.ndarray:
    """What to sample from: softmax at s.temperature, kept to the s.top_k best (a no-op
    over top-k candidates) and to the nucleus of mass s.top_p, renormalised. (n,) -> (n,)"""
    logits = np.asarray(logits, dtype=np.float64)
    if s.top_k < len(logits):
        keep = np.argsort(-logits, kind="stable")[: s.top_k]
        masked = np.full_like(logits, -np.inf)
        masked[keep] = logits[keep]
        logits = masked
    p = probabilities(logits, s.temperature)
    if s.top_p < 1:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]  # the mass of the tokens ranked above each
        kept = np.zeros(len(p), bool)
        kept[order[before < s.top_p]] = True  # the best token always: its "before" is 0
        p = np.where(kept, p, 0.0)
        p /= p.sum()
    return p


def log_softmax(logits: np.ndarray) -> tuple[np.ndarray, float]:
    """The normaliser of the whole vocabulary's scores at temperature 1: -> (logits as
    float64, log sum exp), so a token's log-probability is logits[i] - logz."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    return x, float(m + np.log(np.exp(x - m).sum()))


SLIDER = tuple(round(0.05 * i, 2) for i in range(41))  # the page's temperature slider: 0, 0.05, .. 2


def normalisers(logits: np.ndarray, temperatures) -> dict[float, float]:
    """The whole vocabulary's normaliser at each temperature T, as T * log sum exp(logits / T)
    (at T = 1 the log sum exp; at T = 0 its limit, the largest logit), so that a token's
    probability over every token at T is exp((logit - n_T) / T): (V,) -> {T: n_T}"""
    x = np.asarray(logits, dtype=np.float64)
    m = float(x.max())
    return {float(t): m if t == 0 else m + float(t * np.log(np.exp((x - m) / t).sum())) for t in temperatures}


def probability_over_all(logit: float, normaliser: dict[float, float], temperature: float) -> float:
    """A token's probability over the whole vocabulary at ``temperature`` (``normalisers``); at 0,
    1 for the best token and 0 for the others."""
    n = normaliser[float(temperature)]
    if temperature == 0:
        return 1.0 if logit >= n else 0.0
    return float(np.exp((logit - n) / temperature))


def pick(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Index of the chosen candidate."""
    return int(np.argmax(probs)) if probs.max() == 1.0 else int(rng.choice(len(probs), p=probs))
