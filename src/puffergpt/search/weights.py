"""One text's weights on the engine: GPT-2's products as vector searches (``reference.Weights``).

The forward pass is the same code as numpy's, and only the products differ. No weight matrix
is held here, and each request is logged in the text's session (``session.py``):

- ``embed``: the wte and wpe rows of the tokens, fetched by id (one request);
- ``linear``: one search per product, every row of the matrix, all the tokens being read as
  queries of that one request (``documents.py`` turns distances back into outputs);
- ``attention_scores``: one request searches, for all heads and tokens at once, each query
  against the keys of its head at positions before its own; a token's score against its own
  key is arithmetic on two vectors the server holds (like the softmax). The new keys go to the
  text's namespace (``SearchSession.write_keys``): a prefill writes them before it searches
  them; a decode step writes its one token's keys concurrently, off the critical path, and the
  next search of that layer waits for the write, so a search never misses a key (and every
  search checks that it got one key for every position it asked for). Values stay in the
  server (``reference.Cache``);
- ``top_k``: the final vector searches the token vectors, the k best come back; ``top_k_many``
  does several at once (the logit lens), ``logits`` scores all of them. With
  ``output_search="approximate"`` ``top_k`` asks the store's HNSW index over wte instead
  (``top_k_approximate``, ``output_search.py``): one request too, each logit exact.

Layer-norm parameters are fetched once, when the weights are opened for a text.
"""

from __future__ import annotations

import time

import numpy as np

from puffergpt.search import documents
from puffergpt.search.session import SearchSession
from puffergpt.stores.base import Hits, Query, StoreError


def key_scores(metric: str, dist: np.ndarray, qq: np.ndarray, kk: np.ndarray) -> np.ndarray:
    """q.k from a distance, given |q|^2 and |k|^2 (keys have no fixed length to pad to,
    so each key document carries its own |k|^2 as the attribute ``norm2``)."""
    if metric == "inner_product":
        return dist
    if metric == "euclidean_squared":
        return (qq + kk - dist) / 2  # |q - k|^2 = |q|^2 + |k|^2 - 2 q.k
    return (1 - dist) * np.sqrt(qq * kk)  # cosine distance = 1 - q.k / (|q| |k|)


class SearchWeights:
    def __init__(self, engine, session: SearchSession, output_search: str = "exact"):
        """The products of one text on ``engine`` (``engine.Engine``, which opens them: not imported,
        engine.py imports this), or of the embedding views, where ``session`` has no keys; each
        request logged in ``session``; ``output_search``: how ``top_k`` finds the next token."""
        self.engine = engine
        self.session = session
        self.output_search = output_search  # "exact" | "approximate": how ``top_k`` finds the next token
        self.store = engine.store
        self.config = c = engine.config
        self.enc = engine.encoding
        self.key = engine.key
        self.M = {name: m["M"] for name, m in engine.manifest["matrices"].items()}
        self.untrained = engine.untrained  # for the embedding views
        # Layer norms: the only parameters the server keeps, 2 x C numbers each.
        names = documents.norms(c)
        t = time.perf_counter()
        v = self.store.fetch(self._ns(c.n_embd), [documents.doc_id(n, r) for n in names for r in (0, 1)])[:, : c.n_embd]
        self.session.log("ln", "fetch", 1, len(v), v.nbytes, len(v), t)
        self.ln = {n: (v[2 * i].copy(), v[2 * i + 1].copy()) for i, n in enumerate(names)}

    def _ns(self, n_in: int) -> str:
        """The namespace of this model's matrices whose input has n_in numbers (``documents.py``)."""
        return documents.namespace(self.key, n_in)

    def _search(self, ns: str, queries: list[Query], metric: str, include: tuple) -> tuple[Hits, int]:
        """One request, or as few as the store's limit on queries a request allows (the store splits),
        merged with other texts' searches of the namespace asked meanwhile (``scheduler.Batcher``;
        the weights' lanes wait for texts in lockstep, a text's own keys never)
        -> (the hits, how many texts shared the request)."""
        return self.engine.batcher.search(ns, queries, metric, tuple(include), gather=ns != self.session.keys_ns)

    # --- the seam ---
    def embed(self, ids, pos):
        C = self.config.n_embd
        ns = self._ns(C)
        t = time.perf_counter()
        wanted = [documents.doc_id("wte", i) for i in ids] + [documents.doc_id("wpe", p) for p in pos]
        docs = self.store.fetch(ns, wanted)
        self.session.log("embed", "fetch", 1, len(docs), docs.nbytes, len(docs), t)
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
        self.session.log(name, "search", len(q), rows * len(q), rows * q.shape[1] * 4 * len(q), len(hits.query), t,
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
        try:
            return self._attention_scores(layer, q, k, pos)
        except StoreError as e:  # the text's keys gone (swept, closed): said so, not as a store failure
            raise self.session.explain(e) from e

    def _attention_scores(self, layer, q, k, pos):
        if self.session.keys_ns is None:
            raise StoreError(
                "these weights were opened for the embedding views (Engine.views): open a text to read tokens"
            )
        H, T, hd = q.shape
        S = int(pos[-1]) + 1
        self.session.wait_keys(layer)  # an earlier step's write of this layer, or an old one a new key must replace
        # A decode step's keys are written beside the searches: nothing searches them before the
        # layer's next search, which waits for them. A prefill's are searched next: written now.
        self.session.write_keys(layer, k, pos, concurrent=T == 1)
        heads, ts = np.meshgrid(np.arange(H), np.arange(T), indexing="ij")  # (H, T) each
        scores = np.full((H * T, S), -np.inf, np.float32)
        scores[np.arange(H * T), pos[ts.ravel()]] = np.einsum("hti,hti->ht", q, k).ravel()  # each token's own key
        # the first token has no earlier keys
        asks = [(h, i) for h, i in zip(heads.ravel(), ts.ravel(), strict=True) if pos[i] > 0]
        if asks:
            self._score_earlier(layer, q, pos, asks, scores)
        return scores.reshape(H, T, S)

    def _score_earlier(self, layer, q, pos, asks, scores) -> None:
        """One search: each (head, token) query against its head's keys before its position."""
        hd, metric = q.shape[2], self.engine.key_metric
        queries = [Query(q[h, i], (("layer", "=", layer), ("head", "=", int(h)), ("pos", "<", int(pos[i]))))
                   for h, i in asks]
        t = time.perf_counter()
        include = ("pos",) if metric == "inner_product" else ("pos", "norm2")
        hits, shared = self._search(self.session.keys_ns, queries, metric, include)
        want = np.array([int(pos[i]) for _, i in asks])  # keys each query must find: positions 0..pos-1
        self.session.log(
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
                f"{got[j]} keys, not {want[j]}: the text's keys in {self.session.keys_ns} are missing or doubled "
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
        self.session.log("wte.ann", "search", 1, n, n * q.shape[1] * 4, n, t)
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
        self.session.log(kind, "search", len(q), V * len(q), V * q.shape[1] * 4 * len(q), len(hits.query), t,
                         shared=shared)
        out = []
        for i in range(len(q)):
            mine = hits.query == i  # hits come best first within each query
            logits = self.enc.outputs(hits.distance[mine][None], q[i:i + 1], self.M["wte"])[0]
            out.append((hits.attrs["row"][mine].astype(np.int64), logits))
        return out

    def token_logits(self, x, ids):
        """The scores of the tokens ``ids`` only: one search whose filter is their rows (``row in ids``),
        so each logit is the same as the top-k search's for that row: (C,), (n,) -> (n,)"""
        ids = np.asarray(ids, np.int64)
        q = self.enc.queries(x[None])  # (1, dim)
        t = time.perf_counter()
        query = Query(q[0], (("matrix", "=", "wte"), ("row", "in", tuple(int(i) for i in ids))))
        hits, shared = self._search(self._ns(self.config.n_embd), [query], self.enc.metric, ("row",))
        self.session.log("wte.scored", "search", 1, len(ids), len(ids) * q.shape[1] * 4, len(hits.query), t,
                         shared=shared)
        if len(hits.query) != len(ids):
            raise StoreError(f"wte: the search for {len(ids)} token rows returned {len(hits.query)}; "
                             "the store is incomplete: run `puffergpt verify`")
        y = self.enc.outputs(hits.distance[None], q, self.M["wte"])[0]
        by_row = dict(zip(hits.attrs["row"].tolist(), y.tolist(), strict=True))
        return np.array([by_row[int(i)] for i in ids], np.float64)

    def _all_rows(self, matrix: str, x: np.ndarray, kind: str, include: tuple = ("row",)) -> tuple[np.ndarray, dict]:
        """Every row of a matrix scored against one vector x (C,): the outputs by row (rows,)
        and the included attributes by row. Split by row ranges where a store returns at
        most ``max_top_k`` hits a query, as one request."""
        rows = self.engine.manifest["matrices"][matrix]["rows"]
        q = self.enc.queries(x[None])  # (1, dim)
        queries = [Query(q[0], f) for f in documents.whole_matrix(matrix, rows, self.store.max_top_k)]
        t = time.perf_counter()
        hits, shared = self._search(self._ns(self.config.n_embd), queries, self.enc.metric, include)
        self.session.log(kind, "search", len(queries), rows, rows * q.shape[1] * 4, len(hits.query), t, shared=shared)
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
        self.session.log("wte.fetch", "fetch", 1, len(docs), docs.nbytes, len(docs), t)
        return self.enc.rows(docs, C)

    def row(self, name: str, i: int) -> np.ndarray:
        """Row i of an embedding (wte, wpe), one fetch by id: -> (C,)"""
        if name not in ("wte", "wpe"):
            raise ValueError(f"row() reads an embedding (wte, wpe), not {name!r}")
        C = self.config.n_embd
        t = time.perf_counter()
        docs = self.store.fetch(self._ns(C), [documents.doc_id(name, int(i))])
        self.session.log(f"{name}.fetch", "fetch", 1, len(docs), docs.nbytes, len(docs), t)
        return self.enc.rows(docs, C)[0]

    def cosine_all(self, v: np.ndarray) -> np.ndarray:
        """Cosine similarity of v (C,) to every token vector, one search: q.w from the
        distance, |w| from each document's ``norm2`` attribute. (C,) -> (V,)"""
        dots, attrs = self._all_rows("wte", v, "wte.cosine", ("row", "norm2"))
        norms = np.sqrt(np.asarray(attrs["norm2"], np.float64)) * np.linalg.norm(v.astype(np.float64))
        return dots / np.maximum(norms, 1e-30)
