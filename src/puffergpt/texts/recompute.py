"""A step's candidates computed again where the text did not generate them: a text another server held,
reopened here from what the page kept (``restore``), and an insight's token replayed (``best_at``).

The candidates a generated step holds are the top k after its sampling's controls (penalties, logit_bias:
``sampling.exact_top_k``), and the penalties look back at the text: every token before the position
(``repetition_penalty``) and those the model generated (``presence_penalty``, ``frequency_penalty``). So
computing them again needs, for each position, the sampling it was generated with and which of the positions
before it the model generated: without them a reopened step would show candidates the learner never saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from puffergpt.model import sampling
from puffergpt.model.sampling import Controls, Sampling
from puffergpt.texts.text import KEEP_CANDIDATES, Step, Text, TextError, edit


def looked_back(tokens: list[int], p: int, generated: Iterable[int]) -> tuple[list[int], list[int]]:
    """What the controls look back at from p (``Text.history``) where the generated positions are given:
    every token before p, and those at the generated positions before p."""
    return tokens[:p], [tokens[q] for q in sorted(generated) if q < p]


def _after(text: Text, p: int, s: Sampling, k: int, back: tuple[list[int], list[int]],
           top_k: Callable[[int], tuple]) -> tuple[np.ndarray, np.ndarray, Controls | None]:
    """The k best at p after s's controls, from ``top_k(n)``: the n best before them (the lock held, read)."""
    w, h = text.weights, text.hidden[p - 1]
    return sampling.exact_top_k(s, k, text.config.n_vocab, *back, top_k, lambda t: w.token_logits(h, t),
                                lambda: w.logits(h))


def best_at(text: Text, p: int, k: int, s: Sampling, generated: Iterable[int] = ()) -> tuple:
    """The k best candidates for position p after s's controls, the model having generated the positions
    ``generated`` before p: one top-k search (and one restricted to the tokens a control may raise), the text
    read up to p first. -> (ids (k,), logits after (k,), Controls or None)"""
    with text.lock:
        text.hidden_at(p - 1)  # read first where it must be
        h = text.hidden[p - 1]
        return _after(text, p, s, k, looked_back(text.tokens, p, generated), lambda n: text.weights.top_k(h, n))


def _checked(ids: list[int], length, generated: dict[int, Sampling], n_vocab: int) -> None:
    n = len(ids)
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or not 1 <= length <= n:
        raise TextError(f"reopen: length {length!r} is outside 1..{n} (the token ids given)")
    for p, s in generated.items():
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 1 <= p < n:
            raise TextError(f"reopen: generated position {p!r} is outside 1..{n - 1}")
        t = s.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
            raise TextError(f"reopen: the temperature at position {p} must be a number >= 0, got {t!r}")
        try:
            s.check(n_vocab)
        except ValueError as e:
            raise TextError(f"reopen: the sampling at position {p}: {e}") from None


@edit
def restore(text: Text, ids: list[int], length: int, generated: dict[int, Sampling]) -> list:
    """Make this new, empty text the one another server held, from what the page kept of it: its known
    tokens ``ids`` (the first ``length`` are the text, the rest stepped back from), all read in one prefill,
    and the candidates of each generated position (``generated``: position -> the sampling it was generated
    with: its temperature and controls) recomputed from the hidden states the prefill leaves, in one top-k
    search (and one restricted search a position whose controls may raise a token). -> the requests it cost"""
    if text.tokens:
        raise TextError("reopen: only a new, empty text can be reopened")
    text.check_tokens(ids)
    _checked(ids, length, generated, text.config.n_vocab)
    text._replace_from(0, list(map(int, ids)))
    with text.session.recording() as requests:
        text._read()
        _recompute(text, generated)
    text.length = int(length)
    return requests


def _recompute(text: Text, generated: dict[int, Sampling]) -> None:
    """Steps for positions another server generated: their candidates after their controls, from one
    top-k search a query a position, deep enough for every position's controls (the lock held, read)."""
    ps = sorted(generated)
    if not ps:
        return
    back = {p: looked_back(text.tokens, p, ps) for p in ps}
    need = [sampling.search_size(KEEP_CANDIDATES, generated[p].touched(*back[p])[0]) if generated[p].controlled
            else KEEP_CANDIDATES for p in ps]
    x = np.stack([text.hidden[p - 1] for p in ps])  # (n, C): the hidden state that predicts each
    got = text.weights.top_k_many(x, min(max(need), text.config.n_vocab), kind="wte.top_k")
    for p, (ids, logits) in zip(ps, got, strict=True):
        ids, logits = np.asarray(ids), np.asarray(logits, np.float64)
        ids, logits, controls = _after(text, p, generated[p], KEEP_CANDIDATES, back[p],
                                       lambda n, ids=ids, logits=logits: (ids[:n], logits[:n]))
        text.steps[p] = Step(p, text.tokens[p], np.asarray(ids), np.asarray(logits, np.float64),
                             float(generated[p].temperature), phase="reopened", controls=controls)
