"""The turbopuffer backend: the hosted system the seed ran on.

Namespaces are turbopuffer namespaces, prefixed (``puffergpt-`` by default) so an
account can hold other data beside them. Every search is exact: ``rank_by`` is
``("vector", "kNN", q)``, never ANN, because a matrix product needs the true
distance to every document the filter matches. turbopuffer offers
``euclidean_squared`` and ``cosine_distance`` (no inner product), so models are
loaded with a padded encoding (documents.py). A namespace's metric is fixed at its
first write, so this store remembers each namespace's metric in its metadata.

Batches of queries go out as ``multi_query`` requests of at most 16 queries, sent
concurrently; writes go in batches under the request size limit. The client
retries 429 and 5xx with backoff. The API key and region come from the
caller (the CLI reads ``TURBOPUFFER_API_KEY`` and ``TURBOPUFFER_REGION``).
"""

from __future__ import annotations

import functools
import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from puffergpt.stores.base import Filter, Hits, Store, StoreError, check_filter, check_name, check_upsert

MULTI_QUERY = 16  # sub-queries a request may carry
MAX_TOP_K = 10_000  # documents a query may return
WRITE_ROWS = 512  # rows a write carries (3,074 floats a row stays far under the size limit)
_OPS = {"=": "Eq", "<": "Lt", "<=": "Lte", ">": "Gt", ">=": "Gte", "in": "In"}
META = "_meta"


def tpuf_filter(f: Filter):
    """Our filter -> turbopuffer's: ("And", [(attr, "Eq", value), ...])."""
    conds = [(a, _OPS[op], list(v) if op == "in" else _plain(v)) for a, op, v in f]
    if not conds:
        return None
    return conds[0] if len(conds) == 1 else ("And", conds)


def _plain(v):
    return v.item() if isinstance(v, np.generic) else v


def _errors(method):
    """turbopuffer's exceptions become StoreErrors that say what to do."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        import turbopuffer

        try:
            return method(self, *args, **kwargs)
        except turbopuffer.AuthenticationError:
            raise StoreError("turbopuffer rejected the API key: check TURBOPUFFER_API_KEY") from None
        except turbopuffer.APIConnectionError as e:
            raise StoreError(f"can't reach turbopuffer (region {self.region!r}): {e}. Check the network and TURBOPUFFER_REGION.") from None
        except turbopuffer.APIStatusError as e:
            raise StoreError(f"turbopuffer answered {e.status_code}: {e.message}") from None
    return run


class TurbopufferStore(Store):
    name = "turbopuffer"
    metrics = ("cosine_distance", "euclidean_squared")  # most precise first (tests/test_documents.py)
    max_queries = 4096

    def __init__(self, api_key: str | None, region: str | None, prefix: str = "puffergpt-", timeout: float = 60.0):
        import turbopuffer

        if not api_key:
            raise StoreError("the turbopuffer backend needs an API key: set TURBOPUFFER_API_KEY")
        self.region = region
        self.prefix = prefix
        self.client = turbopuffer.Turbopuffer(api_key=api_key, region=region, timeout=timeout, max_retries=5)
        self._info: dict[str, dict] = {}
        self._pool = ThreadPoolExecutor(max_workers=8)

    def _ns(self, ns: str):
        return self.client.namespace(self.prefix + check_name(ns))

    # --- metadata, kept as documents of one namespace ---
    @_errors
    def put_meta(self, key, value):
        self._ns(META).write(upsert_columns={"id": [key], "vector": [[0.0]], "value": [json.dumps(value)]},
                             distance_metric="euclidean_squared")

    @_errors
    def get_meta(self, key):
        try:
            rows = self._ns(META).query(filters=("id", "Eq", key), rank_by=("id", "asc"), top_k=1,
                                        include_attributes=["value"]).rows or []
        except Exception as e:  # a namespace that was never written is a 404
            if getattr(e, "status_code", None) == 404:
                return None
            raise
        return json.loads(rows[0]["value"]) if rows else None

    def _layout(self, ns: str) -> dict:
        if ns not in self._info:
            info = self.get_meta(f"namespace:{ns}")
            if info is None:
                raise StoreError(f"namespace {ns!r} does not exist")
            self._info[ns] = info
        return self._info[ns]

    # --- namespaces ---
    def create_namespace(self, ns, dim, schema, metric=None, ephemeral=False):
        check_name(ns)
        want = {"dim": int(dim), "schema": schema, "metric": metric or self.metrics[0]}
        old = self.get_meta(f"namespace:{ns}")
        if old is not None:
            if (old["dim"], old["schema"]) != (want["dim"], want["schema"]):
                raise StoreError(f"namespace {ns!r} exists with another layout {old}; drop it first")
            return
        self.put_meta(f"namespace:{ns}", want)
        self._info[ns] = want

    @_errors
    def drop_namespace(self, ns):
        try:
            self._ns(ns).delete_all()
        except Exception as e:
            if getattr(e, "status_code", None) != 404:  # never written: nothing to drop
                raise
        self._ns(META).write(deletes=[f"namespace:{ns}"])
        self._info.pop(ns, None)

    @_errors
    def namespaces(self, prefix=""):
        rows = self._ns(META).query(filters=("id", "Glob", f"namespace:{prefix}*"), rank_by=("id", "asc"),
                                    top_k=MAX_TOP_K).rows or []
        return sorted(r.id.removeprefix("namespace:") for r in rows)

    # --- documents ---
    @_errors
    def upsert(self, ns, ids, vectors, attrs):
        info = self._layout(ns)
        vectors = np.asarray(vectors, np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != info["dim"]:
            raise StoreError(f"vectors have shape {vectors.shape}, the namespace holds vectors of length {info['dim']}")
        check_upsert(ns, ids, vectors, attrs, info["schema"])
        for s in range(0, len(ids), WRITE_ROWS):
            e = s + WRITE_ROWS
            cols = {"id": list(ids[s:e]), "vector": vectors[s:e].tolist(),
                    **{k: [_plain(v) for v in np.asarray(attrs[k])[s:e]] for k in info["schema"]}}
            self._ns(ns).write(upsert_columns=cols, distance_metric=info["metric"])

    @_errors
    def fetch(self, ns, ids):
        info = self._layout(ns)
        got = {}
        for s in range(0, len(ids), MAX_TOP_K):
            chunk = list(ids[s:s + MAX_TOP_K])
            rows = self._ns(ns).query(filters=("id", "In", chunk), rank_by=("id", "asc"), top_k=len(chunk),
                                      include_attributes=["vector"]).rows or []
            got |= {r.id: r.vector for r in rows}
        missing = [i for i in ids if i not in got]
        if missing:
            raise StoreError(f"namespace {ns!r} has no document {missing[0]!r} ({len(missing)} missing); the store is incomplete: run `puffergpt load` again")
        return np.asarray([got[i] for i in ids], np.float32).reshape(len(ids), info["dim"])

    @_errors
    def delete(self, ns, filter):
        info = self._layout(ns)
        check_filter(filter, info["schema"])
        self._ns(ns).write(delete_by_filter=tpuf_filter(filter) or ("id", "NotEq", None))

    @_errors
    def count(self, ns, filter=()):
        info = self._layout(ns)
        check_filter(filter, info["schema"])
        kwargs = {"aggregate_by": {"n": ("Count",)}}
        if filter:
            kwargs["filters"] = tpuf_filter(filter)
        try:
            return int(self._ns(ns).query(**kwargs).aggregations["n"])
        except Exception as e:
            if getattr(e, "status_code", None) == 404:  # created but never written
                return 0
            raise

    @_errors
    def search(self, ns, queries, metric, include=()):
        info = self._layout(ns)
        if metric != info["metric"]:
            raise StoreError(f"namespace {ns!r} was written for {info['metric']}; it can't be searched with {metric!r}")
        self.check_search(queries, metric, include, info["schema"])
        subs = []
        for q in queries:
            sub = {"rank_by": ("vector", "kNN", np.asarray(q.vector, np.float32).tolist()),
                   "top_k": MAX_TOP_K if q.top_k is None else int(q.top_k), "include_attributes": list(include)}
            if q.filter:
                sub["filters"] = tpuf_filter(q.filter)
            subs.append(sub)
        chunks = [subs[s:s + MULTI_QUERY] for s in range(0, len(subs), MULTI_QUERY)]
        results = list(self._pool.map(lambda c: self._ns(ns).multi_query(queries=c).results, chunks))
        qi, dist, cols = [], [], {a: [] for a in include}
        for c, res in enumerate(results):
            for j, r in enumerate(res):
                rows = r.rows or []
                i = c * MULTI_QUERY + j
                if queries[i].top_k is None and len(rows) >= MAX_TOP_K:
                    raise StoreError(f"a query matched more than {MAX_TOP_K} documents; split it by a filter on row ranges")
                qi += [i] * len(rows)
                dist += [r["$dist"] for r in rows]
                for a in include:
                    cols[a] += [r[a] for r in rows]
        return Hits(np.asarray(qi, np.int64), np.asarray(dist, np.float64), {a: np.asarray(v) for a, v in cols.items()})

    def cli_args(self):
        return "--backend turbopuffer"

    def close(self):
        self._pool.shutdown(wait=False)
        self.client.close()
