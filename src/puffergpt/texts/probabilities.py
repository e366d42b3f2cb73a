"""Every candidate's probability over the whole vocabulary, the model's own, beside the sampler's.

A step's candidates come from a top-k search, and the sampler's probabilities (``Step.candidates``'s "prob") are
a softmax over those k alone. The model's own probability of a token is a softmax over all n_vocab logits: its
normaliser needs every one, so it is one more search, over every wte row (``wte.all``), from the hidden state that
made the step, counted in the request log like every search and marked extra (the token did not need it). It is
asked for once a step (``normalise``: the page, when a learner opens a step's candidates) or for every step of a
generation (``normalised``: ``generate --json``). The step keeps the normaliser at T = 1, at its own temperature
and at each of the page's slider's (``sampling.normalisers``), never the (V,) scores.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from puffergpt.model import sampling
from puffergpt.texts.text import Step, Text, TextError


def keep(step: Step, scores: np.ndarray) -> None:
    """Keep on ``step`` the whole vocabulary's normalisers from its scores (V,), and so its exact
    log-probabilities (``logz``, the chosen token's ``logprob``)."""
    scores = np.asarray(scores, np.float64)
    step.normalisers = sampling.normalisers(scores, {1.0, step.temperature, *sampling.SLIDER})
    step.logz = step.normalisers[1.0]
    step.logprob = float(scores[step.token_id]) - step.logz


def normalise(text: Text, p: int) -> list:
    """Step p's candidates' probabilities over the whole vocabulary: one search over every wte row from
    the hidden state at p - 1, marked extra; nothing when the step has them. -> the requests it cost"""
    with text.lock:
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or not 1 <= p < len(text.tokens):
            raise TextError(f"probabilities: position {p!r} is outside 1..{len(text.tokens) - 1}")
        step = text.steps.get(int(p))
        if step is None:
            raise TextError(f"probabilities: position {p} has no candidates (the model did not generate it)")
        if p > text.read_upto:
            raise TextError(f"probabilities: position {p}'s hidden state is not read yet: generate first")
        with text.session.recording(extra=True) as requests:
            if step.normalisers is None:  # over the logits the step chose from: after its controls, if any
                scores = text.weights.logits(text.hidden[p - 1])
                keep(step, scores if step.controls is None else
                     sampling.controlled(step.controls.sampling, scores, *text.history(p))[0])
        return requests


def normalised(text: Text, steps: Iterator[Step]) -> Iterator[Step]:
    """Each step of a generation with its probabilities over the whole vocabulary, the search that
    gave them added to the step's requests (and its time to the step's)."""
    for step in steps:
        t0 = time.perf_counter()
        step.requests += normalise(text, step.position)
        step.ms += (time.perf_counter() - t0) * 1e3
        yield step
