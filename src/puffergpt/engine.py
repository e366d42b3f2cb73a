"""The search-driven engine: GPT-2's products as vector searches.

``SearchProducts`` implements the seam of ``reference.py``: the forward pass is
the same code, and only the products differ. No weight matrix is held here:

- ``embed``: the wte and wpe rows of the tokens, fetched by id (one request);
- ``linear``: one search per product, every row of the matrix, all the tokens
  being read as queries of that one request (``documents.py`` turns distances
  back into outputs);
- ``attention_scores``: the new keys are written to this text's namespace,
  tagged layer, head and position; then one request searches, for all heads and
  tokens at once, each query against the keys of its head at or before its own
  position. Values stay in the server (``reference.Cache``);
- ``top_k``: the final vector searches the token vectors, the k best come back.

Layer-norm parameters are fetched once, when the products are opened for a text.
Every request is logged with its kind, rows scored, bytes and latency.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import numpy as np

from puffergpt import costs, loading
from puffergpt.checkpoints import GPT2Config
from puffergpt.documents import Encoding
from puffergpt.stores.base import Hits, Query, Store, StoreError

KEY_SCHEMA = {"layer": "int", "head": "int", "pos": "int"}


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

    def to_json(self) -> dict:
        return {**self.__dict__, "ms": round(self.ms, 3)}

    def cost_usd(self) -> float:
        return costs.request_cost(self.op, self.bytes, self.returned, self.queries)


def requests_per_token(c: GPT2Config) -> int:
    """The embedding fetch, six requests a layer, the top-k (see the module's docstring)."""
    return 2 + 6 * c.n_layer


class Engine:
    """A model loaded into a store. ``open()`` gives the products for one text."""

    def __init__(self, store: Store, model: str, key: str | None = None, key_metric: str | None = None):
        self.store = store
        self.model = model
        self.key = key or loading.model_key(model)
        self.manifest = loading.manifest(store, self.key, model)
        self.config = GPT2Config(**self.manifest["config"])
        self.encoding = Encoding(self.manifest["metric"])
        # Keys use the most precise metric this store has.
        self.key_metric = key_metric or store.metrics[0]
        if self.key_metric not in store.metrics:
            raise StoreError(f"the {store.name} store has no {self.key_metric!r} search")
        self.key_schema = KEY_SCHEMA if self.key_metric == "inner_product" else KEY_SCHEMA | {"norm2": "float"}

    def open(self) -> "SearchProducts":
        return SearchProducts(self)


class SearchProducts:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.store = engine.store
        self.config = c = engine.config
        self.enc = engine.encoding
        self.key = engine.key
        self.M = {name: m["M"] for name, m in engine.manifest["matrices"].items()}
        self.log: list[Request] = []
        self.keys_ns = f"text-{uuid.uuid4().hex[:16]}"
        self.store.create_namespace(self.keys_ns, c.head_dim, engine.key_schema, engine.key_metric, ephemeral=True)
        # Layer norms: the only parameters the server keeps, 2 x C numbers each.
        names = loading.norms(c)
        ns = loading.namespace(self.key, c.n_embd)
        t = time.perf_counter()
        try:
            v = self.store.fetch(ns, [f"{n}.{r}" for n in names for r in (0, 1)])[:, : c.n_embd]
        except BaseException:
            self.store.drop_namespace(self.keys_ns)  # no text, no namespace
            raise
        self._log("ln", "fetch", 1, len(v), v.nbytes, len(v), t)
        self.ln = {n: (v[2 * i].copy(), v[2 * i + 1].copy()) for i, n in enumerate(names)}

    def _log(self, kind, op, queries, rows, nbytes, returned, t0) -> None:
        parts = max(1, -(-queries // self.store.max_queries))  # how _search splits the batch
        self.log.append(Request(kind, op, queries, rows, int(nbytes), returned, (time.perf_counter() - t0) * 1e3, parts))

    def close(self) -> None:
        self.store.drop_namespace(self.keys_ns)

    def _search(self, ns: str, queries: list[Query], metric: str, include: tuple) -> Hits:
        """One request, or as few as the store's limit on queries a request allows."""
        n = self.store.max_queries
        if len(queries) <= n:
            return self.store.search(ns, queries, metric, include=include)
        starts = range(0, len(queries), n)
        return Hits.concat([self.store.search(ns, queries[s:s + n], metric, include=include) for s in starts], include, starts)

    # --- the seam ---
    def embed(self, ids, pos):
        C = self.config.n_embd
        ns = loading.namespace(self.key, C)
        t = time.perf_counter()
        docs = self.store.fetch(ns, [f"wte.{i}" for i in ids] + [f"wpe.{p}" for p in pos])
        self._log("embed", "fetch", 1, len(docs), docs.nbytes, len(docs), t)
        rows = self.enc.rows(docs, C)  # (2T, C)
        return rows[: len(ids)] + rows[len(ids):]  # wte[ids] + wpe[pos]

    def norm(self, name):
        return self.ln[name]

    def linear(self, name, x):
        n_in = x.shape[1]
        ns = loading.namespace(self.key, n_in)
        q = self.enc.queries(x)  # (T, in) -> (T, dim)
        rows = self.engine.manifest["matrices"][name]["rows"]
        t = time.perf_counter()
        hits = self._search(ns, [Query(v, (("matrix", "=", name),)) for v in q], self.enc.metric, ("row",))
        self._log(name, "search", len(q), rows * len(q), rows * q.shape[1] * 4 * len(q), len(hits.query), t)
        if len(hits.query) != rows * len(q):
            raise StoreError(f"{name}: the search returned {len(hits.query)} of {rows * len(q)} rows; the store is incomplete: run `puffergpt verify`")
        dist = np.zeros((len(q), rows), np.float64)
        dist[hits.query, hits.attrs["row"]] = hits.distance
        return self.enc.outputs(dist, q, self.M[name])  # (T, out)

    def attention_scores(self, layer, q, k, pos):
        H, T, hd = q.shape
        S = int(pos[-1]) + 1
        heads, ts = np.meshgrid(np.arange(H), np.arange(T), indexing="ij")  # (H, T) each
        keys = k.reshape(H * T, hd)
        attrs = {"layer": [layer] * (H * T), "head": heads.ravel(), "pos": pos[ts.ravel()]}
        metric = self.engine.key_metric
        if metric != "inner_product":
            attrs["norm2"] = (keys.astype(np.float64) ** 2).sum(axis=1)
        t = time.perf_counter()
        self.store.upsert(self.keys_ns, [f"h.{layer}.{h}.{pos[i]}" for h, i in zip(heads.ravel(), ts.ravel())], keys, attrs)
        self._log(f"h.{layer}.attn.keys", "write", 0, H * T, k.nbytes, 0, t)
        queries = [Query(q[h, i], (("layer", "=", layer), ("head", "=", int(h)), ("pos", "<=", int(pos[i]))))
                   for h, i in zip(heads.ravel(), ts.ravel())]
        t = time.perf_counter()
        include = ("pos",) if metric == "inner_product" else ("pos", "norm2")
        hits = self._search(self.keys_ns, queries, metric, include)
        scored = int(H * (pos + 1).sum())
        self._log(f"h.{layer}.attn.scores", "search", len(queries), scored, scored * hd * 4, len(hits.query), t)
        scores = np.full((H * T, S), -np.inf, np.float32)
        if metric == "inner_product":
            scores[hits.query, hits.attrs["pos"]] = hits.distance
        else:
            qq = (q.reshape(H * T, hd).astype(np.float64) ** 2).sum(axis=1)  # |q|^2 per query
            scores[hits.query, hits.attrs["pos"]] = key_scores(metric, hits.distance, qq[hits.query], hits.attrs["norm2"])
        return scores.reshape(H, T, S)

    def top_k(self, x, k):
        C = self.config.n_embd
        q = self.enc.queries(x[None])  # (1, dim)
        t = time.perf_counter()
        hits = self.store.search(loading.namespace(self.key, C), [Query(q[0], (("matrix", "=", "wte"),), top_k=k)],
                                 self.enc.metric, include=("row",))
        V = self.config.n_vocab
        self._log("wte.top_k", "search", 1, V, V * q.shape[1] * 4, len(hits.query), t)
        logits = self.enc.outputs(hits.distance[None], q, self.M["wte"])[0]
        return hits.attrs["row"].astype(np.int64), logits
