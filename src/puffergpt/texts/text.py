"""A text: what a user works on. Type, generate, look at the candidates, step back, take another candidate, cut.

A text drives any ``Run`` (numpy's or the searches': weights and a session, ``model/session.py``) through the one
forward pass in ``reference.py``. It remembers what the model has read, so that only positions the model has not
read cost requests:

- ``tokens[:length]`` is the text; tokens after ``length`` are kept after a step back (stepping back deletes
  nothing) and are dropped only when a new token replaces them;
- ``tokens[:read_upto]`` have been read: their keys are in the text's namespace, their values in ``cache``, their
  final hidden states in ``hidden`` (the query for the next token);
- ``steps[p]`` holds, for each generated position p, its candidates (at most ``KEEP_CANDIDATES``) and what they
  cost, and once asked (``texts/probabilities.py``) their probabilities over the whole vocabulary;
- ``kept[p]``: what a learning view computed from the token at p - 1 (an inspection, ``inspector.py``), for at
  most ``KEEP_VIEWS`` positions (the most recent), dropped when a token before p changes; others are recomputed;
- ``writes`` and ``written_by``: which read wrote each position's keys (the KV cache view).

Reading is batched: all unread tokens go through each matrix in one request (prefill).

Texts are opened two ways: ``Texts``, the open texts of one engine (the server's: a bound on how many, expiry when
idle, closing drops their keys), and ``opened``, a text of its own closed on any exit (a completion's, a test's).
A text another server held (one that went away) is reopened from what the page kept, its token ids and the
sampling of each generated position (``recompute.restore``): one prefill.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from puffergpt.model import sampling, tokenizer
from puffergpt.model.checkpoints import GPT2Config
from puffergpt.model.reference import NO_ABLATION, Ablation, Cache, Trace, forward
from puffergpt.model.sampling import Sampling, distribution, log_softmax, pick, probabilities
from puffergpt.model.session import Run

log = logging.getLogger("puffergpt")
KEEP_CANDIDATES = 100  # a step keeps this many candidates, whatever top_k was (the page shows 40)
KEEP_VIEWS = 32  # positions whose inspection a text keeps
TEXT_ID = re.compile(r"[0-9a-f]{12}")  # a text's id as a Text makes it (12 hex digits): callers check ids against it
MAX_PROMPT_IDS = 4096  # token ids a text may be given at once: more than any GPT-2's context


class TextError(ValueError):
    """An operation a text can't do as asked; the text is left as it was."""


class TextBusy(TextError):
    """The text is generating; it takes no other generation or edit until that ends."""


class TextNotFound(KeyError):
    """This server holds no such text (closed, expired, never opened here, or held by a server
    that went away): reopen it from its token ids (``Texts.reopen``)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def check_token_ids(ids, n_vocab: int) -> None:
    """The one check of token ids from outside: integers in the vocabulary."""
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < n_vocab:
            raise TextError(f"token id {t!r} is outside the vocabulary (0..{n_vocab - 1})")


def check_generation(c: GPT2Config, s: Sampling, length: int, n, limit: int | None = None) -> Sampling:
    """The one check of a generation request: n new tokens (at most ``limit``, a
    server's bound), sampling, the context."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise TextError(f"the number of new tokens must be an integer >= 0, got {n!r}")
    if limit is not None and n > limit:
        raise TextError(f"{n} new tokens is over this server's limit of {limit} a request: ask for fewer")
    try:
        s.check(c.n_vocab)
    except ValueError as e:
        raise TextError(str(e)) from None
    if length + n > c.n_ctx:
        raise TextError(f"{length + n} tokens ({length} read, {n} new) would not fit the model's context "
                        f"of {c.n_ctx} tokens")
    return s


def edit(method: Callable) -> Callable:
    """An edit of a text: made under its lock, and refused while it generates (``begin``)."""
    @functools.wraps(method)
    def run(self: Text, *args, **kwargs):
        with self.lock:
            if self.generating:
                raise TextBusy("this text is generating: stop it before you edit it")
            return method(self, *args, **kwargs)
    return run


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
    inspect: dict | None = None  # attention and lens, when the generation asked for them (``inspector.py``)
    # With the whole vocabulary scored (``full``): log sum exp of all n_vocab logits, so
    # a candidate's exact log-probability is logit - logz; and the chosen token's own.
    logz: float | None = None
    logprob: float | None = None
    normalisers: dict[float, float] | None = None  # {T: n_T} over all n_vocab (``probabilities.py``): p_all
    controls: sampling.Controls | None = None  # penalties, logit_bias: ``logits`` are after them, these before

    def logprobs(self, k: int) -> list[tuple[int, float]]:
        """The k best tokens and their exact log-probabilities (needs ``logz``)."""
        return [(int(i), float(l) - self.logz) for i, l in zip(self.ids[:k], self.logits[:k], strict=True)]

    @property
    def text(self) -> str:
        return tokenizer.token_text(self.token_id)

    def candidates(self, temperature: float | None = None) -> list[dict]:
        t = self.temperature if temperature is None else temperature
        probs, n = probabilities(self.logits, t), self.normalisers  # the sampler's: over these candidates
        return [{"token_id": int(i), "text": tokenizer.token_text(int(i)), "logit": float(l), "prob": float(p)}
                | ({} if n is None else {"p_all": sampling.probability_over_all(l, n, 1.0)}
                   | ({"p_all_t": sampling.probability_over_all(l, n, t)} if float(t) in n else {}))
                | ({} if self.controls is None else self.controls.of(r))
                for r, (i, l, p) in enumerate(zip(self.ids, self.logits, probs, strict=True))]


class Text:
    def __init__(self, run: Run, text_id: str | None = None, ablation: Ablation = NO_ABLATION):
        """``run``: the text's own weights and session; ``ablation``: parts switched off for all it reads."""
        self.id = text_id or uuid.uuid4().hex[:12]  # what TEXT_ID matches
        self.weights, self.session = run.weights, run.session
        self.ablation = ablation
        self.config = run.weights.config
        self.tokens: list[int] = []
        self.length = 0
        self.read_upto = 0
        self.cache = Cache()
        self.hidden: list[np.ndarray] = []
        self.steps: dict[int, Step] = {}
        self.kept: OrderedDict[int, dict] = OrderedDict()  # position -> a view of it (``keep``)
        self.writes: list[dict] = []  # each read: {"batch", "phase", "start", "end", "requests"}
        self.written_by: dict[int, dict] = {}  # position -> {"phase", "step", "batch"}
        self.lock = threading.RLock()
        self.generating = False  # claimed by begin(), for callers that generate from another thread
        self.stopping = threading.Event()  # a user's Stop: the generation ends at its next token
        self.last_used = time.monotonic()

    @property
    def text(self) -> list[int]:
        return self.tokens[: self.length]

    # --- checks: every operation validates before it changes anything ---
    def check_tokens(self, ids: list[int], extra: int = 0, at: int | None = None) -> None:
        check_token_ids(ids, self.config.n_vocab)
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
            for q in [q for q in self.kept if q > self.read_upto]:  # its query's token changed
                del self.kept[q]
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

    @edit
    def append(self, ids: list[int]) -> None:
        """Add the user's tokens at the end of the text (they are read when needed)."""
        self.check_tokens(ids)
        self._replace_from(self.length, list(map(int, ids)))

    @edit
    def step_back(self, p: int) -> None:
        """Make the text tokens[:p]; later tokens stay known, and nothing is deleted."""
        self.length = self._position(p, 1, self.length, "step back")

    @edit
    def step_forward(self, p: int) -> None:
        """Return to a longer text after a step back; costs nothing the model has read."""
        self.length = self._position(p, self.length, len(self.tokens), "step forward")

    @edit
    def cut(self, p: int) -> None:
        """Drop every token from position p on."""
        p = self._position(p, 1, self.length, "cut")
        self._replace_from(p, [])

    @edit
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

    def used(self) -> bool:
        """The text is in use now: its idle clock starts again and its keys are kept from other
        servers' sweeps. False when they may be gone already (``Session.touch``)."""
        self.last_used = time.monotonic()
        return self.session.touch()

    def begin(self) -> threading.Event:
        """Claim the text for one generation (the server does, before it streams); no edit
        or other generation until ``end``. -> the event a Stop sets (``stop``), cleared:
        the generation checks it between tokens."""
        with self.lock:
            if self.generating:
                raise TextBusy("this text is generating: stop it or wait for it to end")
            self.generating = True
            self.stopping.clear()
            return self.stopping

    def stop(self) -> None:
        """Ask the running generation, if any, to end at its next token."""
        self.stopping.set()

    def end(self) -> None:
        self.generating = False

    # --- reading and writing: these cost requests ---
    def read(self) -> int:
        """Read every unread token now, in one prefill; how many were read."""
        with self.lock:
            return self._read()

    def _read(self, trace: Trace | None = None) -> int:
        """Read every unread token of the text in one batched forward; how many were read."""
        n = self.length - self.read_upto
        if n > 0:
            start = self.read_upto
            with self.session.recording() as requests:
                h = forward(self.weights, np.asarray(self.tokens[start: self.length]), start, self.cache, trace,
                            self.ablation)
            self.hidden[start:] = list(h)
            self.read_upto = self.length
            users = any(q not in self.steps for q in range(start, self.length))  # not all the model's own tokens
            batch = len(self.writes)
            self.writes.append({"batch": batch, "phase": "prefill" if users else "decode", "start": start,
                                "end": self.length, "requests": len(requests)})
            for q in range(start, self.length):
                self.written_by[q] = {"phase": self.writes[-1]["phase"], "step": self.length, "batch": batch}
        return n

    def hidden_at(self, q: int) -> np.ndarray:
        """The final hidden state at position q (after ln_f), whose output predicts q + 1: the
        text read first where it must (a request). The caller holds the lock. -> (C,)"""
        if not 0 <= q < self.length:
            raise TextError(f"position {q} is not in the text (0 to {self.length - 1})")
        if self.read_upto <= q:
            self._read()
        return self.hidden[q]

    def _candidates(self, k: int, trace: Trace | None = None, p: int | None = None) -> tuple[np.ndarray, ...]:
        """Top-k at p (default: the end of the text), replayed from an earlier step when it can be (one the
        controls did not reorder). -> (ids, logits, tokens read)"""
        p = self.length if p is None else p
        old = self.steps.get(p)
        if old is not None and old.controls is None and len(old.ids) >= k:
            return old.ids[:k], old.logits[:k], 0
        read = 0
        if self.read_upto < p:
            read = self._read(trace)
        ids, logits = self.weights.top_k(self.hidden[p - 1], k)
        return np.asarray(ids), np.asarray(logits, np.float64), read

    def history(self, p: int) -> tuple[list[int], list[int]]:
        """The controls' look back from p: every token before it, and those the model generated."""
        return self.tokens[:p], [self.tokens[q] for q in range(p) if q in self.steps]

    def candidates(self, p: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k best candidates for position p (1..length): the step's own where it kept k, else
        one top-k search from the hidden state at p - 1 (the text read up to it first).
        -> (ids (k,), logits (k,)), best first"""
        with self.lock:
            return self._candidates(k, p=self._position(p, 1, self.length, "candidates"))[:2]

    def _all_logits(self, q: int, trace: Trace | None = None) -> tuple[np.ndarray, int]:
        """Every token's score at position q (from the hidden state at q - 1): one search
        over all of wte, reading the text first if needed. -> ((V,) float64, tokens read)"""
        read = self._read(trace) if self.read_upto < q else 0
        return np.asarray(self.weights.logits(self.hidden[q - 1]), np.float64), read

    def score_prompt(self) -> Iterator[Step]:
        """The text's own tokens scored as the model predicts them (OpenAI's ``echo``):
        a read, then one all-vocabulary search a position from 1 on; position 0 has no
        prediction (logprob None). Keeps KEEP_CANDIDATES a position, never all V scores."""
        for q in range(self.length):
            with self.lock, self.session.recording() as requests:
                t0, tok = time.perf_counter(), self.tokens[q]
                if q == 0:
                    read = self._read() if self.read_upto < 1 else 0
                    step = Step(0, tok, np.zeros(0, np.int64), np.zeros(0), 1.0, read=read, phase="prompt")
                else:
                    full, read = self._all_logits(q)
                    step = self._full_step(q, tok, full, 1.0, read, "prompt")
                step.requests, step.ms = requests, (time.perf_counter() - t0) * 1e3
            yield step

    @staticmethod
    def _full_step(p: int, tok: int, full: np.ndarray, temperature: float, read: int, phase: str) -> Step:
        """A step from the whole vocabulary's scores (V,): the best KEEP_CANDIDATES and
        the normaliser; the V scores themselves are dropped with the step's request."""
        full, logz = log_softmax(full)
        best = np.argpartition(-full, KEEP_CANDIDATES)[:KEEP_CANDIDATES]
        best = best[np.argsort(-full[best], kind="stable")]
        return Step(p, tok, best.astype(np.int64), full[best], temperature, read=read, phase=phase,
                    logz=logz, logprob=float(full[tok]) - logz)

    def keep(self, p: int, view: dict) -> None:
        """Keep a view of position p (an inspection) while the tokens before p stay."""
        self.kept[p] = view
        self.kept.move_to_end(p)
        while len(self.kept) > KEEP_VIEWS:
            self.kept.popitem(last=False)

    def trace(self, p: int) -> Trace:
        """What reading the token at p - 1 shows (``reference.Trace``), read again over a copy
        of the cache, so the text's own cache and keys stay as they are (its key is rewritten
        as it was): the requests of one token. The lock held by the caller."""
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 1 <= p <= self.read_upto:
            raise TextError(f"inspect: position {p!r} is outside 1..{self.read_upto} "
                            f"(the positions whose previous token the model has read)")
        trace = Trace()
        cache = Cache([v[:, : p - 1].copy() for v in self.cache.values])
        forward(self.weights, np.asarray([self.tokens[p - 1]]), p - 1, cache, trace, self.ablation)
        return trace

    def generate(self, n: int, s: Sampling, should_stop: Callable[[], bool] | None = None, full: bool = False,
                 observe: Callable[[Step, Trace | None], None] | None = None) -> Iterator[Step]:
        """Write up to n tokens at the end of the text, stopping at <|endoftext|> or when
        should_stop() says so (checked before each token; the text stays consistent).
        ``full`` (implied by top_p < 1) scores the whole vocabulary each token, one search
        (``wte.all``): sampling then uses the exact distribution, and the step has ``logz``.
        ``observe(step, trace)`` runs after each token, inside its lock and its requests, with
        what the read showed of the token (None when the step was replayed): the inspector's
        lens and attribution (``inspector.generate``)."""
        check_generation(self.config, s, self.length, n)
        full = full or s.top_p < 1
        if self.length == 0:
            raise TextError("the text is empty: give at least one token")
        rng = np.random.default_rng(s.seed)
        with self.session.slot(should_stop) as turn:  # other texts may be generating: wait for a turn
            for _ in range(n if turn else 0):
                if should_stop is not None and should_stop():
                    return
                with self.lock, self.session.stepping():
                    step = self._next(s, rng, full, observe)
                    tok = step.token_id
                self.session.wrote_token()
                yield step
                if tok == tokenizer.EOT:
                    return

    def _next(self, s: Sampling, rng: np.random.Generator, full: bool,
              observe: Callable[[Step, Trace | None], None] | None) -> Step:
        """One token written at the end of the text (the lock held): chosen, recorded as a
        step, and observed when asked."""
        if self.length >= self.config.n_ctx:  # an edit from elsewhere may have filled it
            raise TextError(f"the text has reached the model's context of {self.config.n_ctx} tokens")
        t0, first, p = time.perf_counter(), self.read_upto, self.length
        trace = Trace() if observe is not None else None
        with self.session.recording() as requests:
            ids, logits, read, tok, whole, controls = self._choose(p, s, rng, full, trace)
            users = read and any(q not in self.steps for q in range(first, first + read))  # not the model's own
            step = Step(p, tok, ids[:KEEP_CANDIDATES], logits[:KEEP_CANDIDATES], s.temperature, requests, 0.0, read,
                        "prefill" if users else "decode")
            if whole is not None:
                step.logz, step.logprob = whole.logz, whole.logprob
            step.controls = controls and controls.at(slice(0, KEEP_CANDIDATES))
            self._set(p, tok)
            self.steps[p] = step
            if observe is not None:
                observe(step, trace if read else None)
        step.ms = (time.perf_counter() - t0) * 1e3
        self.used()
        return step

    def _choose(self, p: int, s: Sampling, rng: np.random.Generator, full: bool, trace: Trace | None,
                keep: int = KEEP_CANDIDATES) -> tuple:
        """The candidates at p after the sampling's controls, the tokens read to get them, and the token picked: from
        the whole vocabulary (``full``: the exact distribution; the step it returns holds the normaliser; the (V,)
        scores are dropped here) or the top k the sampling needs (greedy: the ``keep`` a step holds, whatever top_k;
        ``sampling.exact_top_k``). -> (ids, logits, tokens read, token, the whole vocabulary's step, Controls|None)"""
        if full:
            scores, read = self._all_logits(p, trace)
            scores, controls = sampling.controlled(s, scores, *self.history(p))
            tok = pick(distribution(scores, s), rng)
            whole = self._full_step(p, tok, scores, s.temperature, read, "decode")
            return whole.ids, whole.logits, read, tok, whole, controls and controls.at(whole.ids)
        read, w = self._read(trace) if self.read_upto < p else 0, self.weights
        ids, logits, controls = sampling.exact_top_k(s, s.search_k(keep), self.config.n_vocab, *self.history(p),
                                                     lambda n: self._candidates(n)[:2], lambda t: w.token_logits(
                                                         self.hidden[p - 1], t), lambda: w.logits(self.hidden[p - 1]))
        return ids, logits, read, int(ids[pick(distribution(logits, s), rng)]), None, controls

    def close(self) -> None:
        self.session.close()


@contextlib.contextmanager
def opened(open_run: Callable[[], Run], ids: list[int] = (), ablation: Ablation = NO_ABLATION) -> Iterator[Text]:
    """A text of its own, closed (and its namespace of keys dropped) however the block ends; with an
    ``ablation``, read with those parts of the model switched off."""
    text = Text(open_run(), ablation=ablation)
    try:
        if ids:
            text.append(list(ids))
        yield text
    finally:
        text.close()
