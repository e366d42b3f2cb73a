"""What the front of ``serve --workers N`` knows of its workers, found out in the background,
so that no answer of the front waits on a worker without a bound:

- every POLL_S each worker's ``/health`` is asked, within ANSWER_S. A worker that has not
  answered for SLOW_S gets no new work (texts open elsewhere, the front's ``/ready`` no longer
  counts it); one that has not answered for STALL_S (stopped by SIGSTOP, deadlocked, swapped
  out) is killed, and the pool starts it again: its texts answer ``text_not_found``, as after
  any death, and the page reopens them from their token ids;
- every READY_EVERY_S each answering worker's ``/ready`` is asked (bounded by the worker's
  own READY_S, and one second more); the front's ``/ready`` answers from the last answers, at
  once, however slow a worker is.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

import httpx

from puffergpt.server.processes.probes import READY_S
from puffergpt.server.processes.workers import Pool
from puffergpt.texts.text import log

POLL_S = 0.5  # how often each worker's /health is asked
ANSWER_S = 1.5  # how long one /health may take
SLOW_S = 2.0  # no answer for this long: no new work for it
STALL_S = 10.0  # no answer for this long: killed and started again
READY_EVERY_S = 1.0


@dataclass
class Seen:
    """One worker process as last seen: where it listens, when it last answered /health, why
    it was not ready (None: ready)."""

    url: str | None
    answered: float = field(default_factory=time.monotonic)
    why: str | None = "its /ready was not asked yet"


class Watch:
    """Each worker's last answers; ``run()`` keeps them current (a task of the front's loop)."""

    def __init__(self, pool: Pool, client: httpx.AsyncClient, slow_s: float = SLOW_S, stall_s: float = STALL_S):
        self.pool, self.client, self.slow_s, self.stall_s = pool, client, slow_s, stall_s
        self.seen = [Seen(pool.url(i)) for i in range(pool.n)]

    def _seen(self, i: int) -> Seen:
        """Worker i's record; a new one when another process listens there (started again)."""
        url = self.pool.url(i)
        if self.seen[i].url != url:
            self.seen[i] = Seen(url)
        return self.seen[i]

    def answering(self) -> list[int]:
        """The workers that run and answered /health within SLOW_S."""
        now = time.monotonic()
        return [i for i in range(self.pool.n)
                if self._seen(i).url is not None and now - self.seen[i].answered < self.slow_s]

    def ready(self) -> tuple[int, str]:
        """How many answering workers were ready when last asked; and, if none, why not."""
        up = self.answering()
        n = sum(self.seen[i].why is None for i in up)
        if n or not up:
            return n, "no worker answers" if not up else ""
        return 0, str(next(self.seen[i].why for i in up))

    async def run(self) -> None:
        await asyncio.gather(self._health(), self._readiness())

    async def _health(self) -> None:
        while True:
            await asyncio.gather(*(self._ask_health(i) for i in range(self.pool.n)))
            await asyncio.sleep(POLL_S)

    async def _ask_health(self, i: int) -> None:
        seen = self._seen(i)
        if seen.url is None:
            return
        with contextlib.suppress(httpx.HTTPError):
            r = await self.client.get(f"{seen.url}/health", headers={"host": "127.0.0.1"}, timeout=ANSWER_S)
            if r.status_code == 200:
                seen.answered = time.monotonic()
                return
        quiet = time.monotonic() - seen.answered
        if quiet > self.stall_s and self.pool.url(i) == seen.url:
            log.warning("worker %d has not answered for %.0f s: killed, and started again; the texts it held "
                        "reopen where asked next", i, quiet)
            self.pool.kill(i)

    async def _readiness(self) -> None:
        while True:
            await asyncio.gather(*(self._ask_ready(i) for i in self.answering()))
            await asyncio.sleep(READY_EVERY_S)

    async def _ask_ready(self, i: int) -> None:
        seen = self._seen(i)
        try:
            r = await self.client.get(f"{seen.url}/ready", headers={"host": "127.0.0.1"}, timeout=READY_S + 1)
            seen.why = None if r.status_code == 200 else str(r.json().get("reason", f"/ready {r.status_code}"))
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            seen.why = f"worker {i} did not answer /ready ({type(e).__name__})"
