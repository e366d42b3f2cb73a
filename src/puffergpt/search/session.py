"""One text's session on the engine (``model.session.Session``): what its run needs besides the
weights' products (``weights.py``).

- the requests: every request the text's weights make is logged here (kind, rows scored, bytes,
  latency) into the ``recording`` blocks open (a step's, a learning view's); none is kept outside one;
- the text's namespace of keys, ``text-<16 hex>``: made when the text opens, written as
  ``attention_scores`` asks (``write_keys``: a prefill's now, a decode step's on a writer thread of
  its own, beside the searches), counted (the KV cache view), its expiry moved on while the text
  is used (``touch``, ``sweeper.Lease``) and all the while the text waits for its turn or works
  (``holding``: the engine's ``sweeper.Keeper``), dropped when the text closes;
- a turn among the engine's texts (``Scheduler.slot``) and lockstep with their steps
  (``Batcher.stepping``).
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from puffergpt.model.session import KeysExpired
from puffergpt.search import costs, sweeper
from puffergpt.stores.base import StoreError


@dataclass
class Request:
    kind: str  # h.3.mlp.c_fc, h.3.attn.keys, h.3.attn.scores, embed, wte.top_k, ln
    op: str  # search, write, fetch
    queries: int
    rows: int  # documents scored (search), written or fetched
    bytes: int  # bytes of documents scanned or written
    returned: int  # hits returned
    ms: float
    parts: int = 1  # store calls it took: more than one where a batch is over the store's limit
    concurrent: bool = False  # ran beside the critical path (a decode step's key write): no round trip of its own
    extra: bool = False  # asked for by a learning view (lens, inspect), not needed for the token
    shared: int = 1  # texts whose searches went to the store in this one request (scheduler.Batcher)

    def to_json(self) -> dict:
        return {**self.__dict__, "ms": round(self.ms, 3)}

    @property
    def round_trips(self) -> int:
        return 0 if self.concurrent else self.parts

    def cost_usd(self) -> float:
        return costs.request_cost(self.op, self.bytes, self.returned, self.queries, requests=self.parts)


class SearchSession:
    def __init__(self, engine, keys: bool = True):
        """A session on ``engine`` (``engine.Engine``, which opens it: not imported, engine.py imports
        this); ``keys``: make the text's namespace of keys (False: the embedding views, which read no text)."""
        self.engine = engine
        self.store = store = engine.store
        self._recordings: list[list[Request]] = []  # the open ``recording`` blocks, outermost first
        self._extra = False  # inside ``recording(extra=True)``: requests are marked extra
        # One writer thread: a text's key writes land in the order they were made.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="puffergpt-keys")
        self._pending: dict[int, Future] = {}  # layer -> its latest key write
        self._closed = threading.Event()
        self.keys_ns = f"text-{uuid.uuid4().hex[:16]}" if keys else None  # 60 random bits: no two texts share one
        self.lease = None  # the namespace's expiry, where every server sees it (sweeper.py)
        if not keys:
            return
        hd = engine.config.head_dim
        store.create_namespace(self.keys_ns, hd, engine.key_schema, engine.key_metric, ephemeral=True)
        try:
            self.lease = sweeper.Lease(store, self.keys_ns, engine.key_schema, hd, engine.text_ttl_s, engine.clock)
        except BaseException:
            store.drop_namespace(self.keys_ns)  # no text, no namespace
            self._writer.shutdown(wait=False)
            raise

    # --- the requests ---
    def log(self, kind, op, queries, rows, nbytes, returned, t0, parts=None, concurrent=False,
            shared=1) -> Request:
        """A request the weights made, from ``t0`` (perf_counter) on, recorded in every block open."""
        parts = parts or max(1, -(-queries // self.store.max_queries))  # how the store splits the batch
        r = Request(kind, op, queries, rows, int(nbytes), returned, (time.perf_counter() - t0) * 1e3, parts,
                    concurrent, self._extra, shared)
        self._record(r)
        return r

    def _record(self, r: Request) -> None:
        for requests in self._recordings:
            requests.append(r)

    @contextlib.contextmanager
    def recording(self, extra: bool = False) -> Iterator[list[Request]]:
        """The requests made inside the block (``model.session.Session``); nothing is kept outside one."""
        got: list[Request] = []
        was, t0 = self._extra, time.perf_counter()
        with self.holding():  # the text works: its keys are kept however long the block takes
            self._recordings.append(got)
            self._extra = was or extra
            try:
                yield got
            finally:
                self._extra = was
                del self._recordings[next(i for i, r in enumerate(self._recordings) if r is got)]  # not by ==
        if not self._recordings:  # the outermost block: a step's or a position's work, timed (pace.py)
            self.engine.pace.observe(got, time.perf_counter() - t0)

    # --- a turn among texts ---
    @contextlib.contextmanager
    def slot(self, should_stop=None):
        """A generation's turn on the engine (``Scheduler.slot``): the text generates inside it,
        and its keys are kept while it waits for the turn and while it generates."""
        with self.holding(), self.engine.scheduler.slot(should_stop) as turn:
            yield turn

    def stepping(self):
        """A step computed inside the block: other texts' searches of the weights wait for its own."""
        return self.engine.batcher.stepping()

    def wrote_token(self) -> None:
        self.engine.scheduler.wrote_token()

    # --- the text's namespace of keys ---
    def write_keys(self, layer: int, k: np.ndarray, pos: np.ndarray, concurrent: bool) -> None:
        """Store a layer's new keys (H, T, hd) at positions pos (T,), one document a head and
        position, as one request: now, or ``concurrent``ly on the writer thread (a decode step's:
        nothing searches them before the layer's next search, which waits for it: ``wait_keys``)."""
        H, T, hd = k.shape
        heads, ts = np.meshgrid(np.arange(H), np.arange(T), indexing="ij")  # (H, T) each
        keys = k.reshape(H * T, hd).copy()
        ids = [f"h.{layer}.{h}.{pos[i]}" for h, i in zip(heads.ravel(), ts.ravel(), strict=True)]
        attrs = {"layer": [layer] * (H * T), "head": heads.ravel(), "pos": pos[ts.ravel()]}
        if self.engine.key_metric != "inner_product":
            attrs["norm2"] = (keys.astype(np.float64) ** 2).sum(axis=1)
        req = Request(f"h.{layer}.attn.keys", "write", 0, H * T, keys.nbytes, 0, 0.0, 1, concurrent, self._extra)
        self._record(req)

        def write():
            self.engine.guard_disk()  # a disk nearly full: the reserve let go first, never a SIGBUS in the map
            t = time.perf_counter()
            try:
                self.store.upsert(self.keys_ns, ids, keys, attrs)
            finally:
                req.ms = (time.perf_counter() - t) * 1e3

        if concurrent:
            self._pending[layer] = self._writer.submit(write)
        else:
            write()

    def wait_keys(self, layer: int) -> None:
        """Block until this layer's last key write has landed; a failed write fails here."""
        f = self._pending.pop(layer, None)
        if f is not None:
            f.result()

    def key_counts(self) -> list[int]:
        """Keys stored in this text's namespace, per layer: n_layer count requests (the KV cache view)."""
        out = []
        for layer in range(self.engine.config.n_layer):
            self.wait_keys(layer)
            t = time.perf_counter()
            out.append(int(self.store.count(self.keys_ns, (("layer", "=", layer),))))
            self.log(f"h.{layer}.attn.keys", "count", 1, 0, 0, 1, t)
        return out

    def touch(self) -> bool:
        """The text is in use: its namespace's expiry moved on (``sweeper.Lease.keep``: a failed
        write is logged and tried again); False when it is past, and another server may have
        dropped the keys."""
        return self.lease is None or self.lease.keep()

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """The text is held for the block (waiting, working): the engine's keeper renews its lease
        however long the block lasts. KeysExpired if the lease is over already."""
        if self.lease is None:
            yield
            return
        if self.lease.lapsed is not None:
            raise KeysExpired(self.expired())
        with self.engine.keeper.holding(self.lease):
            yield

    def expired(self) -> str:
        return f"this text expired: {self.lease.lapsed}. Reopen it from its token ids"

    def explain(self, e: StoreError) -> Exception:
        """A failed request of the text's keys, said as what it is: KeysExpired when the lease is
        over, or the namespace is gone (another server swept it, the text closed meanwhile), else
        the store's error as it was (the store failed: it could not even list its namespaces)."""
        if self.lease is None:
            return e
        if self.lease.lapsed is not None:
            return KeysExpired(self.expired())
        try:
            there = self.keys_ns in self.store.namespaces(sweeper.PREFIX)
        except StoreError:
            return e
        if there:
            return e
        return KeysExpired(f"this text's keys are gone from the store ({e}): it expired or was closed. "
                           "Reopen it from its token ids")

    def close(self) -> None:
        """Wait for the key writes in flight, then drop the text's namespace."""
        if self._closed.is_set():
            return
        self._closed.set()
        if self.lease is not None:
            self.lease.ended = True  # the keeper leaves it be
        try:
            for f in list(self._pending.values()):
                f.exception()  # wait; a failed write matters no more: the namespace goes
        finally:
            self._writer.shutdown(wait=True)
            if self.keys_ns is not None:
                self.store.drop_namespace(self.keys_ns)
                self.engine.batcher.forget(self.keys_ns)
