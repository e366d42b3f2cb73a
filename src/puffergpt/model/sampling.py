"""Picking the next token: from the candidates a top-k search returned, or from the
whole vocabulary's scores (one search over every wte row) when the request needs the
exact distribution (``top_p``, OpenAI's log-probabilities).

Before the pick, the sampling's controls change some logits (``controls``), in this order:

1. ``repetition_penalty`` r, as ``transformers``' ``RepetitionPenaltyLogitsProcessor`` (and vLLM):
   every token already in the text (the prompt and what was generated), its logit divided by r
   where positive, multiplied by r where negative;
2. ``frequency_penalty`` f and ``presence_penalty`` p, as OpenAI defines them, over the tokens the
   model generated: logit[t] -= count[t] * f + (count[t] > 0) * p;
3. ``logit_bias``: logit[t] += bias[t].

Then temperature, ``top_k``, ``top_p`` and ``min_p`` choose from what the controls left.

The candidates are the true top k **after** the controls, over the whole vocabulary, though the
search returns only the k best before them (``search_size``, ``best_after``). Let S be the tokens a
control touches (``touched``). A token outside S keeps its logit, so the k best after the controls
are among the k best outside S and the tokens of S; the k + |S| best before the controls hold the k
best outside S. Of S, a token the controls only lower can enter the top k only if it was among the
k + |S| best already; a token they may raise (a positive bias, r < 1, a negative f or p) must be
scored wherever it is: its rows are scored in one search restricted to them (``Products.token_logits``).
So: one top-(k + |S|) search, one restricted search of the raisable tokens it missed, exact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

# The controls that move logits, in the order they apply; a candidate's ``moved`` is a bit mask over them
CONTROLS = ("repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias")
MAX_LOGIT_BIAS = 300  # entries, as OpenAI allows
BIAS_RANGE = 100.0  # each bias in [-100, 100], as OpenAI
PENALTY_RANGE = 2.0  # presence and frequency penalties in [-2, 2], as OpenAI


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 is greedy
    top_k: int = 40
    seed: int | None = None
    top_p: float = 1.0  # nucleus: below 1, sampling keeps the smallest set of tokens with this much mass
    min_p: float = 0.0  # keep the tokens at least min_p times as likely as the best one
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit

    def check(self, n_vocab: int) -> Sampling:
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature}")
        if not 1 <= self.top_k <= n_vocab:
            raise ValueError(f"top_k must be between 1 and the vocabulary size {n_vocab}, got {self.top_k}")
        if not np.isfinite(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p}")
        if not np.isfinite(self.min_p) or not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be a number in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not np.isfinite(v) or not -PENALTY_RANGE <= v <= PENALTY_RANGE:
                raise ValueError(f"{name} must be a number in [-2, 2], got {v}")
        if not np.isfinite(self.repetition_penalty) or not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be a number > 0 (1: none), got {self.repetition_penalty}")
        self._check_bias(n_vocab)
        return self

    def _check_bias(self, n_vocab: int) -> None:
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias has {len(self.logit_bias)} entries, at most {MAX_LOGIT_BIAS}")
        for t, b in self.logit_bias.items():
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < n_vocab:
                raise ValueError(f"logit_bias: token id {t!r} is outside the vocabulary (0..{n_vocab - 1})")
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not -BIAS_RANGE <= b <= BIAS_RANGE:
                raise ValueError(f"logit_bias: the bias of token {t} must be a number in [-100, 100], got {b!r}")

    @property
    def controlled(self) -> bool:
        """Whether any control moves a logit."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1
                    or any(self.logit_bias.values()))

    def touched(self, seen, generated) -> tuple[np.ndarray, np.ndarray]:
        """The tokens the controls move, given the text before the position (``seen``: every token,
        ``generated``: those the model wrote), and of them those a control may raise.
        -> (touched ids, raisable ids), each sorted and unique"""
        rep = np.unique(np.asarray(seen, np.int64)) if self.repetition_penalty != 1 else np.zeros(0, np.int64)
        pen = (np.unique(np.asarray(generated, np.int64)) if self.presence_penalty or self.frequency_penalty
               else np.zeros(0, np.int64))
        bias = np.array(sorted(t for t, b in self.logit_bias.items() if b), np.int64)
        up = [np.array(sorted(t for t, b in self.logit_bias.items() if b > 0), np.int64)]
        up += [rep] if self.repetition_penalty < 1 else []
        up += [pen] if self.presence_penalty < 0 or self.frequency_penalty < 0 else []
        return np.union1d(np.union1d(rep, pen), bias), np.unique(np.concatenate(up))

    def search_k(self, keep: int) -> int:
        """How many candidates a step's top-k search must return: above temperature 0 the
        draw is over all top_k; at 0 the pick is the best one whatever top_k is, so only
        the ``keep`` a step holds for the page (top_k when fewer), never the whole
        vocabulary (that is for log-probabilities and top_p, which need every logit)."""
        return min(self.top_k, keep) if self.temperature == 0 else self.top_k


def bias_from_json(raw: dict) -> dict[int, float]:
    """A logit_bias as JSON sends it (token ids are object keys, so strings: {"50256": -100}) -> {id: bias};
    a ValueError naming the entry at fault (the vocabulary's bound is ``Sampling.check``'s)."""
    if len(raw) > MAX_LOGIT_BIAS:
        raise ValueError(f"at most {MAX_LOGIT_BIAS} entries, got {len(raw)}")
    out = {}
    for key, b in raw.items():
        if not isinstance(key, str) or not key.isascii() or not key.isdigit() or len(key) > 9:
            raise ValueError(f"{key!r} is not a token id: the keys are token ids, as strings")
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not -BIAS_RANGE <= b <= BIAS_RANGE:
            raise ValueError(f"the bias of token {key} must be a number in [-100, 100], got {b!r}")
        out[int(key)] = float(b)
    return out


def controls_json(s: Sampling) -> dict:
    """The controls a sampling sets (those at their default left out), as /v1 takes them: logit_bias's keys
    are token ids as strings. What a step says it was generated with, and an insight records."""
    d = {"min_p": s.min_p, "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
         "repetition_penalty": s.repetition_penalty}
    d = {k: float(v) for k, v in d.items() if v != (1 if k == "repetition_penalty" else 0)}
    if any(s.logit_bias.values()):
        d["logit_bias"] = {str(t): float(b) for t, b in sorted(s.logit_bias.items()) if b}
    return d


def search_size(k: int, touched: np.ndarray) -> int:
    """How many of the best candidates before the controls hold the k best after them, with the
    raisable tokens scored apart: k + |touched| (this module's docstring says why)."""
    return k + len(touched)


def controls(s: Sampling, ids, logits, seen, generated) -> tuple[np.ndarray, np.ndarray]:
    """The sampling's controls applied to the logits of the tokens ``ids``, in ``CONTROLS``' order,
    given every token before the position (``seen``) and those the model wrote (``generated``).
    (n,), (n,) -> (logits after (n,) float64, the controls that moved each: a bit mask (n,) over CONTROLS)"""
    ids = np.asarray(ids, np.int64)
    after = np.asarray(logits, np.float64).copy()
    moved = np.zeros(len(ids), np.uint8)
    if s.repetition_penalty != 1:
        hit = np.isin(ids, np.asarray(seen, np.int64))
        x = after[hit]
        after[hit] = np.where(x < 0, x * s.repetition_penalty, x / s.repetition_penalty)
        moved[hit] |= 1
    if s.presence_penalty or s.frequency_penalty:
        count = _lookup(ids, *np.unique(np.asarray(generated, np.int64), return_counts=True))
        after -= count * s.frequency_penalty + (count > 0) * s.presence_penalty
        moved[(count > 0) & bool(s.frequency_penalty)] |= 2
        moved[(count > 0) & bool(s.presence_penalty)] |= 4
    if s.logit_bias:
        keys = np.array(sorted(s.logit_bias), np.int64)
        b = _lookup(ids, keys, np.array([s.logit_bias[int(t)] for t in keys], np.float64))
        after += b
        moved[b != 0] |= 8
    return after, moved


def _lookup(ids: np.ndarray, keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values[keys == id] for each id, 0 where the id is not a key (keys sorted): (n,) -> (n,)"""
    if len(keys) == 0:
        return np.zeros(len(ids), values.dtype if len(values) else np.float64)
    at = np.clip(np.searchsorted(keys, ids), 0, len(keys) - 1)
    return np.where(keys[at] == ids, values[at], 0)


@dataclass(frozen=True)
class Controls:
    """What the controls did to some candidates (whose logits are after them): each one's logit ``before``
    them, the controls that ``moved`` it (a bit mask over CONTROLS), and the ``sampling`` whose controls
    they were (to apply them again to the whole vocabulary: ``texts/probabilities.py``)."""

    sampling: Sampling
    before: np.ndarray
    moved: np.ndarray

    def at(self, which) -> Controls:
        """Those of some candidates (an index or a slice)."""
        return Controls(self.sampling, self.before[which], self.moved[which])

    def of(self, r: int) -> dict:
        """Candidate r's, as JSON: its logit before the controls and the controls that moved it, by name."""
        return {"logit_before": float(self.before[r]), "moved": moved_names(self.moved[r])}


def exact_top_k(s: Sampling, k: int, n_vocab: int, seen, generated, top_k: Callable, token_logits: Callable,
                every: Callable) -> tuple[np.ndarray, np.ndarray, Controls | None]:
    """The k best tokens after the controls, over the whole vocabulary (the module's docstring says
    why it is exact), from ``top_k(n)`` -> (ids, logits) the n best before them, ``token_logits(ids)``
    -> their logits, and ``every()`` -> all V logits (where k + |touched| is most of the vocabulary).
    Without a control, just ``top_k(k)``. -> (ids (k,), logits after (k,), Controls or None)"""
    if not s.controlled:
        ids, scores = top_k(k)
        return ids, scores, None
    touched, raisable = s.touched(seen, generated)
    n = search_size(k, touched)
    if n >= n_vocab:
        scores = np.asarray(every(), np.float64)
        return best_after(s, np.arange(len(scores)), scores, k, seen, generated)
    ids, scores = top_k(n)
    missing = np.setdiff1d(raisable, ids)
    if len(missing):
        ids, scores = np.concatenate([ids, missing]), np.concatenate([scores, token_logits(missing)])
    return best_after(s, ids, scores, k, seen, generated)


def controlled(s: Sampling, scores, seen, generated) -> tuple[np.ndarray, Controls | None]:
    """The whole vocabulary's scores (V,) after the controls, and what they did by token id (None where no
    control is set). -> ((V,) float64, Controls | None)"""
    if not s.controlled:
        return scores, None
    scores = np.asarray(scores, np.float64)
    after, moved = controls(s, np.arange(len(scores)), scores, seen, generated)
    return after, Controls(s, scores, moved)


def best_after(s: Sampling, ids, logits, k: int, seen, generated) -> tuple[np.ndarray, np.ndarray, Controls]:
    """The k best of the candidates ``ids`` after the controls (ties: the order given, best first
    before them). -> (ids (k,), logits after (k,), Controls of them)"""
    ids, before = np.asarray(ids, np.int64), np.asarray(logits, np.float64)
    after, moved = controls(s, ids, before, seen, generated)
    order = np.argsort(-after, kind="stable")[:k]
    return ids[order], after[order], Controls(s, before[order], moved[order])


def moved_names(mask: int) -> list[str]:
    """The controls of a ``moved`` bit mask, by name."""
    return [name for i, name in enumerate(CONTROLS) if int(mask) >> i & 1]


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
    """What to sample from (logits after the controls): softmax at s.temperature, kept to the s.top_k
    best (a no-op over top-k candidates), to the nucleus of mass s.top_p and to the tokens at least
    s.min_p times as likely as the best (as vLLM and transformers' MinPLogitsWarper), renormalised.
    min_p compares each to the best, which every candidate set holds: over the top k it keeps what
    it keeps over the whole vocabulary. (n,) -> (n,)"""
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
    if s.min_p > 0:
        p = np.where(p >= s.min_p * p.max(), p, 0.0)
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
