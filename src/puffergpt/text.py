"""A text: the tokens read so far and the loop that writes new ones.

A text drives any ``Products`` (numpy or searches) through the one forward pass
in ``reference.py``. It reads a prompt in one batched forward (prefill), then
decodes a token at a time, sampling from the top-k candidates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from puffergpt import tokenizer
from puffergpt.reference import Cache, Products, forward
from puffergpt.sampling import Sampling, pick, probabilities


@dataclass
class Step:
    """One generated token, with what it cost."""

    position: int
    token_id: int
    candidates: list[dict]  # {"token_id", "text", "logit", "prob"}, best first
    requests: list[dict] = field(default_factory=list)  # the searches that produced it
    ms: float = 0.0

    @property
    def text(self) -> str:
        return tokenizer.token_text(self.token_id)

    def to_json(self) -> dict:
        return {"position": self.position, "token_id": self.token_id, "text": self.text,
                "candidates": self.candidates, "requests": len(self.requests), "ms": round(self.ms, 3)}


class Text:
    def __init__(self, products: Products):
        self.products = products
        self.config = products.config
        self.tokens: list[int] = []
        self.cache = Cache()
        self.read_upto = 0  # positions < read_upto are in the cache
        self.prefill: dict = {}

    def _log(self) -> list[dict]:
        return getattr(self.products, "log", [])

    def check_tokens(self, ids: list[int], extra: int = 0) -> None:
        if any(not 0 <= t < self.config.n_vocab for t in ids):
            bad = next(t for t in ids if not 0 <= t < self.config.n_vocab)
            raise ValueError(f"token id {bad} is outside the vocabulary (0..{self.config.n_vocab - 1})")
        n = len(self.tokens) + len(ids) + extra
        if n > self.config.n_ctx:
            raise ValueError(f"{n} tokens would not fit the model's context of {self.config.n_ctx} tokens")

    def read(self, ids: list[int]) -> np.ndarray:
        """Append tokens and read them in one batched forward; the last hidden state (C,)."""
        self.check_tokens(ids)
        self.tokens += ids
        h = forward(self.products, np.asarray(self.tokens[self.read_upto:]), self.read_upto, self.cache)
        self.read_upto = len(self.tokens)
        return h[-1]

    def candidates(self, h: np.ndarray, s: Sampling) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids, logits = self.products.top_k(h, s.top_k)
        return ids, logits, probabilities(logits, s.temperature)

    def generate(self, prompt: list[int], n: int, s: Sampling) -> Iterator[Step]:
        """Read the prompt, then write up to n tokens (stopping at <|endoftext|>)."""
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        if n < 0:
            raise ValueError(f"the number of new tokens must be >= 0, got {n}")
        s.check(self.config.n_vocab)
        self.check_tokens(prompt, extra=n)
        rng = np.random.default_rng(s.seed)
        log0, t0 = len(self._log()), time.perf_counter()
        h = self.read(prompt)
        self.prefill = {"tokens": len(prompt), "requests": self._log()[log0:], "ms": 0.0}
        for i in range(n):
            ids, logits, probs = self.candidates(h, s)  # the last prefill/decode step's top-k
            if i == 0:
                self.prefill["ms"] = (time.perf_counter() - t0) * 1e3
            choice = pick(probs, rng)
            tok = int(ids[choice])
            cands = [{"token_id": int(t), "text": tokenizer.token_text(int(t)), "logit": float(l), "prob": float(p)}
                     for t, l, p in zip(ids, logits, probs)]
            step = Step(len(self.tokens), tok, cands, self._log()[log0:], (time.perf_counter() - t0) * 1e3)
            yield step
            if tok == tokenizer.EOT:
                return
            log0, t0 = len(self._log()), time.perf_counter()
            if i + 1 < n:
                h = self.read([tok])
            else:
                self.tokens.append(tok)  # written but not yet read by the model
