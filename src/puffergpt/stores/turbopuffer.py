"""The turbopuffer backend: the hosted system the seed ran on.

Namespaces are turbopuffer namespaces, prefixed (``puffergpt-`` by default) so an
account can hold other data beside them. Every search is exact: ``rank_by`` is
``("vector", "kNN", q)``, never ANN, because a matrix product needs the true
distance to every document the filter matches. turbopuffer offers
``euclidean_squared`` and ``cosine_distance`` (no inner product), so models are
loaded with a padded encoding (documents.py). A namespace's metric is fixed at its
first write, so this store remembers each namespace's layout (length, attributes,
metric) as a document of its metadata namespace, ``<prefix>_meta`` (a name no
``check_name``-valid namespace can take).

turbopuffer's documented limits (https://turbopuffer.com/docs/limits, the query
and write pages), and how this store keeps to each, never relying on luck:

- 16 queries in flight per namespace, and each sub-query of a ``multi_query``
  counts: ``_InFlight`` holds a query until the namespace has room;
- 16 sub-queries a ``multi_query``; ``top_k`` at most 10,000 (a query over a
  bigger set is an error naming the fix);
- kNN needs a filter (the engine always filters; an unfiltered search is refused);
- filterable values at most 4 KiB: the metadata's JSON value is declared
  ``filterable: false``; a longer filterable string is refused before it is sent;
- ids at most 64 bytes, namespace names at most 128, vectors at most 10,752 numbers;
- a write request at most 256 MB: writes go in batches well under it;
- reads see at most 128 MiB of writes that are not yet indexed: before a write
  that would pass ``unindexed_limit``, the store waits for the index (with a
  progress line on stderr), so a read right after a load sees all of it.

The client retries 429, 5xx and dropped connections with backoff (``max_retries``);
what is left after that becomes a StoreError that says what to do. The API key,
region and base URL come from the caller (the CLI reads ``TURBOPUFFER_API_KEY``,
``TURBOPUFFER_REGION``; the client itself reads ``TURBOPUFFER_BASE_URL``, which the
tests point at a local emulator, tests/tpuf_emulator.py).
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from puffergpt.settings import Setting
from puffergpt.stores.base import Filter, Hits, Layout, Store, StoreError, check_name

MULTI_QUERY = 16  # sub-queries a multi_query request may carry
IN_FLIGHT = 16  # queries in flight per namespace (each sub-query counts)
MAX_TOP_K = 10_000  # documents a query may return
MAX_FILTERABLE_BYTES = 4096  # a filterable attribute value
MAX_ID_BYTES = 64
MAX_NAME_BYTES = 128  # a namespace name, prefix included
MAX_DIMS = 10_752
WRITE_BYTES = 32 << 20  # a write request's body, far under the 256 MB limit
WRITE_ROWS = 512  # rows a write carries at most
UNINDEXED_LIMIT = 96 << 20  # unindexed bytes a namespace may hold; reads see 128 MiB of them
TYPES = {"int": "int", "float": "float", "str": "string"}  # ours -> turbopuffer's attribute types
META_SCHEMA = {"value": {"type": "string", "filterable": False}}  # the JSON is larger than 4 KiB
_OPS = {"=": "Eq", "<": "Lt", "<=": "Lte", ">": "Gt", ">=": "Gte", "in": "In"}
META = "_meta"


def tpuf_filter(f: Filter):
    """Our filter -> turbopuffer's: ("And", [(attr, "Eq", value), ...]), JSON-ready values."""
    conds = [(a, _OPS[op], [_plain(x) for x in v] if op == "in" else _plain(v)) for a, op, v in f]
    if not conds:
        return None
    return conds[0] if len(conds) == 1 else ("And", conds)


def _plain(v):
    """numpy scalars -> Python's (the client's JSON encoder knows only those)."""
    return v.item() if isinstance(v, np.generic) else v


def _spec(info: dict) -> Layout:
    """A layout as this store keeps it in the metadata -> the base's."""
    return Layout(info["dim"], info["schema"], (info["metric"],))


def _status(e) -> int | None:
    return getattr(e, "status_code", None)


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
            raise StoreError(f"can't reach turbopuffer at {self.where}: {e}. Check the network and TURBOPUFFER_REGION, "
                             "then run the command again (what was written is kept).") from None
        except turbopuffer.RateLimitError as e:
            raise StoreError(f"turbopuffer kept answering 429 (too many requests) after {self.max_retries} retries: "
                             f"{e.message}. Wait a minute and run the command again.") from None
        except turbopuffer.InternalServerError as e:
            raise StoreError(f"turbopuffer answered {e.status_code} after {self.max_retries} retries: {e.message}. "
                             "Run the command again later (what was written is kept).") from None
        except turbopuffer.APIStatusError as e:
            raise StoreError(f"turbopuffer answered {e.status_code}: {e.message}") from None
    return run


class _InFlight:
    """At most ``limit`` queries in flight per namespace; a batch waits for room."""

    def __init__(self, limit: int):
        self.limit, self.n, self.cv = limit, Counter(), threading.Condition()

    @contextmanager
    def hold(self, ns: str, k: int):
        with self.cv:
            self.cv.wait_for(lambda: self.n[ns] + k <= self.limit)
            self.n[ns] += k
        try:
            yield
        finally:
            with self.cv:
                self.n[ns] -= k
                self.cv.notify_all()


class TurbopufferStore(Store):
    name = "turbopuffer"
    metrics = ("cosine_distance", "euclidean_squared")  # most precise first (tests/test_documents.py)
    max_queries = 4096
    thread_safe = True  # calls may run at once: its client is thread-safe, _InFlight bounds them
    # Rows an every-row query may match; the engine splits bigger matrices by row ranges. One
    # fewer than a query returns, so that a full answer means the filter matched too many.
    max_top_k = MAX_TOP_K - 1
    metric_per_namespace = True  # fixed at its first write
    settings = (  # from the environment only, the client's own variables (docs/turbopuffer.md)
        Setting("api_key", "turbopuffer's API key", env="TURBOPUFFER_API_KEY", secret=True),
        Setting("region", "the region of its namespaces (gcp-us-central1, aws-us-east-1, ...)",
                env="TURBOPUFFER_REGION"),
        Setting("base_url", "another address than the region's (a server of one's own, the tests' emulator)",
                env="TURBOPUFFER_BASE_URL"),
    )

    def __init__(self, api_key: str | None = None, region: str | None = None, base_url: str | None = None,
                 prefix: str = "puffergpt-", timeout: float = 60.0, max_retries: int = 5,
                 unindexed_limit: int = UNINDEXED_LIMIT, index_poll_s: float = 1.0):
        import turbopuffer

        if not api_key:
            raise StoreError("the turbopuffer backend needs an API key: set TURBOPUFFER_API_KEY")
        if not region and not base_url:
            raise StoreError("the turbopuffer backend needs a region: set TURBOPUFFER_REGION "
                             "(e.g. gcp-us-central1 or aws-us-east-1, see https://turbopuffer.com/docs/regions)")
        if not prefix or len(prefix.encode()) >= MAX_NAME_BYTES - len(META) or not check_name(prefix + "x"):
            raise StoreError(f"invalid namespace prefix {prefix!r}")
        self.region, self.prefix, self.max_retries = region, prefix, max_retries
        self.where = base_url or f"region {region!r}"
        try:  # with a base URL, a region (even from the environment) is an error in the client: drop it
            self.client = turbopuffer.Turbopuffer(
                api_key=api_key,
                region=None if base_url else region,
                base_url=base_url,
                timeout=timeout,
                max_retries=max_retries,
            )
        except turbopuffer.TurbopufferError as e:
            raise StoreError(f"can't set up the turbopuffer client: {e}") from None
        self.unindexed_limit, self.index_poll_s = unindexed_limit, index_poll_s
        self.billed = Counter()  # billable bytes as the service reports them (written, queried, returned)
        self._info: dict[str, dict] = {}
        self._unindexed: Counter = Counter()  # bytes written to a namespace since it was last seen indexed
        self._in_flight = _InFlight(IN_FLIGHT)
        self._pool = ThreadPoolExecutor(max_workers=8)

    # --- requests, each within the limits ---
    def _name(self, ns: str) -> str:
        full = self.prefix + check_name(ns)
        if len(full.encode()) > MAX_NAME_BYTES:
            raise StoreError(
                f"namespace name {full!r} is over turbopuffer's {MAX_NAME_BYTES} bytes: use a shorter name or prefix"
            )
        return full

    def _ns(self, ns: str):
        return self.client.namespace(self._name(ns))

    def _meta_ns(self):
        return self.client.namespace(self.prefix + META)

    def _bill(self, billing) -> None:
        if billing is None:
            return
        for k in (
            "billable_logical_bytes_written",
            "billable_logical_bytes_queried",
            "billable_logical_bytes_returned",
        ):
            self.billed[k.removeprefix("billable_logical_bytes_")] += getattr(billing, k, 0) or 0
        self._bill(getattr(billing, "query", None))

    def _query(self, handle, name: str, **kwargs):
        with self._in_flight.hold(name, 1):
            r = handle.query(**kwargs)
        self._bill(r.billing)
        return r

    def _multi_query(self, name: str, subs: list[dict]):
        with self._in_flight.hold(name, len(subs)):
            r = self.client.namespace(name).multi_query(queries=subs)
        self._bill(r.billing)
        return r.results

    def _write(self, handle, **kwargs):
        r = handle.write(**kwargs)
        self._bill(r.billing)
        return r

    # --- metadata, kept as documents of one namespace with no vectors ---
    def _meta_id(self, key: str) -> str:
        if not isinstance(key, str) or not key or len(key.encode()) > MAX_ID_BYTES:
            raise StoreError(
                f"metadata key {key!r} is over turbopuffer's {MAX_ID_BYTES}-byte id limit: use a shorter model name"
            )
        return key

    @_errors
    def _put_meta(self, key, value):
        self._write(self._meta_ns(), upsert_columns={"id": [self._meta_id(key)], "value": [json.dumps(value)]},
                    schema=META_SCHEMA)

    @_errors
    def _get_meta(self, key):
        try:
            rows = self._query(self._meta_ns(), self.prefix + META, filters=("id", "Eq", self._meta_id(key)),
                               rank_by=("id", "asc"), top_k=1, include_attributes=["value"]).rows or []
        except Exception as e:
            if _status(e) == 404:  # the metadata namespace was never written
                return None
            raise
        return json.loads(rows[0]["value"]) if rows else None

    def _layout(self, ns):
        if ns not in self._info:
            self._layout_id(ns)
            info = self._get_meta(f"namespace:{ns}")
            if info is None:
                return None
            self._info[ns] = info
        return _spec(self._info[ns])

    def _layout_id(self, ns: str) -> str:
        """The id of ns's layout in the metadata (within turbopuffer's id and name limits)."""
        self._name(ns)
        room = MAX_ID_BYTES - len("namespace:")
        if len(ns.encode()) > room:  # its layout's id must fit turbopuffer's id limit
            raise StoreError(
                f"namespace name {ns!r} is over {room} bytes, "
                f"all that turbopuffer's {MAX_ID_BYTES}-byte ids leave for it"
            )
        return f"namespace:{ns}"

    # --- namespaces ---
    def _create_namespace(self, ns, layout, ephemeral):
        key = self._layout_id(ns)
        if not layout.dim <= MAX_DIMS:
            raise StoreError(f"vectors of length {layout.dim}: turbopuffer takes 1 to {MAX_DIMS}")
        if (old := self._layout(ns)) is not None:
            return old
        want = {"dim": layout.dim, "schema": dict(layout.schema), "metric": layout.metrics[0]}
        self._put_meta(key, want)
        self._info[ns] = want
        return None

    @_errors
    def _drop_namespace(self, ns):
        self._delete_all(ns)
        self._write(self._meta_ns(), deletes=[self._meta_id(f"namespace:{ns}")])
        self._info.pop(ns, None)

    def _delete_all(self, ns: str) -> None:
        try:
            self._ns(ns).delete_all()
        except Exception as e:
            if _status(e) != 404:  # never written: nothing to drop
                raise
        self._unindexed.pop(ns, None)

    @_errors
    def forget(self):
        """Drop this prefix's metadata namespace (once its namespaces are dropped)."""
        try:
            self._meta_ns().delete_all()
        except Exception as e:
            if _status(e) != 404:
                raise
        self._info.clear()

    @_errors
    def _namespaces(self, prefix):
        """Namespaces whose name starts with ``prefix``: an id range of the metadata (a
        documented filter on ids; Glob is not), page by page."""
        low = f"namespace:{prefix}"
        high = low[:-1] + chr(ord(low[-1]) + 1)  # the first string after every one that starts with low
        found, bound = {}, ("id", "Gte", low)
        while True:
            try:
                rows = self._query(self._meta_ns(), self.prefix + META, filters=("And", [bound, ("id", "Lt", high)]),
                                   rank_by=("id", "asc"), top_k=MAX_TOP_K, include_attributes=["value"]).rows or []
            except Exception as e:
                if _status(e) == 404:  # nothing was ever created
                    return {}
                raise
            found |= {r.id.removeprefix("namespace:"): _spec(json.loads(r["value"])) for r in rows}
            if len(rows) < MAX_TOP_K:
                return found
            bound = ("id", "Gt", rows[-1].id)

    # --- documents ---
    @_errors
    def _upsert(self, ns, layout, ids, vectors, cols):
        self._check_values(ids, cols, layout.schema)
        row_bytes = 12 * layout.dim + MAX_ID_BYTES + 32 * len(cols)  # JSON of a row, generously
        logical = 4 * layout.dim + MAX_ID_BYTES + 8 * len(cols)  # what the service counts of a row, at most
        step = max(1, min(WRITE_ROWS, WRITE_BYTES // row_bytes, self.unindexed_limit // logical))
        schema = {k: TYPES[t] for k, t in layout.schema.items()}
        for s in range(0, len(ids), step):
            e = min(s + step, len(ids))
            self._make_room(ns, (e - s) * logical)
            r = self._write(self._ns(ns), upsert_columns={"id": ids[s:e], "vector": vectors[s:e].tolist(),
                                                          **{k: v[s:e] for k, v in cols.items()}},
                            distance_metric=layout.metrics[0], schema=schema)
            self._unindexed[ns] += r.billing.billable_logical_bytes_written if r.billing else 0

    @staticmethod
    def _check_values(ids: list[str], cols: dict, schema: dict) -> None:
        """Ids and filterable strings within turbopuffer's limits, before anything is sent."""
        for i in ids:
            if not i or len(i.encode()) > MAX_ID_BYTES:
                raise StoreError(f"document id {i!r} is empty or over turbopuffer's {MAX_ID_BYTES} bytes")
        for k, t in schema.items():
            if t == "str":
                for v in cols[k]:
                    if len(str(v).encode()) > MAX_FILTERABLE_BYTES:
                        raise StoreError(f"attribute {k!r} has a value of {len(str(v).encode())} bytes; "
                                         f"turbopuffer filters values of at most {MAX_FILTERABLE_BYTES}")

    def _make_room(self, ns: str, nbytes: int) -> None:
        """Wait until the namespace's unindexed writes leave room for ``nbytes`` more, so
        that every read sees every write (reads see at most 128 MiB of unindexed data)."""
        if self._unindexed[ns] + nbytes <= self.unindexed_limit:
            return
        shown = 0.0
        while True:
            left = self._unindexed_bytes(ns)
            if left == 0 or left + nbytes <= self.unindexed_limit:
                self._unindexed[ns] = left
                return
            if time.monotonic() - shown > 10 * self.index_poll_s:
                print(
                    f"turbopuffer is indexing {self._name(ns)}: {left / 1e6:.1f} MB to go before the next write",
                    file=sys.stderr,
                )
                shown = time.monotonic()
            time.sleep(self.index_poll_s)

    def _unindexed_bytes(self, ns: str) -> int:
        """Bytes written to ns that its index does not hold yet, as the service reports them."""
        try:
            index = self._ns(ns).metadata().index
        except Exception as e:
            if _status(e) == 404:  # never written: nothing to wait for
                return 0
            raise
        status = index.get("status") if isinstance(index, dict) else getattr(index, "status", None)
        if status == "up-to-date":
            return 0
        return int(index.get("unindexed_bytes", 0) if isinstance(index, dict) else getattr(index, "unindexed_bytes", 0))

    @_errors
    def _fetch(self, ns, layout, ids):
        got = {}
        name = self._name(ns)
        for s in range(0, len(ids), MAX_TOP_K):
            chunk = ids[s:s + MAX_TOP_K]
            try:
                rows = self._query(self._ns(ns), name, filters=("id", "In", chunk), rank_by=("id", "asc"),
                                   top_k=len(chunk), include_attributes=["vector"]).rows or []
            except Exception as e:
                if _status(e) != 404:  # created, never written: every id is missing
                    raise
                rows = []
            got |= {r.id: np.asarray(r.vector, np.float32) for r in rows}
        return got

    @_errors
    def _delete(self, ns, layout, filter):
        if not filter:  # everything: the namespace's documents go, its layout stays
            self._delete_all(ns)
            return
        try:
            self._write(self._ns(ns), delete_by_filter=tpuf_filter(filter))
        except Exception as e:
            if _status(e) != 404:
                raise

    @_errors
    def _count(self, ns, layout, filter):
        kwargs = {"aggregate_by": {"n": ("Count",)}}
        if filter:
            kwargs["filters"] = tpuf_filter(filter)
        try:
            return int(self._query(self._ns(ns), self._name(ns), **kwargs).aggregations["n"])
        except Exception as e:
            if _status(e) == 404:  # created but never written
                return 0
            raise

    @_errors
    def _search(self, ns, layout, queries, metric, include):
        subs = [self._sub_query(q, include) for q in queries]
        name = self._name(ns)
        chunks = [subs[s:s + MULTI_QUERY] for s in range(0, len(subs), MULTI_QUERY)]
        try:
            results = [r for res in self._pool.map(lambda c: self._multi_query(name, c), chunks) for r in res]
        except Exception as e:
            if _status(e) != 404:
                raise
            results = [type("Empty", (), {"rows": []})] * len(subs)  # created, never written
        qi, dist, cols = [], [], {a: [] for a in include}
        for i, r in enumerate(results):
            rows = r.rows or []
            if queries[i].top_k is None and len(rows) >= MAX_TOP_K:
                raise StoreError(f"a query matched more than {MAX_TOP_K} documents; split it by a filter on row ranges")
            qi += [i] * len(rows)
            dist += [r["$dist"] for r in rows]
            for a in include:
                cols[a] += [r[a] for r in rows]
        return Hits(np.asarray(qi, np.int64), np.asarray(dist, np.float64), {a: np.asarray(v) for a, v in cols.items()})

    @staticmethod
    def _sub_query(q, include) -> dict:
        if not q.filter:  # turbopuffer's exact kNN runs over a filtered subset only
            raise StoreError("turbopuffer's exact kNN search needs a filter on every query")
        top_k = MAX_TOP_K if q.top_k is None else int(q.top_k)
        if not 0 < top_k <= MAX_TOP_K:
            raise StoreError(f"top_k {top_k}: turbopuffer returns 1 to {MAX_TOP_K} documents a query")
        return {"rank_by": ("vector", "kNN", np.asarray(q.vector, np.float32).tolist()), "top_k": top_k,
                "filters": tpuf_filter(q.filter), "include_attributes": list(include)}

    def cli_args(self):
        return "--backend turbopuffer"

    def close(self):
        self._pool.shutdown(wait=False)
        self.client.close()
