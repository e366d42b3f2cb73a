"""Texts' key namespaces that outlive their server: each says until when it is in use, and any
server drops those past it. Written once, over the Store seam, for every backend.

A text's keys live in a namespace of the store, ``text-<16 hex>`` (``session.SearchSession``),
which every server on a shared database (pgvector, turbopuffer) can see. When the server that
holds a text goes away without closing it (a kill -9, a crash, a machine lost), nothing else
would ever drop that namespace. So:

- ``Lease``: the namespace holds one document besides its keys, its *expiry* (id ``expiry``,
  layer -1, so no attention search, which filters on a layer >= 0, ever finds it), whose ``pos``
  is the second from which any server may drop the namespace: the text's last use plus the TTL
  (``serve --text-ttl``). It is written when the namespace is made and moved on at most once a
  quarter of the TTL while the text is used. It lives and goes with the namespace: nothing is
  left behind when the namespace is dropped, whoever drops it.
- ``Sweeper``: lists the ``text-`` namespaces and drops those whose expiry has passed (one
  search a namespace to read it). A namespace without one (made this instant, or by an older
  puffergpt) is dropped once it has been seen for a whole TTL.

- ``Keeper``: while a text is held, waiting for its turn (``Scheduler.slot``) or working (a step,
  a view: ``SearchSession.recording``), a thread of the engine renews its lease, so that a text
  queued behind long generations, or inside one long step, is never swept. A renewal that fails
  (the store did not answer) is logged and tried again at the next tick (``keep_interval``); one
  that keeps failing until the expiry is near lapses the lease, and the text says it expired and
  why (``model.session.KeysExpired``), never that the store failed.

The server that holds a text stops using it a little before its expiry (``Lease.renew`` says
False from ``GRACE`` of the TTL before it): a text idle that long is gone on every server alike,
and the page reopens it (``registry.Texts.get``). Clocks: the expiry is wall-clock time; servers'
clocks may differ by up to that grace (NTP keeps them within far less).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from puffergpt import settings
from puffergpt.stores.base import Query, Store, StoreError

log = logging.getLogger("puffergpt")

DEFAULT_TTL_S = settings.default("text_ttl_s")  # serve --text-ttl's default: 30 minutes, as the idle timeout
PREFIX = "text-"
TEXT_NS = re.compile(r"text-[0-9a-f]{16}")  # what session.SearchSession names a text's namespace
EXPIRY_ID = "expiry"
EXPIRY_LAYER = -1  # no key has it: attention searches one layer >= 0 at a time
RENEW = 0.25  # the expiry moves on when a use comes this share of the TTL after it was written
GRACE = 0.125  # the holder stops this share of the TTL before the expiry: clock skew, a write's latency


def expiry_document(schema: dict[str, str], dim: int, at: float) -> tuple[list[str], np.ndarray, dict]:
    """The expiry as a document of a text's namespace (its schema, vectors of length dim):
    ids, vectors (1, dim), attributes. ``at``: a unix time, rounded up to the second."""
    attrs = {"layer": [EXPIRY_LAYER], "head": [-1], "pos": [math.ceil(at)]}
    if "norm2" in schema:
        attrs["norm2"] = [float(dim)]  # |ones|^2: a vector no metric divides by zero over
    return [EXPIRY_ID], np.ones((1, dim), np.float32), attrs


def read_expiry(store: Store, ns: str) -> float | None:
    """The unix time from which ns may be dropped; None when it has no expiry (one search)."""
    layout = store.layout(ns)
    q = Query(np.ones(layout.dim, np.float32), (("layer", "=", EXPIRY_LAYER),), top_k=1)
    hits = store.search(ns, [q], layout.metrics[0], ("pos",))
    return float(hits.attrs["pos"][0]) if len(hits.query) else None


class Lease:
    """A text's namespace kept from other servers' sweeps while the text is used."""

    def __init__(self, store: Store, ns: str, schema: dict[str, str], dim: int, ttl_s: float,
                 clock: Callable[[], float] = time.time):
        if not ttl_s > 0:
            raise ValueError(f"a text's TTL must be a positive number of seconds, got {ttl_s!r}")
        self.store, self.ns, self.schema, self.dim = store, ns, schema, dim
        self.ttl_s, self.clock = float(ttl_s), clock
        self.expires: float | None = None  # the expiry written last
        self.lapsed: str | None = None  # why the lease is over (then for good): the text is gone
        self.failures = 0  # renewals failed in a row (``keep``)
        self.error: str | None = None  # the last one's error
        self.ended = False  # the text closed: nothing more to keep
        self._lock = threading.Lock()
        self.renew()

    def renew(self) -> bool:
        """The text is being used: move its expiry on (a write, at most once a RENEW of the TTL).
        False when the expiry is past or near (GRACE): another server may have dropped the
        namespace, so the text is gone and must be reopened; nothing is written then, nor ever
        after. A StoreError if the write failed (``keep`` retries it)."""
        with self._lock:
            if self.lapsed is not None:
                return False
            now = self.clock()
            if self.expires is not None:
                if now >= self.expires - GRACE * self.ttl_s:
                    self.lapsed = self._why()
                    return False
                if now < self.expires - (1 - RENEW) * self.ttl_s:
                    return True  # written less than a RENEW of the TTL ago
            at = now + self.ttl_s
            self.store.upsert(self.ns, *expiry_document(self.schema, self.dim, at))
            self.expires = math.ceil(at)
            return True

    def _why(self) -> str:
        if self.failures:
            return (f"its keys' lease could not be renewed ({self.failures} tries failed, the last: {self.error}), "
                    f"so they expired and any server may drop them")
        return f"it was unused past its TTL of {self.ttl_s:g} s, and its keys expired"

    def keep(self) -> bool:
        """``renew``, where a failed write is no end: it is logged (the first of a run, then each
        tenth) and counted, and the next call tries again; the lease lapses only when the expiry
        comes near with no write done. -> False once lapsed."""
        if self.ended:
            return True
        try:
            ok = self.renew()
        except StoreError as e:
            self.failures, self.error = self.failures + 1, str(e)
            if self.failures % 10 == 1:
                log.warning("renewing the lease of %s failed (%d in a row; tried again): %s", self.ns, self.failures, e)
            return True
        if not ok and self.failures:
            log.error("the keys of %s expired: %s", self.ns, self.lapsed)
        elif self.failures:
            log.info("renewed the lease of %s after %d failed tries", self.ns, self.failures)
        self.failures = 0 if ok else self.failures
        return ok


def keep_interval(ttl_s: float) -> float:
    """How often the keeper renews the leases it holds: a sixteenth of the TTL (a write is due
    every quarter: about five tries before one that fails lapses), within 0.05 s and 60 s."""
    return min(60.0, max(0.05, ttl_s / 16))


class Keeper:
    """An engine's texts held by the server right now (waiting for a turn, working): their leases
    renewed on one thread of its own, started while any is held."""

    def __init__(self, ttl_s: float):
        self.every = keep_interval(ttl_s)
        self._held: dict[Lease, int] = {}  # lease -> blocks holding it (they nest)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def holding(self, lease: Lease) -> Iterator[None]:
        """The lease kept for the block, however long it lasts."""
        with self._cond:
            self._held[lease] = self._held.get(lease, 0) + 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="puffergpt-leases", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._cond:
                self._held[lease] -= 1
                if not self._held[lease]:
                    del self._held[lease]

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait(self.every)
                leases = list(self._held)
                if not leases:  # nothing held: the thread goes, the next hold starts another
                    self._thread = None
                    return
            for lease in leases:
                try:
                    lease.keep()
                except Exception as e:  # a bug in one lease must not stop the others' renewals
                    log.exception("keeping the lease of %s: %s", lease.ns, e)

    def failing(self) -> int:
        """Leases held now whose last renewal failed (``/metrics``)."""
        with self._cond:
            return sum(1 for lease in self._held if lease.failures)


class Sweeper:
    """Drops the key namespaces of texts nobody used for the TTL, whichever server held them."""

    def __init__(self, store: Store, ttl_s: float, clock: Callable[[], float] = time.time):
        self.store, self.ttl_s, self.clock = store, float(ttl_s), clock
        self._unknown: dict[str, float] = {}  # namespace without an expiry -> when this sweeper first saw it

    def sweep(self) -> list[str]:
        """One pass: the namespaces it dropped."""
        names = [ns for ns in self.store.namespaces(PREFIX) if TEXT_NS.fullmatch(ns)]
        self._unknown = {ns: t for ns, t in self._unknown.items() if ns in names}
        dropped = []
        for ns in names:
            try:
                if self._expired(ns):
                    self.store.drop_namespace(ns)
                    self._unknown.pop(ns, None)
                    dropped.append(ns)
            except StoreError as e:  # dropped meanwhile by another server, or the store failed: next pass
                log.info("sweeping %s: %s", ns, e)
        return dropped

    def _expired(self, ns: str) -> bool:
        now = self.clock()
        at = read_expiry(self.store, ns)
        if at is None:
            at = self._unknown.setdefault(ns, now) + self.ttl_s
        return now > at


def interval(ttl_s: float) -> float:
    """How often a server sweeps: a quarter of the TTL, within 0.5 s and 60 s."""
    return min(60.0, max(0.5, ttl_s / 4))


async def sweeping(sweeper: Sweeper) -> None:
    """A server's sweep, every ``interval`` until cancelled (the app's lifespan)."""
    while True:
        await asyncio.sleep(interval(sweeper.ttl_s))
        try:
            dropped = await asyncio.to_thread(sweeper.sweep)
            if dropped:
                log.info("dropped the keys of %d texts idle past their TTL: %s", len(dropped), ", ".join(dropped))
        except Exception as e:  # the sweep goes on
            log.warning("sweeping texts' key namespaces failed: %s", e)
