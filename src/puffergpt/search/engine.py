"""The search-driven engine: GPT-2's products as vector searches.

``SearchProducts`` implements the seam of ``reference.py``: the forward pass is
the same code, and only the products differ. No weight matrix is held here:

- ``embed``: the wte and wpe rows of the tokens, fetched by id (one request);
- ``linear``: one search per product, every row of the matrix, all the tokens
  being read as queries of that one request (``documents.py`` turns distances
  back into outputs);
- ``attention_scores``: one request searches, for all heads and tokens at once,
  each query against the keys of its head at positions before its own; a token's
  score against its own key is arithmetic on two vectors the server holds (like
  the softmax). The new keys are written to this text's namespace, tagged layer,
  head and position: a prefill writes them before it searches them; a decode step
  writes its one token's keys concurrently, off the critical path, and the next
  search of that layer waits for the write, so a search never misses a key (and
  every search checks that it got one key for every position it asked for).
  Values stay in the server (``reference.Cache``);
- ``top_k``: the final vector searches the token vectors, the k best come back;
  ``top_k_many`` does several at once (the logit lens), ``logits`` scores all of them. With
  ``output_search="approximate"`` ``top_k`` asks the store's HNSW index over wte instead
  (``top_k_approximate``, ``output_search.py``): one request too, each logit exact.

A text's namespace also holds its expiry, moved on while the text is used, so that any server
on a shared store can drop the keys of a text nobody uses (``sweeper.py``, ``touch``).

Layer-norm parameters are fetched once, when the products are opened for a text.
Every request is logged with its kind, rows scored, bytes and latency; a decode
step makes 2 + 5 x n_layer sequential requests (62 for GPT-2 small) and
n_layer concurrent key writes.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from puffergpt.model import token_counts, untrained
from puffergpt.model.checkpoints import GPT2Config
from puffergpt.search import costs, documents, space, sweeper
from puffergpt.search.documents import Encoding
from puffergpt.search.scheduler import Batcher, Scheduler
from puffergpt.stores.base import Hits, NoIndex, Query, Store, StoreError

KEY_SCHEMA = {"layer": "int", "head": "int", "pos": "int"}
OUTPUT_SEARCHES = ("exact", "approximate")  # how the next token is found: every wte row, or the ANN index
INDEX_VERSION = 1  # of the manifest's record of the approximate index (``indexes``); another: rebuild it


def check_output_search(how) -> str:
    if how not in OUTPUT_SEARCHES:
        raise ValueError(f"output_search must be one of {', '.join(OUTPUT_SEARCHES)}, not {how!r}")
    return how


def key_scores(metric: str, dist: np.ndarray, qq: np.ndarray, kk: np.ndarray) -> np.ndarray:
    """q.k from a distance, given |q|^2 and |k|^2 (keys have no fixed length to pad to,
    so each key document carries its own |k|^2 as the attribute ``norm2``)."""
    if metric == "inner_product":
        return dist
    if metric == "euclidean_squared":
        return (qq + kk - dist) / 2  # |q - k|^2 = |q|^2 + |k|^2 - 2 q.k
    return (1 - dist) * np.sqrt(qq * kk)  # cosine distance = 1 - q.k / (|q| |k|)


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


def requests_per_token(c: GPT2Config) -> int:
    """A decode step's requests: the embedding fetch, six a layer (one a concurrent key
    write), the top-k (see the module's docstring)."""
    return 2 + 6 * c.n_layer


def round_trips_per_token(c: GPT2Config) -> int:
    """A decode step's sequential requests: the key writes run beside them."""
    return 2 + 5 * c.n_layer


class Engine:
    """A model loaded into a store. ``open()`` gives the products for one text."""

    def __init__(self, store: Store, manifest: dict, model: str, key: str, key_metric: str | None = None,
                 scheduler: Scheduler | None = None, text_ttl_s: float = sweeper.DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.time, output_search: str = "exact"):
        """``manifest``: the model's, read and checked by the caller (``manifest.open_engine``);
        ``scheduler``: the bound on texts generating at once (a server's own; default 16);
        ``text_ttl_s``: a text unused this long may have its keys dropped by any server
        (``sweeper.py``), read on ``clock`` (unix seconds); ``output_search``: how a text's next
        token is found unless it says (``OUTPUT_SEARCHES``: "approximate" needs the index)."""
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
        self.output_search = check_output_search(output_search)
        self._output_index: dict | None = None  # the index's record, once the store said it holds it
        if output_search == "approximate":
            self.output_index()  # no index: said now, not at the first token

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

    def open(self, output_search: str | None = None) -> SearchProducts:
        """The products of one text, with a namespace of its own for the text's keys;
        ``output_search``: how its next token is found (None: the engine's default)."""
        how = self.output_search if output_search is None else check_output_search(output_search)
        space.check(self.store, space.text_bytes(self.config), "a text's keys")  # a full disk: an error, not SIGBUS
        if how == "approximate":
            self.output_index()
        return SearchProducts(self, output_search=how)

    def output_index(self) -> dict:
        """The manifest's record of the approximate index over wte, or NoIndex naming the command
        that builds it (where it is missing, of another version, or gone from the store). Asked of
        the store once: every token's search asks for it, and costs one request."""
        if self._output_index is not None:
            return self._output_index
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
        self._output_index = info
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
            for p in opened:
                p.close()
        return len(opened)

    def weight_namespaces(self) -> list[str]:
        """The namespaces of this model's documents: one a matrix input width."""
        return sorted({documents.namespace(self.key, n_in) for _, n_in in documents.matrices(self.config)})

    def views(self) -> SearchProducts:
        """Products for the embedding views (analogy, neighbours, the map), which read no
        text: no namespace of keys is made for them, so attention is refused."""
        return SearchProducts(self, keys=False)


class SearchProducts:
    def __init__(self, engine: Engine, keys: bool = True, output_search: str = "exact"):
        self.engine = engine
        self.output_search = output_search  # "exact" | "approximate": how ``top_k`` finds the next token
        self.store = engine.store
        self.config = c = engine.config
        self.enc = engine.encoding
        self.key = engine.key
        self.M = {name: m["M"] for name, m in engine.manifest["matrices"].items()}
        self._recordings: list[list[Request]] = []  # the open ``recording`` blocks, outermost first
        self._extra = False  # inside ``recording(extra=True)``: requests are marked extra
        self.untrained = engine.untrained  # for the embedding views
        # One writer thread: a text's key writes land in the order they were made.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="puffergpt-keys")
        self._pending: dict[int, Future] = {}  # layer -> its latest key write
        self._closed = threading.Event()
        self.keys_ns = f"text-{uuid.uuid4().hex[:16]}" if keys else None  # 60 random bits: no two texts share one
        self.lease = None  # the namespace's expiry, where every server sees it (sweeper.py)
        if keys:
            self.store.create_namespace(self.keys_ns, c.head_dim, engine.key_schema, engine.key_metric, ephemeral=True)
        # Layer norms: the only parameters the server keeps, 2 x C numbers each.
        names = documents.norms(c)
        ns = documents.namespace(self.key, c.n_embd)
        t = time.perf_counter()
        try:
            if keys:
                self.lease = sweeper.Lease(self.store, self.keys_ns, engine.key_schema, c.head_dim,
                                           engine.text_ttl_s, engine.clock)
            v = self.store.fetch(ns, [documents.doc_id(n, r) for n in names for r in (0, 1)])[:, : c.n_embd]
        except BaseException:
            if keys:
                self.store.drop_namespace(self.keys_ns)  # no text, no namespace
            self._writer.shutdown(wait=False)
            raise
        self._log("ln", "fetch", 1, len(v), v.nbytes, len(v), t)
        self.ln = {n: (v[2 * i].copy(), v[2 * i + 1].copy()) for i, n in enumerate(names)}

    def _log(self, kind, op, queries, rows, nbytes, returned, t0, parts=None, concurrent=False,
             shared=1) -> Request:
        parts = parts or max(1, -(-queries // self.store.max_queries))  # how _search splits the batch
        r = Request(kind, op, queries, rows, int(nbytes), returned, (time.perf_counter() - t0) * 1e3, parts,
                    concurrent, self._extra, shared)
        self._record(r)
        return r

    def _record(self, r: Request) -> None:
        for requests in self._recordings:
            requests.append(r)

    @contextlib.contextmanager
    def recording(self, extra: bool = False) -> Iterator[list[Request]]:
        """The requests made inside the block (``reference.Extras``); nothing is kept outside one."""
        got: list[Request] = []
        was = self._extra
        self._recordings.append(got)
        self._extra = was or extra
        try:
            yield got
        finally:
            self._extra = was
            del self._recordings[next(i for i, r in enumerate(self._recordings) if r is got)]  # not by ==

    def _ns(self, n_in: int) -> str:
        """The namespace of this model's matrices whose input has n_in numbers (``documents.py``)."""
        return documents.namespace(self.key, n_in)

    def close(self) -> None:
        """Wait for the key writes in flight, then drop the text's namespace."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            for f in list(self._pending.values()):
                f.exception()  # wait; a failed write matters no more: the namespace goes
        finally:
            self._writer.shutdown(wait=True)
            if self.keys_ns is not None:
                self.store.drop_namespace(self.keys_ns)
                self.engine.batcher.forget(self.keys_ns)

    def touch(self) -> bool:
        """The text is in use: its namespace's expiry moved on (``sweeper.Lease``); False when
        it is past, and another server may have dropped the keys."""
        return self.lease is None or self.lease.renew()

    def slot(self, should_stop=None):
        """A generation's turn on the engine (``Scheduler.slot``): the text generates inside it."""
        return self.engine.scheduler.slot(should_stop)

    def stepping(self):
        """A step computed inside the block: other texts' searches of the weights wait for its own."""
        return self.engine.batcher.stepping()

    def wrote_token(self) -> None:
        self.engine.scheduler.wrote_token()

    def _wait_keys(self, layer: int) -> None:
        """Block until this layer's last key write has landed; a failed write fails here."""
        f = self._pending.pop(layer, None)
        if f is not None:
            f.result()

    def _search(self, ns: str, queries: list[Query], metric: str, include: tuple) -> tuple[Hits, int]:
        """One request, or as few as the store's limit on queries a request allows (the store splits),
        merged with other texts' searches of the namespace asked meanwhile (``scheduler.Batcher``;
        the weights' lanes wait for texts in lockstep, a text's own keys never)
        -> (the hits, how many texts shared the request)."""
        return self.engine.batcher.search(ns, queries, metric, tuple(include), gather=ns != self.keys_ns)

    # --- the seam ---
    def embed(self, ids, pos):
        C = self.config.n_embd
        ns = self._ns(C)
        t = time.perf_counter()
        wanted = [documents.doc_id("wte", i) for i in ids] + [documents.doc_id("wpe", p) for p in pos]
        docs = self.store.fetch(ns, wanted)
        self._log("embed", "fetch", 1, len(docs), docs.nbytes, len(docs), t)
        rows = self.enc.rows(docs, C)  # (2T, C)
        return rows[: len(ids)] + rows[len(ids):]  # wte[ids] + wpe[pos]

    def norm(self, name):
        return self.ln[name]

    def linear(self, name, x):
        n_in = x.shape[1]
        ns = self._ns(n_in)
        q = self.enc.queries(x)  # (T, in) -> (T, dim)
        rows = self.engine.manifest["matrices"][name]["rows"]
        t = time.perf_counter()
        hits, shared = self._search(ns, [Query(v, (("matrix", "=", name),)) for v in q], self.enc.metric, ("row",))
        self._log(name, "search", len(q), rows * len(q), rows * q.shape[1] * 4 * len(q), len(hits.query), t,
                  shared=shared)
        if len(hits.query) != rows * len(q):
            raise StoreError(
                f"{name}: the search returned {len(hits.query)} of {rows * len(q)} rows; "
                "the store is incomplete: run `puffergpt verify`"
            )
        dist = np.zeros((len(q), rows), np.float64)
        dist[hits.query, hits.attrs["row"]] = hits.distance
        return self.enc.outputs(dist, q, self.M[name])  # (T, out)

    def attention_scores(self, layer, q, k, pos):
        if self.keys_ns is None:
            raise StoreError(
                "these products were opened for the embedding views (Engine.views): open a text to read tokens"
            )
        H, T, hd = q.shape
        S = int(pos[-1]) + 1
        self._wait_keys(layer)  # an earlier step's write of this layer, or an old one a new key must replace
        heads, ts = np.meshgrid(np.arange(H), np.arange(T), indexing="ij")  # (H, T) each
        if T == 1:  # decode: nothing searches this token's keys before the next step
            self._pending[layer] = self._write_keys(layer, k, pos, heads, ts, concurrent=True)
        else:  # prefill: the prompt's own keys are searched next
            self._write_keys(layer, k, pos, heads, ts, concurrent=False).result()
        scores = np.full((H * T, S), -np.inf, np.float32)
        scores[np.arange(H * T), pos[ts.ravel()]] = np.einsum("hti,hti->ht", q, k).ravel()  # each token's own key
        # the first token has no earlier keys
        asks = [(h, i) for h, i in zip(heads.ravel(), ts.ravel(), strict=True) if pos[i] > 0]
        if asks:
            self._score_earlier(layer, q, pos, asks, scores)
        return scores.reshape(H, T, S)

    def _write_keys(self, layer, k, pos, heads, ts, concurrent: bool) -> Future:
        H, T, hd = k.shape
        keys = k.reshape(H * T, hd).copy()
        ids = [f"h.{layer}.{h}.{pos[i]}" for h, i in zip(heads.ravel(), ts.ravel(), strict=True)]
        attrs = {"layer": [layer] * (H * T), "head": heads.ravel(), "pos": pos[ts.ravel()]}
        if self.engine.key_metric != "inner_product":
            attrs["norm2"] = (keys.astype(np.float64) ** 2).sum(axis=1)
        req = Request(f"h.{layer}.attn.keys", "write", 0, H * T, keys.nbytes, 0, 0.0, 1, concurrent, self._extra)
        self._record(req)

        def write():
            t = time.perf_counter()
            try:
                self.store.upsert(self.keys_ns, ids, keys, attrs)
            finally:
                req.ms = (time.perf_counter() - t) * 1e3

        if not concurrent:
            f: Future = Future()
            try:
                write()
                f.set_result(None)
            except BaseException as e:
                f.set_exception(e)
            return f
        return self._writer.submit(write)

    def _score_earlier(self, layer, q, pos, asks, scores) -> None:
        """One search: each (head, token) query against its head's keys before its position."""
        hd, metric = q.shape[2], self.engine.key_metric
        queries = [Query(q[h, i], (("layer", "=", layer), ("head", "=", int(h)), ("pos", "<", int(pos[i]))))
                   for h, i in asks]
        t = time.perf_counter()
        include = ("pos",) if metric == "inner_product" else ("pos", "norm2")
        hits, shared = self._search(self.keys_ns, queries, metric, include)
        want = np.array([int(pos[i]) for _, i in asks])  # keys each query must find: positions 0..pos-1
        self._log(
            f"h.{layer}.attn.scores",
            "search",
            len(queries),
            int(want.sum()),
            int(want.sum()) * hd * 4,
            len(hits.query),
            t,
            shared=shared,
        )
        got = np.bincount(hits.query, minlength=len(asks))
        if (got != want).any():
            j = int(np.argmax(got != want))
            raise StoreError(
                f"layer {layer}: the attention search for head {asks[j][0]} at position {want[j]} returned "
                f"{got[j]} keys, not {want[j]}: the text's keys in {self.keys_ns} are missing or doubled "
                f"(the store lost them, e.g. a database restart); close the text and open it again"
            )
        rows = np.array([h * q.shape[1] + i for h, i in asks])[hits.query]  # query -> row of scores (H*T)
        if metric == "inner_product":
            scores[rows, hits.attrs["pos"]] = hits.distance
        else:
            qq = (q.reshape(-1, hd).astype(np.float64) ** 2).sum(axis=1)  # |q|^2 per (head, token)
            scores[rows, hits.attrs["pos"]] = key_scores(metric, hits.distance, qq[rows], hits.attrs["norm2"])

    def top_k(self, x, k):
        if self.output_search == "approximate":
            return self.top_k_approximate(x, k)
        return self.top_k_many(x[None], k, kind="wte.top_k")[0]

    def top_k_approximate(self, x, k, ef: int | None = None):
        """The next token's top k through the store's approximate index over wte, one request:
        (C,) -> (ids (k,), logits (k,)), best first. Which rows come back is approximate (the index
        may miss some of the true top k); each one's logit is exact, from the distance the store
        computes in full precision for it. ``ef``: the search's candidate list (the index's default)."""
        info = self.engine.output_index()
        q = self.enc.queries(x[None])  # (1, dim)
        t = time.perf_counter()
        hits = self.store.search_approximate(self._ns(self.config.n_embd), (documents.PARTITION, "wte"),
                                             [Query(q[0], top_k=k)], self.enc.metric, ("row",), ef or info["ef"])
        n = len(hits.query)  # rows whose scores came back: the store does not say how many more it scored
        self._log("wte.ann", "search", 1, n, n * q.shape[1] * 4, n, t)
        logits = self.enc.outputs(hits.distance[None], q, self.M["wte"])[0]
        order = np.argsort(-logits, kind="stable")
        return hits.attrs["row"][order].astype(np.int64), logits[order]

    def top_k_many(self, x, k, kind="lens.top_k"):
        """One request, one query a vector: (n, C) -> n x (ids (k,), logits (k,)), best first."""
        q = self.enc.queries(x)  # (n, dim)
        t = time.perf_counter()
        queries = [Query(v, (("matrix", "=", "wte"),), top_k=k) for v in q]
        hits, shared = self._search(self._ns(self.config.n_embd), queries, self.enc.metric, ("row",))
        V = self.config.n_vocab
        self._log(kind, "search", len(q), V * len(q), V * q.shape[1] * 4 * len(q), len(hits.query), t, shared=shared)
        out = []
        for i in range(len(q)):
            mine = hits.query == i  # hits come best first within each query
            logits = self.enc.outputs(hits.distance[mine][None], q[i:i + 1], self.M["wte"])[0]
            out.append((hits.attrs["row"][mine].astype(np.int64), logits))
        return out

    def _all_rows(self, matrix: str, x: np.ndarray, kind: str, include: tuple = ("row",)) -> tuple[np.ndarray, dict]:
        """Every row of a matrix scored against one vector x (C,): the outputs by row (rows,)
        and the included attributes by row. Split by row ranges where a store returns at
        most ``max_top_k`` hits a query, as one request."""
        rows = self.engine.manifest["matrices"][matrix]["rows"]
        q = self.enc.queries(x[None])  # (1, dim)
        queries = [Query(q[0], f) for f in documents.whole_matrix(matrix, rows, self.store.max_top_k)]
        t = time.perf_counter()
        hits, shared = self._search(self._ns(self.config.n_embd), queries, self.enc.metric, include)
        self._log(kind, "search", len(queries), rows, rows * q.shape[1] * 4, len(hits.query), t, shared=shared)
        if len(hits.query) != rows:
            raise StoreError(
                f"{matrix}: the search returned {len(hits.query)} of {rows} rows; "
                "the store is incomplete: run `puffergpt verify`"
            )
        order = np.argsort(hits.attrs["row"])
        y = self.enc.outputs(hits.distance[order][None], q, self.M[matrix])[0]
        return y, {a: hits.attrs[a][order] for a in include}

    def logits(self, x):
        """All n_vocab scores of the next token, one search over every wte row: (C,) -> (V,)."""
        return self._all_rows("wte", x, "wte.all")[0]

    def token_rows(self, ids) -> np.ndarray:
        """Token vectors fetched by id, for the embedding views: (n,) -> (n, C)."""
        C = self.config.n_embd
        t = time.perf_counter()
        docs = self.store.fetch(self._ns(C), [documents.doc_id("wte", int(i)) for i in ids])
        self._log("wte.fetch", "fetch", 1, len(docs), docs.nbytes, len(docs), t)
        return self.enc.rows(docs, C)

    def row(self, name: str, i: int) -> np.ndarray:
        """Row i of an embedding (wte, wpe), one fetch by id: -> (C,)"""
        if name not in ("wte", "wpe"):
            raise ValueError(f"row() reads an embedding (wte, wpe), not {name!r}")
        C = self.config.n_embd
        t = time.perf_counter()
        docs = self.store.fetch(self._ns(C), [documents.doc_id(name, int(i))])
        self._log(f"{name}.fetch", "fetch", 1, len(docs), docs.nbytes, len(docs), t)
        return self.enc.rows(docs, C)[0]

    def key_counts(self) -> list[int]:
        """Keys stored in this text's namespace, per layer: n_layer count requests (the KV cache view)."""
        out = []
        for layer in range(self.config.n_layer):
            self._wait_keys(layer)
            t = time.perf_counter()
            out.append(int(self.store.count(self.keys_ns, (("layer", "=", layer),))))
            self._log(f"h.{layer}.attn.keys", "count", 1, 0, 0, 1, t)
        return out

    def cosine_all(self, v: np.ndarray) -> np.ndarray:
        """Cosine similarity of v (C,) to every token vector, one search: q.w from the
        distance, |w| from each document's ``norm2`` attribute. (C,) -> (V,)"""
        dots, attrs = self._all_rows("wte", v, "wte.cosine", ("row", "norm2"))
        norms = np.sqrt(np.asarray(attrs["norm2"], np.float64)) * np.linalg.norm(v.astype(np.float64))
        return dots / np.maximum(norms, 1e-30)
