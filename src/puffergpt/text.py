"""Texts: what a user works on. Type, generate, look at the candidates, step back,
take another candidate, cut.

A text drives any ``Products`` (numpy or searches) through the one forward pass in
``reference.py``. It remembers what the model has read, so that only positions the
model has not read cost requests:

- ``tokens[:length]`` is the text; tokens after ``length`` are kept after a step back
  (stepping back deletes nothing) and are dropped only when a new token replaces them;
- ``tokens[:read_upto]`` have been read: their keys are in the text's namespace, their
  values in ``cache``, their final hidden states in ``hidden`` (the query for the next token);
- ``steps[p]`` holds, for each generated position p, its candidates and what they cost.

Reading is batched: all unread tokens go through each matrix in one request (prefill).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from puffergpt import tokenizer
from puffergpt.reference import Cache, Products, forward
from puffergpt.sampling import Sampling, pick, probabilities


log = logging.getLogger("puffergpt")


class TextError(ValueError):
    """An operation a text can't do as asked; the text is left as it was."""


class TextBusy(TextError):
    """The text is generating; it takes no other generation or edit until that ends."""


@dataclass
class Step:
    """One generated position: the candidates it was chosen from, and what it cost."""

    position: int
    token_id: int
    ids: np.ndarray  # candidate token ids, best first
    logits: np.ndarray  # their scores, as the search returned them
    temperature: float
    requests: list = field(default_factory=list)  # the requests that produced it, in order
    ms: float = 0.0
    read: int = 0  # tokens the model read for it: many for a prefill, 1 for a decode, 0 if replayed
    phase: str = "decode"  # "prefill" when it read the user's tokens (a prompt, appended text)

    @property
    def text(self) -> str:
        return tokenizer.token_text(self.token_id)

    def candidates(self, temperature: float | None = None) -> list[dict]:
        t = self.temperature if temperature is None else temperature
        probs = probabilities(self.logits, t)
        return [{"token_id": int(i), "text": tokenizer.token_text(int(i)), "logit": float(l), "prob": float(p)}
                for i, l, p in zip(self.ids, self.logits, probs)]

    def to_json(self) -> dict:
        return {"position": self.position, "token_id": self.token_id, "text": self.text,
                "candidates": self.candidates(), "requests": len(self.requests), "ms": round(self.ms, 3)}


class Text:
    def __init__(self, products: Products, text_id: str | None = None):
        self.id = text_id or uuid.uuid4().hex[:12]
        self.products = products
        self.config = products.config
        self.tokens: list[int] = []
        self.length = 0
        self.read_upto = 0
        self.cache = Cache()
        self.hidden: list[np.ndarray] = []
        self.steps: dict[int, Step] = {}
        self.lock = threading.RLock()
        self.generating = False  # claimed by begin(), for callers that generate from another thread
        self.last_used = time.monotonic()

    # --- what it costs ---
    def _log(self) -> list:
        return getattr(self.products, "log", [])

    @property
    def text(self) -> list[int]:
        return self.tokens[: self.length]

    # --- checks: every operation validates before it changes anything ---
    def check_tokens(self, ids: list[int], extra: int = 0, at: int | None = None) -> None:
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < self.config.n_vocab:
                raise TextError(f"token id {t!r} is outside the vocabulary (0..{self.config.n_vocab - 1})")
        n = (self.length if at is None else at) + len(ids) + extra
        if n > self.config.n_ctx:
            raise TextError(f"{n} tokens would not fit the model's context of {self.config.n_ctx} tokens")

    def _position(self, p, lo: int, hi: int, what: str) -> int:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)):
            raise TextError(f"{what}: position must be an integer, got {p!r}")
        if not lo <= p <= hi:
            raise TextError(f"{what}: position {p} is outside {lo}..{hi} (the text has {self.length} tokens)")
        return int(p)

    # --- editing: none of these costs a request ---
    def _replace_from(self, p: int, new: list[int]) -> None:
        """tokens[p:] = new; forget what was read or generated from the first change on."""
        old = self.tokens[p:]
        same = 0
        while same < min(len(old), len(new)) and old[same] == new[same]:
            same += 1
        first = p + same  # the first position whose token changes or goes
        self.tokens = self.tokens[:p] + new
        self.length = len(self.tokens)
        if same < max(len(old), len(new)):
            self.read_upto = min(self.read_upto, first)
            del self.hidden[self.read_upto:]
            # A step's candidates depend only on the tokens before it, so the step at
            # `first` survives, with the token now there.
            self.steps = {q: st for q, st in self.steps.items() if q <= first}
            if first in self.steps and first < self.length:
                self.steps[first].token_id = self.tokens[first]

    def _set(self, p: int, tok: int) -> None:
        """Put tok at position p, the end of the text. The same token as one kept after
        a step back keeps everything known after it, so a replay is free."""
        if p < len(self.tokens) and self.tokens[p] == tok:
            self.length = p + 1
        else:
            self._replace_from(p, [tok])

    def append(self, ids: list[int]) -> None:
        """Add the user's tokens at the end of the text (they are read when needed)."""
        self.check_tokens(ids)
        self._replace_from(self.length, list(map(int, ids)))

    def step_back(self, p: int) -> None:
        """Make the text tokens[:p]; later tokens stay known, and nothing is deleted."""
        self.length = self._position(p, 1, self.length, "step back")

    def step_forward(self, p: int) -> None:
        """Return to a longer text after a step back; costs nothing the model has read."""
        self.length = self._position(p, self.length, len(self.tokens), "step forward")

    def cut(self, p: int) -> None:
        """Drop every token from position p on."""
        p = self._position(p, 1, self.length, "cut")
        self._replace_from(p, [])

    def branch(self, p: int, token_id: int | None = None, rank: int | None = None) -> None:
        """Put another token at position p: a token id, or the candidate of that rank at p."""
        p = self._position(p, 1, self.length, "branch")
        if (token_id is None) == (rank is None):
            raise TextError("branch: give a token id or a candidate rank, not both or neither")
        if rank is not None:
            if p not in self.steps:
                raise TextError(f"branch: position {p} has no candidates (it was not generated)")
            ids = self.steps[p].ids
            if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < len(ids):
                raise TextError(f"branch: candidate rank {rank!r} is outside 0..{len(ids) - 1}")
            token_id = int(ids[rank])
        self.check_tokens([token_id], at=p)
        self._set(p, int(token_id))

    def begin(self) -> None:
        """Claim the text for one generation (the server does, before it streams)."""
        with self.lock:
            if self.generating:
                raise TextBusy("this text is generating: stop it or wait for it to end")
            self.generating = True

    def end(self) -> None:
        self.generating = False

    # --- reading and writing: these cost requests ---
    def _read(self) -> int:
        """Read every unread token of the text in one batched forward; how many were read."""
        n = self.length - self.read_upto
        if n > 0:
            h = forward(self.products, np.asarray(self.tokens[self.read_upto: self.length]), self.read_upto, self.cache)
            self.hidden[self.read_upto:] = list(h)
            self.read_upto = self.length
        return n

    def _candidates(self, k: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Top-k at the end of the text: replayed from an earlier step when it can be."""
        p = self.length
        old = self.steps.get(p)
        if old is not None and len(old.ids) >= k:
            return old.ids[:k], old.logits[:k], 0
        read = 0
        if self.read_upto < p:
            read = self._read()
        ids, logits = self.products.top_k(self.hidden[p - 1], k)
        return np.asarray(ids), np.asarray(logits, np.float64), read

    def generate(self, n: int, s: Sampling, should_stop: Callable[[], bool] | None = None) -> Iterator[Step]:
        """Write up to n tokens at the end of the text, stopping at <|endoftext|> or when
        should_stop() says so (checked before each token; the text stays consistent)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise TextError(f"the number of new tokens must be an integer >= 0, got {n!r}")
        s.check(self.config.n_vocab)
        if self.length == 0:
            raise TextError("the text is empty: give at least one token")
        self.check_tokens([], extra=n)
        rng = np.random.default_rng(s.seed)
        for _ in range(n):
            if should_stop is not None and should_stop():
                return
            with self.lock:
                if self.length >= self.config.n_ctx:  # an edit from elsewhere may have filled it
                    raise TextError(f"the text has reached the model's context of {self.config.n_ctx} tokens")
                log0, t0, first = len(self._log()), time.perf_counter(), self.read_upto
                ids, logits, read = self._candidates(s.top_k)
                tok = int(ids[pick(probabilities(logits, s.temperature), rng)])
                p = self.length
                users = read and any(q not in self.steps for q in range(first, first + read))  # not the model's own
                step = Step(p, tok, ids, logits, s.temperature, list(self._log()[log0:]),
                            (time.perf_counter() - t0) * 1e3, read, "prefill" if users else "decode")
                self._set(p, tok)
                self.steps[p] = step
                self.last_used = time.monotonic()
            yield step
            if tok == tokenizer.EOT:
                return

    def close(self) -> None:
        close = getattr(self.products, "close", None)
        if close:
            close()


class Texts:
    """The open texts of one engine: a bound on how many, and expiry when idle."""

    def __init__(self, open_products: Callable[[], Products], max_open: int = 32, idle_s: float = 1800):
        self.open_products = open_products
        self.max_open = max_open
        self.idle_s = idle_s
        self._texts: dict[str, Text] = {}
        self._lock = threading.Lock()

    def create(self, ids: list[int]) -> Text:
        self.expire()
        with self._lock:
            if len(self._texts) >= self.max_open:
                raise TextError(f"{self.max_open} texts are open already: close one first")
            self._texts[placeholder := f"opening-{uuid.uuid4().hex}"] = None  # holds the place while it opens
        try:
            text = Text(self.open_products())  # store I/O: outside the registry's lock
        finally:
            with self._lock:
                self._texts.pop(placeholder, None)
        with self._lock:
            self._texts[text.id] = text
        try:
            text.append(ids)
        except TextError:
            self.close(text.id)
            raise
        return text

    def get(self, text_id: str) -> Text:
        with self._lock:
            text = self._texts.get(text_id) if not text_id.startswith("opening-") else None
        if text is None:
            raise KeyError(f"no open text {text_id!r} (closed, expired, or never opened)")
        text.last_used = time.monotonic()
        return text

    def close(self, text_id: str) -> None:
        with self._lock:
            text = self._texts.get(text_id)
        if text is None:
            raise KeyError(f"no open text {text_id!r} (closed, expired, or never opened)")
        with text.lock:
            text.close()  # if dropping its namespace fails, the text stays listed, to close again
        with self._lock:
            self._texts.pop(text_id, None)

    def expire(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        with self._lock:
            old = [i for i, t in self._texts.items() if t is not None and now - t.last_used > self.idle_s]
        closed = []
        for i in old:
            try:
                self.close(i)
                closed.append(i)
            except Exception as e:  # one text that can't close must not keep the others open
                log.warning("could not close idle text %s: %s", i, e)
        return closed

    def __len__(self) -> int:
        return len(self._texts)

    def close_all(self) -> None:
        for i in [i for i, t in list(self._texts.items()) if t is not None]:
            try:
                self.close(i)
            except Exception as e:
                log.warning("could not close text %s: %s", i, e)
