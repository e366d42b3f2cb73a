"""How long a text's work takes on this engine, measured as it runs: the seconds a prompt token
read costs (in a prefill), a position scored over the whole vocabulary (``echo`` with
``logprobs``), a new token (a decode step). A /v1 request inside ``--max-request-tokens`` that
could not finish within ``--max-request-seconds`` at this pace is refused up front, naming both
limits (``server/openai/routes.py``), instead of running to the time limit.

Each text's outermost block of work (``SearchSession.recording``: a step, a scored position) is
one sample, read from the requests it made: the tokens the first product read (``h.0.attn.c_attn``'s
queries), the positions scored (``wte.all``'s queries). A block that read several tokens is a
prefill (its seconds over the tokens), one that read one a decode step, one that read none and
scored some a scored position; a learning view's (``extra``) is left out. Each kind's pace is a
moving average (``WEIGHT`` for the newest), so it follows the machine's load."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

WEIGHT = 0.2  # of the newest sample in a kind's moving average
KINDS = ("read", "scored", "new")
READ_KIND = "h.0.attn.c_attn"  # every read's first product: its queries are the tokens read
SCORED_KIND = "wte.all"  # a search of the whole vocabulary: its queries are the positions scored


@dataclass(frozen=True)
class Work:
    """A request's work, in the units ``--max-request-tokens`` counts: prompt tokens read,
    positions scored over the whole vocabulary, new tokens."""

    read: int
    scored: int
    new: int


class Pace:
    """Seconds a unit of each kind of work takes on this engine, measured (None: not yet)."""

    def __init__(self):
        self._s: dict[str, float] = {}
        self._lock = threading.Lock()

    def observe(self, requests: Sequence, seconds: float) -> None:
        """One block of a text's work: its requests (``session.Request``) and how long it took."""
        if not requests or any(r.extra for r in requests):
            return
        read = max((r.queries for r in requests if r.kind == READ_KIND and r.op == "search"), default=0)
        scored = sum(r.queries for r in requests if r.kind == SCORED_KIND)
        if read >= 2:
            self._add("read", seconds / read)
        elif read == 1:
            self._add("new", seconds)
        elif scored:
            self._add("scored", seconds / scored)

    def _add(self, kind: str, s: float) -> None:
        with self._lock:
            old = self._s.get(kind)
            self._s[kind] = s if old is None else (1 - WEIGHT) * old + WEIGHT * s

    def seconds(self) -> dict[str, float]:
        """Each measured kind's seconds a unit."""
        with self._lock:
            return dict(self._s)

    def estimate(self, work: Work) -> float | None:
        """Seconds the work would take at this pace; a kind not measured yet counts at the
        cheapest measured one (an estimate that errs short: nothing refused on a guess);
        None while nothing is measured."""
        s = self.seconds()
        if not s:
            return None
        floor = min(s.values())
        return sum(getattr(work, k) * s.get(k, floor) for k in KINDS)
