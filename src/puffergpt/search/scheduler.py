"""Many texts on one engine at once: slots for generations, and searches merged across texts.

Every text generates in a thread of its own (the server's worker, a /v1 request, the MCP
tool). Two things make them share the machine instead of queueing behind each other:

- ``Batcher``: continuous batching, as LLM servers do it. Texts run the same forward pass,
  so several of them want the same product at about the same moment: every text's
  ``h.2.mlp.c_fc``, say. Those searches go to the store together as one request (each
  query keeps its own vector, so every text gets exactly the hits it would get alone).
  A text alone is never delayed: its search goes straight to the store. Nobody runs a
  dispatcher thread: the first text to find the lane free leads it, and hands the lead
  to a waiting text when it leaves.
- ``Scheduler``: a bound on the texts generating at once (``max_running``); the others
  wait in order of arrival, and a Stop or a client that leaves while waiting leaves the
  queue at once. A text that stops frees its slot at its next token.

Exactness: a store scores each query on its own (exact search), so merged or not, a
text's scores are the same numbers; tests/test_scheduler.py checks texts run together
against the same texts run alone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from puffergpt import settings
from puffergpt.stores.base import Hits, Query, Store

MERGE_QUERIES = 2048  # at most this many queries in one merged request (a text's own may be more)
GATHER_S = 0.005  # a lane of the weights waits at least this long for texts still in their step,
MAX_GATHER_S = 0.1  # and, sized from the store's speed, at most this (Batcher._wait_s)
MAX_RUNNING = settings.default("max_running")  # texts generating at once by default (serve --max-running)
WAIT_POLL_S = 0.05  # how often a queued generation checks whether it was stopped


@dataclass
class _Ask:
    """One text's search, waiting in a lane."""

    queries: Sequence[Query]
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False  # woken to lead the lane, not answered
    hits: Hits | None = None
    error: BaseException | None = None
    shared: int = 1  # texts whose searches went in the same store request

    def answer(self) -> Hits:
        if self.error is not None:
            raise self.error
        return self.hits


@dataclass
class _Lane:
    """The searches of one (namespace, metric, included attributes): one store call at a time."""

    gather: bool  # a lane of the weights: other texts' searches may join
    busy: bool = False  # a text leads it: gathering, or its request is at the store
    waiting: list[_Ask] = field(default_factory=list)


@dataclass
class BatchStats:
    asks: int = 0  # searches asked by texts
    requests: int = 0  # store calls made for them
    merged: int = 0  # asks answered by a store call shared with another text

    def to_json(self) -> dict:
        return dict(self.__dict__)


class Batcher:
    """Searches of many texts: those of one namespace asked while the store is busy go
    to it together. ``search`` -> (the caller's hits, how many texts shared the request).

    A lane of the weights (``gather``) waits, for a bounded time (``_wait_s``), until every
    text that is in the middle of a step has asked a search of the weights (this one or
    another): texts in lockstep then share every product of a step. A text's own keys can't
    be shared: they are asked at once, and the lanes of the weights wait for the texts
    reading them."""

    def __init__(self, store: Store, merge_queries: int = MERGE_QUERIES, gather_s: float = GATHER_S):
        self.store = store
        self.merge_queries = merge_queries
        self.gather_s = gather_s
        self._alone_s = 0.0  # a search asked alone (mostly a text's keys): its usual time, smoothed
        self._stats = BatchStats()
        self._lanes: dict[tuple, _Lane] = {}
        self._cond = threading.Condition()  # the lanes, the counts; gathering leaders wait on it
        self._stepping = 0  # texts in the middle of a step (Text._next)
        self._gathered = 0  # searches of the weights asked and not yet answered

    @contextlib.contextmanager
    def stepping(self) -> Iterator[None]:
        """A text computes a step inside this block: the lanes of the weights wait for it."""
        with self._cond:
            self._stepping += 1
        try:
            yield
        finally:
            with self._cond:
                self._stepping -= 1
                self._cond.notify_all()

    def stats(self) -> BatchStats:
        with self._cond:
            return BatchStats(**self._stats.__dict__)

    def search(self, ns: str, queries: Sequence[Query], metric: str, include: tuple,
               gather: bool = False) -> tuple[Hits, int]:
        ask = _Ask(queries)
        with self._cond:
            key = lane_key(ns, queries, metric, include) if gather else (ns, metric, include)
            lane = self._lanes.setdefault(key, _Lane(gather))
            lane.waiting.append(ask)
            if lane.gather:
                self._gathered += 1
                self._cond.notify_all()  # a gathering leader may have waited for this one
            lead = not lane.busy
            lane.busy = True
        if not lead:
            ask.done.wait()
            if not ask.lead:
                return ask.answer(), ask.shared
        batch = self._gather(lane)  # holds this ask: it is first in line
        try:
            self._run(batch, self.store.search, ns, metric, include)
        finally:
            self._finish(lane, batch)
        return ask.answer(), ask.shared

    def _gather(self, lane: _Lane) -> list[_Ask]:
        with self._cond:
            if lane.gather:
                self._cond.wait_for(lambda: self._gathered >= self._stepping, self._wait_s())
            return self._take(lane.waiting)

    def _wait_s(self) -> float:
        """How long a lane of the weights waits for the texts still in their step: long enough
        for each of them to search its keys one after another (a store with one connection
        serves them so), up to MAX_GATHER_S, and never under ``gather_s``; the lock held."""
        return max(self.gather_s, min(MAX_GATHER_S, 2 * self._stepping * self._alone_s))

    def _finish(self, lane: _Lane, batch: list[_Ask]) -> None:
        """The batch answered: its texts go on; the lane passes to the next waiting text, or is free."""
        with self._cond:
            if lane.gather:
                self._gathered -= len(batch)
            if lane.waiting:
                nxt = lane.waiting[0]
                nxt.lead = True
                nxt.done.set()
            else:
                lane.busy = False
        for a in batch:
            a.done.set()

    def forget(self, ns: str) -> None:
        """Drop the lanes of a namespace that is gone (a closed text's keys)."""
        with self._cond:
            for key in [k for k, lane in self._lanes.items() if k[0] == ns and not lane.busy]:
                del self._lanes[key]

    def _take(self, waiting: list[_Ask]) -> list[_Ask]:
        """The asks of the next request, in order of arrival: at least one, and more while
        the queries fit ``merge_queries``."""
        n, total = 1, len(waiting[0].queries)
        while n < len(waiting) and total + len(waiting[n].queries) <= self.merge_queries:
            total += len(waiting[n].queries)
            n += 1
        batch = waiting[:n]
        del waiting[:n]
        for a in batch:
            a.lead = False
        return batch

    def _count(self, asks: int = 0, requests: int = 0, merged: int = 0) -> None:
        with self._cond:
            self._stats.asks += asks
            self._stats.requests += requests
            self._stats.merged += merged

    def _run(self, batch: list[_Ask], search: Callable[..., Hits], ns: str, metric: str, include: tuple) -> None:
        self._count(asks=len(batch))
        if len(batch) == 1:
            self._answer_alone(batch[0], search, ns, metric, include)
            return
        queries = [q for a in batch for q in a.queries]
        self._count(requests=1)
        try:
            hits = search(ns, queries, metric, include=include)
        except Exception:  # one text's failure must not be every text's: each asks again, alone
            for a in batch:
                self._answer_alone(a, search, ns, metric, include)
            return
        self._count(merged=len(batch))
        for a, part in zip(batch, split(hits, [len(a.queries) for a in batch], include), strict=True):
            a.hits, a.shared = part, len(batch)

    def _answer_alone(self, a: _Ask, search: Callable[..., Hits], ns: str, metric: str, include: tuple) -> None:
        self._count(requests=1)
        t = time.perf_counter()
        try:
            a.hits = search(ns, a.queries, metric, include=include)
        except BaseException as e:
            a.error = e
        took = time.perf_counter() - t
        with self._cond:
            self._alone_s = 0.8 * self._alone_s + 0.2 * took


def lane_key(ns: str, queries: Sequence[Query], metric: str, include: tuple) -> tuple:
    """Searches merge when they are the same product: one namespace, metric and attributes,
    and the same filter and top-k (the first query's: a product's queries share them). Every
    text's ``h.2.mlp.c_fc`` goes together; a database that plans a request by its filter
    (pgvector's B-tree on the matrix) keeps one plan for it."""
    q = queries[0] if queries else None
    return ns, metric, include, q.filter if q else (), q.top_k if q else None


def split(hits: Hits, sizes: list[int], include: tuple) -> list[Hits]:
    """The hits of one merged request as each asker's own, query numbers from 0; within a
    query the store's order (best first for a top-k) is kept."""
    order = np.argsort(hits.query, kind="stable")
    q = hits.query[order]
    ends = np.cumsum(sizes)
    starts = ends - np.asarray(sizes)
    out = []
    for s, e in zip(starts, ends, strict=True):
        i, j = np.searchsorted(q, s, "left"), np.searchsorted(q, e, "left")
        idx = order[i:j]
        out.append(Hits(hits.query[idx] - s, hits.distance[idx], {a: hits.attrs[a][idx] for a in include}))
    return out


class Scheduler:
    """At most ``max_running`` generations at once; the others wait, first come first served."""

    def __init__(self, max_running: int = MAX_RUNNING):
        if isinstance(max_running, bool) or not isinstance(max_running, int) or not 1 <= max_running <= 1000:
            raise ValueError(f"max_running must be in 1..1000, got {max_running!r}")
        self.max_running = max_running
        self._cond = threading.Condition()
        self._running = 0
        self._queue: list[object] = []  # tickets of the waiting generations, oldest first
        self.tokens = 0  # tokens the generations wrote, ever (/metrics)

    @contextlib.contextmanager
    def slot(self, should_stop: Callable[[], bool] | None = None) -> Iterator[bool]:
        """Hold a slot for the block: yields True, or False when ``should_stop`` said so
        while waiting (the block should then do nothing)."""
        got = self._acquire(should_stop)
        try:
            yield got
        finally:
            if got:
                with self._cond:
                    self._running -= 1
                    self._cond.notify_all()

    def _acquire(self, should_stop: Callable[[], bool] | None) -> bool:
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            try:
                while self._queue[0] is not ticket or self._running >= self.max_running:
                    if should_stop is not None and should_stop():
                        return False
                    self._cond.wait(WAIT_POLL_S)
                self._running += 1
                return True
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()

    def wrote_token(self) -> None:
        with self._cond:
            self.tokens += 1

    def status(self) -> dict:
        with self._cond:
            return {"running": self._running, "queued": len(self._queue), "max_running": self.max_running}
