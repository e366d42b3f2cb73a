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

The server that holds a text stops using it a little before its expiry (``Lease.renew`` says
False from ``GRACE`` of the TTL before it): a text idle that long is gone on every server alike,
and the page reopens it (``registry.Texts.get``). Clocks: the expiry is wall-clock time; servers'
clocks may differ by up to that grace (NTP keeps them within far less).
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import threading
import time
from collections.abc import Callable

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
        self._lock = threading.Lock()
        self.renew()

    def renew(self) -> bool:
        """The text is being used: move its expiry on (a write, at most once a RENEW of the TTL).
        False when the expiry is past or near (GRACE): another server may have dropped the
        namespace, so the text is gone and must be reopened; nothing is written then."""
        with self._lock:
            now = self.clock()
            if self.expires is not None:
                if now >= self.expires - GRACE * self.ttl_s:
                    return False
                if now < self.expires - (1 - RENEW) * self.ttl_s:
                    return True  # written less than a RENEW of the TTL ago
            at = now + self.ttl_s
            self.store.upsert(self.ns, *expiry_document(self.schema, self.dim, at))
            self.expires = math.ceil(at)
            return True


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
