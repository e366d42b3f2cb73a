"""What a lesson's checks run on (``Lab``), and the registry of checks (``check``).

A lesson (``lessons.py``) is data: steps, each naming a check. A check is a function here
by name, ``check(lab, **args) -> {"claim", "holds", "evidence"}``: it computes its evidence from
the model in front of it, on the learner's prompt, and fills its claim from the numbers; it
never returns a canned sentence. When the claim does not hold, it says so and why. The checks
themselves are in ``lesson_checks.py``.

Every forward pass a check makes runs in a run of its own (``Lab.opened``), in a turn among
the texts generating, and its requests are counted and marked extra.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import numpy as np

from puffergpt.model.checkpoints import GPT2Config
from puffergpt.model.reference import NO_ABLATION, Ablation, Cache, Trace, Weights, forward
from puffergpt.model.session import Run
from puffergpt.model.tokenizer import token_dict

CHECKS: dict[str, Callable[..., dict]] = {}


def check(name: str) -> Callable:
    """Register a check by the name a lesson's step gives it."""
    def register(fn: Callable[..., dict]) -> Callable[..., dict]:
        CHECKS[name] = fn
        return fn
    return register


def verdict(claim: str, holds: bool, **evidence) -> dict:
    return {"claim": claim, "holds": bool(holds), "evidence": evidence}


def tok(i: int) -> dict:
    return token_dict(int(i))


def say(i: int) -> str:
    """A token as a claim quotes it: its text in quotes, spaces and new lines seen."""
    return repr(token_dict(int(i))["text"])


class Lab:
    """The learner's prompt and the model: what the checks share. ``found`` carries what an
    earlier step found (the copying head) to the later ones; ``requests`` every request made."""

    def __init__(self, open_run: Callable[[], Run], config: GPT2Config, prompt: str, ids: list[int]):
        self.open_run, self.config, self.prompt, self.ids = open_run, config, prompt, list(ids)
        self.found: dict = {}
        self.requests: list = []
        self._final: tuple[Trace, np.ndarray] | None = None

    @contextlib.contextmanager
    def opened(self) -> Iterator[Weights]:
        """The weights of a run of their own, in a turn among the texts generating, their requests counted."""
        run = self.open_run()
        session = run.session
        try:
            with session.slot(), session.stepping(), session.recording(extra=True) as requests:
                yield run.weights
            self.requests += requests
        finally:
            session.close()

    def run(self, weights: Weights, ids: list[int] | None = None, ablation: Ablation = NO_ABLATION
            ) -> tuple[Trace, np.ndarray]:
        """A forward pass of ``ids`` (default: the prompt) on ``weights``: the last token's trace
        and its final hidden state (C,)."""
        trace = Trace()
        h = forward(weights, np.asarray(self.ids if ids is None else ids), 0, Cache(), trace, ablation)
        return trace, h[-1]

    def final(self) -> tuple[Trace, np.ndarray]:
        """The prompt's last token: its trace and every token's logit (V,) float64 (one search
        over all of wte), computed once."""
        if self._final is None:
            with self.opened() as p:
                trace, h = self.run(p)
                self._final = trace, np.asarray(p.logits(h), np.float64)
        return self._final

    def top(self, k: int = 10) -> list[dict]:
        """The prompt's k best next tokens, with their logits."""
        logits = self.final()[1]
        best = np.argsort(-logits, kind="stable")[:k]
        return [{**tok(i), "logit": float(logits[i])} for i in best]


__all__ = ["CHECKS", "Lab", "check", "say", "tok", "verdict"]
