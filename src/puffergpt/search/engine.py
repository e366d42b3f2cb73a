"""The search-driven engine: one model loaded into a store, and the texts it runs.

``Engine.open()`` gives one text's ``model.session.Run``: its weights (``weights.py``,
``SearchWeights``: every product a vector search, the same forward pass as numpy's) and its
session (``session.py``, ``SearchSession``: the requests it made, its turn among the engine's
texts, its namespace of keys). ``Engine.views()`` gives the same for the embedding views, with
no namespace of keys. What the engine itself holds is what its texts share: the store, the
checked manifest, the scheduler and batcher (``scheduler.py``), the approximate index's record.

A text's namespace also holds its expiry, moved on while the text is used, so that any server
on a shared store can drop the keys of a text nobody uses (``sweeper.py``, ``touch``).

Every request is logged with its kind, rows scored, bytes and latency; a decode step makes
2 + 5 x n_layer sequential requests (62 for GPT-2 small) and n_layer concurrent key writes.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

import numpy as np

from puffergpt.model import token_counts, untrained
from puffergpt.model.checkpoints import GPT2Config
from puffergpt.model.session import Run
from puffergpt.search import documents, space, sweeper
from puffergpt.search.documents import Encoding
from puffergpt.search.pace import Pace
from puffergpt.search.scheduler import Batcher, Scheduler
from puffergpt.search.session import SearchSession
from puffergpt.search.weights import SearchWeights
from puffergpt.stores.base import NoIndex, Query, Store, StoreError

KEY_SCHEMA = {"layer": "int", "head": "int", "pos": "int"}
OUTPUT_SEARCHES = ("exact", "approximate")  # how the next token is found: every wte row, or the ANN index
INDEX_VERSION = 1  # of the manifest's record of the approximate index (``indexes``); another: rebuild it
log = logging.getLogger("puffergpt")


def check_output_search(how) -> str:
    if how not in OUTPUT_SEARCHES:
        raise ValueError(f"output_search must be one of {', '.join(OUTPUT_SEARCHES)}, not {how!r}")
    return how


def requests_per_token(c: GPT2Config) -> int:
    """A decode step's requests: the embedding fetch, six a layer (one a concurrent key
    write), the top-k (see the module's docstring)."""
    return 2 + 6 * c.n_layer


def round_trips_per_token(c: GPT2Config) -> int:
    """A decode step's sequential requests: the key writes run beside them."""
    return 2 + 5 * c.n_layer


class Engine:
    """A model loaded into a store. ``open()`` gives the run of one text: its weights and session."""

    def __init__(self, store: Store, manifest: dict, model: str, key: str, key_metric: str | None = None,
                 scheduler: Scheduler | None = None, text_ttl_s: float = sweeper.DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.time, output_search: str = "exact",
                 index_damage: str | None = None):
        """``manifest``: the model's, read and checked by the caller (``manifest.open_engine``);
        ``scheduler``: the bound on texts generating at once (a server's own; default 16);
        ``text_ttl_s``: a text unused this long may have its keys dropped by any server
        (``sweeper.py``), read on ``clock`` (unix seconds); ``output_search``: how a text's next
        token is found unless it says (``OUTPUT_SEARCHES``: "approximate" needs the index);
        ``index_damage``: what the caller found wrong with the approximate index's files, with the
        command that repairs it (``manifest.open_engine``: ``verify.index_damage``): the index is
        then refused with it."""
        self.store = store
        self.batcher = Batcher(store)  # the same product of several texts, one request (scheduler.py)
        self.scheduler = scheduler or Scheduler()
        self.model = model
        self.key = key
        self.manifest = manifest
        self.config = GPT2Config(**manifest["config"])
        self.encoding = Encoding(manifest["metric"])
        self.untrained = untrained.from_manifest(manifest)  # token ids never trained; None: not recorded
        # Keys use the most precise metric this store has.
        self.key_metric = key_metric or store.metrics[0]
        if self.key_metric not in store.metrics:
            raise StoreError(f"the {store.name} store has no {self.key_metric!r} search")
        self.key_schema = KEY_SCHEMA if self.key_metric == "inner_product" else KEY_SCHEMA | {"norm2": "float"}
        if not text_ttl_s > 0:
            raise ValueError(f"the text TTL must be a positive number of seconds, got {text_ttl_s!r}")
        self.text_ttl_s, self.clock = float(text_ttl_s), clock
        self.keeper = sweeper.Keeper(self.text_ttl_s)  # the leases of texts held now, renewed (sweeper.py)
        self.pace = Pace()  # seconds a token read, scored, generated: measured as texts run (pace.py)
        self.reserve: space.Reserve | None = None  # room held for the texts in flight (a server's: hold_reserve)
        self.output_search = check_output_search(output_search)
        self._output_index: dict | None = None  # the index's record, once the store said it holds it, whole
        self._no_index: str | None = None  # or why it can't be used, found once
        self.index_damage = index_damage
        if output_search == "approximate":
            self.output_index()  # no index, or a damaged one: said now, not at the first token
        elif "wte" in manifest.get("indexes", {}):
            try:  # digested at the start all the same: damage is said now, and refused where asked for
                self.output_index()
            except NoIndex as e:
                log.warning("%s", e)

    def probe(self) -> None:
        """One search of one row, the first token's (/ready: the store answers with the model's
        documents); StoreError if it does not."""
        ns = documents.namespace(self.key, self.config.n_embd)
        q = self.encoding.queries(np.ones((1, self.config.n_embd), np.float32))[0]  # (1, C) -> (dim,)
        hits = self.store.search(ns, [Query(q, (("matrix", "=", "wte"), ("row", "=", 0)), 1)], self.encoding.metric,
                                 ("row",))
        if len(hits.query) != 1:
            raise StoreError(f"a search of one row of {ns} returned {len(hits.query)}: run `puffergpt verify`")

    @functools.cached_property
    def token_counts(self) -> token_counts.TokenCounts | None:
        """How often each token was seen in training, from the file beside the model
        (``token_counts.py``); None: unknown (GPT-2, a made model). Read when a view first asks."""
        return token_counts.for_model(self.model, self.config.n_vocab)

    def status(self) -> dict:
        """How busy the engine is: texts generating and waiting (``Scheduler.status``), how many
        of their searches went to the store shared with another text's."""
        return {**self.scheduler.status(), "searches": self.batcher.stats().to_json()}

    def open(self, output_search: str | None = None) -> Run:
        """The run of one text: its session, with a namespace of its own for the text's keys, and
        its weights; ``output_search``: how its next token is found (None: the engine's default)."""
        how = self.output_search if output_search is None else check_output_search(output_search)
        if self.reserve is not None:
            self.reserve.check_text()  # let go to the texts in flight: no new one until there is room
        space.check(self.store, space.text_bytes(self.config), "a text's keys")  # a full disk: an error, not SIGBUS
        if how == "approximate":
            self.output_index()
        return self._run(SearchSession(self), how)

    def views(self) -> Run:
        """A run for the embedding views (analogy, neighbours, the map), which read no text: no
        namespace of keys is made for them, so attention is refused."""
        return self._run(SearchSession(self, keys=False), "exact")

    def _run(self, session: SearchSession, output_search: str) -> Run:
        try:
            weights = SearchWeights(self, session, output_search)  # fetches the layer norms: one request
        except BaseException:
            session.close()  # no text, no namespace
            raise
        return Run(weights, session)

    def output_index(self) -> dict:
        """The manifest's record of the approximate index over wte, or NoIndex naming the command
        that builds it (where it is missing, of another version, gone from the store, or damaged:
        ``verify.index_damage``). Asked of the store once: every token's search asks for it."""
        if self._output_index is not None:
            return self._output_index
        if self._no_index is not None:
            raise NoIndex(self._no_index)
        try:
            self._output_index = self._check_output_index()
        except NoIndex as e:
            self._no_index = str(e)
            raise
        return self._output_index

    def _check_output_index(self) -> dict:
        build = (f"run `puffergpt load --model {self.model} {self.store.cli_args()} --output-index` "
                 "to build it, or use --output-search exact")
        info = self.manifest.get("indexes", {}).get("wte")
        if info is None:
            raise NoIndex(f"model {self.model!r} has no approximate index over its token vectors in the "
                          f"{self.store.name} store: {build}")
        rebuild = build.replace("build", "rebuild", 1)
        if info.get("version") != INDEX_VERSION:
            raise NoIndex(f"model {self.model!r}'s approximate index was built by index version "
                          f"{info.get('version')}, this puffergpt reads version {INDEX_VERSION}: {rebuild}")
        ns = documents.namespace(self.key, self.config.n_embd)
        if not self.store.has_index(ns, (documents.PARTITION, "wte"), self.encoding.metric):
            raise NoIndex(f"the manifest of model {self.model!r} records an approximate index that the "
                          f"{self.store.name} store does not hold: {rebuild}")
        if self.index_damage is not None:  # its files, read in full by whoever opened the engine
            raise NoIndex(self.index_damage)
        return info

    def ready_texts(self, n: int) -> int:
        """Make n texts' namespaces of keys ahead of the learners, on a store that keeps a closed
        text's namespace for the next (``keeps_spares``, at most: the embedded store, where making
        one costs ~45 ms): the first n texts then open at once. -> how many were made (0: none kept)"""
        opened, n = [], min(n, self.store.keeps_spares)
        space.check(self.store, n * space.NAMESPACE_BYTES, f"the server's {n} spare text namespaces")
        try:
            for _ in range(n):
                opened.append(self.open())
        finally:
            for run in opened:
                run.session.close()
        return len(opened)

    def hold_reserve(self) -> None:
        """A server's: room on the store's disk held for the texts in flight, let go when the disk
        runs low while they write (``space.Reserve``), so a full disk never meets a memory map
        unprepared. NoSpace where there is no room for it; nothing where the store's disk is not
        this machine's."""
        if self.reserve is None and self.store.reserve_path() is not None:
            self.reserve = space.Reserve(self.store)

    def guard_disk(self) -> None:
        """Before a text's keys are written (``SearchSession.write_keys``): the reserve let go if
        the disk is nearly full."""
        if self.reserve is not None:
            self.reserve.guard()

    def weight_namespaces(self) -> list[str]:
        """The namespaces of this model's documents: one a matrix input width."""
        return sorted({documents.namespace(self.key, n_in) for _, n_in in documents.matrices(self.config)})
