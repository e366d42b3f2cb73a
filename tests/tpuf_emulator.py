"""A local EMULATOR of turbopuffer's HTTP API, for the tests. It is not turbopuffer.

It speaks the part of the API that puffergpt's turbopuffer store uses, to the official
client (``turbopuffer.Turbopuffer(base_url=emulator.url)``, or TURBOPUFFER_BASE_URL),
on 127.0.0.1 at a free port, in a thread:

- POST /v2/namespaces/{ns} (write: upsert_columns, deletes, delete_by_filter, schema,
  distance_metric), DELETE /v2/namespaces/{ns}, POST /v2/namespaces/{ns}/query (and
  ?stainless_overload=multiQuery), GET /v2/namespaces/{ns}/metadata, GET /v1/namespaces;
- exact kNN (cosine_distance, euclidean_squared in float32), ordering by id or an
  attribute, Count aggregations, filters Eq NotEq In NotIn Lt Lte Gt Gte And Or Not.

Every request body is validated against the client's own request types (TypedDicts
generated from turbopuffer's OpenAPI spec, turbopuffer/types), with pydantic; the
recursive Filter type is checked leaf by leaf against the same definitions. The
documented limits are enforced, each answered as the service documents (400, 413 or
429), and recorded in ``limit_errors`` so the tests can assert the store never
triggers one: 16 sub-queries a multi_query, 16 queries in flight per namespace,
top_k at most 10,000, kNN needs a filter, the metric is fixed per namespace, vectors
of one length (at most 10,752), ids at most 64 bytes, namespace names at most 128,
filterable values at most 4 KiB, write bodies at most 256 MB, and filters on ids
only as documented (Eq, In, ranges).

Indexing lag is emulated when ``index_rate`` is set (bytes a second): a write counts
as unindexed until the rate has caught up, and writes beyond ``visible_unindexed``
bytes of unindexed data are not visible to queries until indexing makes room
(turbopuffer's guarantees page: 128 MiB). Faults for the retry tests: ``inject``
answers the next matching requests with a status, or drops the connection.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
import socket
import sys
import threading
import time
from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NotRequired, Required, get_args
from urllib.parse import parse_qs, urlparse

import numpy as np
from pydantic import TypeAdapter, ValidationError
from turbopuffer.types import custom, namespace_multi_query_params, namespace_query_params, namespace_write_params
from typing_extensions import TypedDict

LIMITS = {"multi_query": 16, "in_flight": 16, "top_k": 10_000, "filterable_bytes": 4096, "id_bytes": 64,
          "name_bytes": 128, "dims": 10_752, "request_bytes": 256_000_000, "attr_name_bytes": 128,
          "visible_unindexed": 128 << 20}
_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_TYPES = {"string": str, "int": int, "uint": int, "float": (int, float)}


def _vectors(vecs: list) -> np.ndarray | None:
    """Vectors as the client sends them: lists of numbers, or base64 of little-endian
    float32 (what the client's transform makes of float lists). None if their lengths differ."""
    rows = [
        np.frombuffer(base64.b64decode(v, validate=True), "<f4") if isinstance(v, str) else np.asarray(v, np.float32)
        for v in vecs
    ]
    if len({r.shape for r in rows}) != 1 or rows[0].ndim != 1:
        return None
    return np.stack(rows).astype(np.float32)


class Rejected(Exception):
    def __init__(self, status: int, message: str, limit: bool = False):
        super().__init__(message)
        self.status, self.message, self.limit = status, message, limit


# --- request validation, against the client's own types ---
def _flat_adapter(td, **own) -> tuple[TypeAdapter, set[str]]:
    """A TypeAdapter for one of the client's TypedDicts, with the fields whose types are
    recursive (Filter, Expr, RankBy: pydantic can't build those) checked by hand instead;
    ``own`` gives a field another type (multi_query's sub-queries, each checked on its own)."""
    scope = vars(sys.modules[td.__module__])
    fields = {}
    for k, t in td.__annotations__.items():
        text = getattr(t, "__forward_arg__", t)
        if isinstance(text, str):
            t = Any if re.search(r"Filter|Expr|RankBy", text) else eval(text, scope)  # the client's own annotation
        t = own.get(k, Any if re.search(r"Filter|Expr|RankBy", repr(t)) else t)
        fields[k] = Required[t] if k in td.__required_keys__ else NotRequired[t]
    return TypeAdapter(TypedDict(td.__name__ + "Flat", fields)), set(fields)


_WRITE, _WRITE_KEYS = _flat_adapter(namespace_write_params.NamespaceWriteParams)
_QUERY, _QUERY_KEYS = _flat_adapter(namespace_query_params.NamespaceQueryParams)
_MULTI, _MULTI_KEYS = _flat_adapter(namespace_multi_query_params.NamespaceMultiQueryParams, queries=list)
_SUB, _SUB_KEYS = _flat_adapter(namespace_multi_query_params.Query)
# Each leaf of the client's Filter union, by its operator: (attribute, op, value) tuples.
_LEAVES: dict[str, list[TypeAdapter]] = {}
for _t in get_args(custom.Filter):
    _args = get_args(_t)
    if len(_args) >= 3 and get_args(_args[1]) and _args[0] is str:
        _LEAVES.setdefault(get_args(_args[1])[0], []).append(TypeAdapter(_t))
_KNN = TypeAdapter(custom.RankByKnn)
_BY_ATTR = TypeAdapter(custom.RankByAttribute)
_COUNT = TypeAdapter(custom.AggregateBy)


def _validate(adapter: TypeAdapter, keys: set[str], body: Any, what: str) -> dict:
    if not isinstance(body, dict):
        raise Rejected(400, f"{what}: the body must be a JSON object")
    unknown = set(body) - keys
    if unknown:
        raise Rejected(400, f"{what}: unknown field(s) {sorted(unknown)}")
    try:
        adapter.validate_python(body)
    except ValidationError as e:
        raise Rejected(400, f"{what}: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None
    return body


def check_filter(f: Any) -> None:
    """A filter as the client's Filter type defines it (the recursive cases by hand)."""
    if not isinstance(f, list) or len(f) < 2:
        raise Rejected(400, f"invalid filter {f!r}")
    if f[0] in ("And", "Or") and len(f) == 2:
        if not isinstance(f[1], list):
            raise Rejected(400, f"invalid filter {f!r}: {f[0]} takes a list of filters")
        for g in f[1]:
            check_filter(g)
        return
    if f[0] == "Not" and len(f) == 2:
        return check_filter(f[1])
    adapters = _LEAVES.get(f[1]) if isinstance(f[1], str) else None
    if not adapters:
        raise Rejected(400, f"invalid filter {f!r}: unknown operator {f[1]!r}")
    for a in adapters:
        try:
            a.validate_python(f)
            return
        except ValidationError:
            pass
    raise Rejected(400, f"invalid filter {f!r}")


# --- the data ---
@dataclass
class Namespace:
    name: str
    metric: str | None = None
    dim: int | None = None
    schema: dict = field(default_factory=dict)  # attr -> {"type": ..., "filterable": bool}
    ids: list = field(default_factory=list)
    index: dict = field(default_factory=dict)  # id -> row
    vectors: list = field(default_factory=list)  # row -> np.ndarray | None
    attrs: dict = field(default_factory=dict)  # attr -> list (row -> value)
    alive: list = field(default_factory=list)
    unindexed: float = 0.0  # bytes applied but not yet indexed
    held: deque = field(default_factory=deque)  # writes not yet visible: (bytes, apply)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    in_flight: int = 0

    def rows(self) -> np.ndarray:
        return np.flatnonzero(np.asarray(self.alive, bool)) if self.alive else np.zeros(0, np.int64)

    def column(self, attr: str) -> list:
        return self.ids if attr == "id" else self.attrs.get(attr, [None] * len(self.ids))

    def put(self, doc_id, vector, values: dict) -> None:
        r = self.index.get(doc_id)
        if r is None:
            r = self.index[doc_id] = len(self.ids)
            self.ids.append(doc_id)
            self.vectors.append(None)
            self.alive.append(True)
            for col in self.attrs.values():
                col.append(None)
        self.vectors[r], self.alive[r] = vector, True
        for k in self.attrs:  # an upsert replaces the whole document
            self.attrs[k][r] = values.get(k)
        for k, v in values.items():
            if k not in self.attrs:
                self.attrs[k] = [None] * len(self.ids)
                self.attrs[k][r] = v

    def remove(self, doc_id) -> None:
        r = self.index.pop(doc_id, None)
        if r is not None:
            self.alive[r] = False


class Emulator:
    """The state and the rules; ``serve()`` puts it on 127.0.0.1."""

    def __init__(self, api_key: str = "emulator-key", index_rate: float | None = None,
                 visible_unindexed: int = LIMITS["visible_unindexed"], query_delay: float = 0.0):
        self.api_key, self.index_rate, self.visible_unindexed = api_key, index_rate, visible_unindexed
        self.query_delay = query_delay  # seconds a query takes (for the concurrency tests)
        self.namespaces: dict[str, Namespace] = {}
        self.lock = threading.RLock()
        self.limit_errors: list[tuple[int, str]] = []  # every limit a request broke
        self.internal_errors: list[str] = []  # the emulator's own failures (a test bug)
        self.log: list[dict] = []  # method, path, status, retry count, time
        self.faults: list[dict] = []
        self.max_in_flight = Counter()  # the most queries a namespace had in flight at once
        self._indexed_at = time.monotonic()
        self.url = ""

    # --- faults ---
    def inject(self, status: int | str, kind: str | None = None, count: int = 1, after: int = 0) -> None:
        """The next ``count`` requests of ``kind`` (write, query, delete, metadata, list; None: any),
        after ``after`` of them have passed, get ``status`` (an HTTP status, or "drop": the
        connection closes with no answer)."""
        with self.lock:
            self.faults.append({"status": status, "kind": kind, "count": count, "after": after})

    def clear_faults(self) -> None:
        with self.lock:
            self.faults.clear()

    def _fault(self, kind: str):
        with self.lock:
            for f in self.faults:
                if f["kind"] in (None, kind) and f["count"] > 0:
                    if f["after"] > 0:
                        f["after"] -= 1
                        return None
                    f["count"] -= 1
                    return f["status"]
        return None

    # --- indexing lag ---
    def _catch_up(self) -> None:
        """Index what the rate allows, then make visible the writes that fit the window."""
        now = time.monotonic()
        elapsed, self._indexed_at = now - self._indexed_at, now
        for ns in self.namespaces.values():
            if self.index_rate is None:
                ns.unindexed = 0.0
            else:
                ns.unindexed = max(0.0, ns.unindexed - elapsed * self.index_rate)
            while ns.held and ns.unindexed + ns.held[0][0] <= self.visible_unindexed:
                nbytes, apply = ns.held.popleft()
                apply()
                ns.unindexed += nbytes if self.index_rate is not None else 0

    def _commit(self, ns: Namespace, nbytes: int, apply) -> None:
        self._catch_up()
        if ns.held or (self.index_rate is not None and ns.unindexed + nbytes > self.visible_unindexed):
            ns.held.append((nbytes, apply))  # durable, not yet visible
        else:
            apply()
            ns.unindexed += nbytes if self.index_rate is not None else 0

    # --- endpoints ---
    def handle(self, method: str, path: str, query: dict, body: Any, headers) -> tuple[int, dict]:
        if headers.get("Authorization") != f"Bearer {self.api_key}":
            raise Rejected(401, "unauthorized: bad or missing API key")
        parts = path.strip("/").split("/")
        if method == "GET" and parts == ["v1", "namespaces"]:
            return 200, self.list_namespaces(query)
        if len(parts) < 3 or parts[:2] not in (["v2", "namespaces"], ["v1", "namespaces"]):
            raise Rejected(404, f"no such endpoint {method} {path}")
        name, rest = parts[2], parts[3:]
        self._check_name(name)
        overload = query.get("stainless_overload", [None])[0]
        if method == "POST" and rest == [] and overload is None:
            return 200, self.write(name, body)
        if method == "DELETE" and rest == []:
            return 200, self.delete_all(name)
        if method == "POST" and rest == ["query"] and overload is None:
            return 200, self.query(name, body)
        if method == "POST" and rest == ["query"] and overload == "multiQuery":
            return 200, self.multi_query(name, body)
        if method == "GET" and rest == ["metadata"]:
            return 200, self.metadata(name)
        raise Rejected(404, f"the emulator does not implement {method} {path}")

    def _check_name(self, name: str) -> None:
        if not _NAME.match(name) or len(name.encode()) > LIMITS["name_bytes"]:
            raise Rejected(400, f"invalid namespace name {name!r}: [A-Za-z0-9-_.]{{1,128}}", limit=True)

    def _get(self, name: str) -> Namespace:
        ns = self.namespaces.get(name)
        if ns is None:
            raise Rejected(404, f"namespace {name!r} not found")
        return ns

    def list_namespaces(self, query: dict) -> dict:
        prefix, cursor = query.get("prefix", [""])[0], query.get("cursor", [""])[0]
        size = int(query.get("page_size", ["100"])[0])
        with self.lock:
            names = sorted(n for n in self.namespaces if n.startswith(prefix) and n > cursor)
        page = names[:size]
        return {"namespaces": [{"id": n} for n in page], "next_cursor": page[-1] if len(names) > size else None}

    def delete_all(self, name: str) -> dict:
        with self.lock:
            self._get(name)
            del self.namespaces[name]
        return {"status": "OK"}

    def metadata(self, name: str) -> dict:
        with self.lock:
            self._catch_up()
            ns = self._get(name)
            pending = ns.unindexed + sum(b for b, _ in ns.held)
            index = {"status": "up-to-date"} if pending <= 0 else {
                "status": "updating", "unindexed_bytes": int(pending), "unindexed_rows": len(ns.held)}
            rows = ns.rows()
            return {"approx_logical_bytes": int(len(rows) * 4 * (ns.dim or 0)), "approx_row_count": int(len(rows)),
                    "created_at": ns.created, "updated_at": datetime.now(UTC).isoformat(),
                    "encryption": {"sse": True}, "index": index,
                    "schema": {k: {"type": v["type"], "filterable": v["filterable"]} for k, v in ns.schema.items()}}

    # --- writes ---
    def write(self, name: str, body: Any) -> dict:
        body = _validate(_WRITE, _WRITE_KEYS, body, "write")
        supported = {"upsert_columns", "deletes", "delete_by_filter", "schema", "distance_metric"}
        if set(body) - supported:
            raise Rejected(400, f"the emulator does not implement {sorted(set(body) - supported)}")
        with self.lock:
            ns = self.namespaces.get(name) or Namespace(name)
            schema = self._schema(ns, body.get("schema", {}))
            metric = body.get("distance_metric")
            cols = body.get("upsert_columns")
            docs, nbytes = self._check_columns(ns, schema, cols, metric) if cols else ([], 0)
            deletes = body.get("deletes", [])
            for i in deletes:
                self._check_id(i)
            flt = body.get("delete_by_filter")
            if flt is not None:
                check_filter(flt)
                self._check_filterable(ns, flt, schema)
            if name not in self.namespaces and not docs:
                if deletes or flt is not None:
                    raise Rejected(404, f"namespace {name!r} not found")
            self.namespaces[name] = ns
            ns.schema = schema
            if cols and "vector" in cols:
                ns.metric, ns.dim = metric, len(docs[0][1])

            def apply():
                for doc_id in deletes:
                    ns.remove(doc_id)
                if flt is not None:
                    for r in self._mask(ns, flt):
                        ns.remove(ns.ids[r])
                for doc_id, vec, values in docs:
                    ns.put(doc_id, vec, values)

            written = nbytes + sum(len(str(i)) for i in deletes)
            self._commit(ns, written, apply)
        return {"status": "OK", "message": "emulated write", "rows_affected": len(docs) + len(deletes),
                "rows_upserted": len(docs), "billing": {"billable_logical_bytes_written": written}}

    def _schema(self, ns: Namespace, given: dict) -> dict:
        schema = {k: dict(v) for k, v in ns.schema.items()}
        for k, v in given.items():
            conf = {"type": v, "filterable": True} if isinstance(v, str) else {"filterable": True, **v}
            if conf["type"] not in _TYPES:
                raise Rejected(400, f"the emulator does not implement attribute type {conf['type']!r}")
            if k in schema and schema[k]["type"] != conf["type"]:
                raise Rejected(400, f"attribute {k!r} has type {schema[k]['type']}, not {conf['type']}")
            schema[k] = {"type": conf["type"], "filterable": bool(conf.get("filterable", True))}
        return schema

    def _check_id(self, i) -> None:
        if isinstance(i, str):
            if not i or len(i.encode()) > LIMITS["id_bytes"]:
                raise Rejected(400, f"id {i[:80]!r} is over {LIMITS['id_bytes']} bytes", limit=True)
        elif not (isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2 ** 64):
            raise Rejected(400, f"invalid id {i!r}: an unsigned 64-bit integer, a UUID or a string")

    def _check_columns(self, ns: Namespace, schema: dict, cols: dict, metric) -> tuple[list, int]:
        ids = cols["id"]
        n = len(ids)
        for k, v in cols.items():
            if not isinstance(v, list) or len(v) != n:
                raise Rejected(400, f"column {k!r} has {len(v) if isinstance(v, list) else 'no'} values, id has {n}")
            if len(k.encode()) > LIMITS["attr_name_bytes"]:
                raise Rejected(
                    400, f"attribute name {k[:40]!r}... is over {LIMITS['attr_name_bytes']} bytes", limit=True
                )
        for i in ids:
            self._check_id(i)
        if len(set(map(str, ids))) != n:
            raise Rejected(400, "an id appears twice in one write")
        vecs = cols.get("vector")
        nbytes = sum(len(str(i)) for i in ids)
        out_vecs = [None] * n
        if vecs is not None:
            if metric is None:
                raise Rejected(400, "distance_metric is required when writing vectors")
            if ns.metric is not None and metric != ns.metric:
                raise Rejected(
                    400, f"the namespace's distance_metric is {ns.metric}; it can't be changed to {metric}", limit=True
                )
            arr = _vectors(vecs)
            if arr is None:
                raise Rejected(400, "vectors of different lengths in one write", limit=True)
            dim = arr.shape[1]
            if not 0 < dim <= LIMITS["dims"]:
                raise Rejected(400, f"vectors of {dim} dimensions: at most {LIMITS['dims']}", limit=True)
            if ns.dim is not None and dim != ns.dim:
                raise Rejected(400, f"vectors have {dim} dimensions, the namespace's have {ns.dim}", limit=True)
            out_vecs, nbytes = list(arr), nbytes + arr.nbytes
        elif ns.dim is not None:
            raise Rejected(400, "the namespace has a vector index: every document needs a vector")
        attrs = {k: v for k, v in cols.items() if k not in ("id", "vector")}
        for k, values in attrs.items():
            conf = schema.setdefault(k, {"type": self._infer(values), "filterable": True})
            for v in values:
                if v is None:
                    continue
                if not isinstance(v, _TYPES[conf["type"]]) or isinstance(v, bool):
                    raise Rejected(400, f"attribute {k!r} is {conf['type']}, got {v!r}")
                size = len(v.encode()) if isinstance(v, str) else 8
                nbytes += size
                if conf["filterable"] and size > LIMITS["filterable_bytes"]:
                    raise Rejected(400, f"attribute {k!r}: a filterable value of {size} bytes is over "
                                        f"{LIMITS['filterable_bytes']}; declare it filterable: false", limit=True)
        docs = [(ids[r], out_vecs[r], {k: v[r] for k, v in attrs.items()}) for r in range(n)]
        return docs, nbytes

    @staticmethod
    def _infer(values: list) -> str:
        v = next((x for x in values if x is not None), "")
        return "string" if isinstance(v, str) else "float" if isinstance(v, float) else "int"

    # --- queries ---
    def _enter(self, ns: Namespace, n: int) -> None:
        if ns.in_flight + n > LIMITS["in_flight"]:
            raise Rejected(429, f"too many concurrent queries on namespace {ns.name!r}: "
                                f"{ns.in_flight} in flight, {n} more, at most {LIMITS['in_flight']}", limit=True)
        ns.in_flight += n
        self.max_in_flight[ns.name] = max(self.max_in_flight[ns.name], ns.in_flight)

    def _run(self, name: str, n: int, answer):
        with self.lock:
            self._catch_up()
            ns = self._get(name)
            self._enter(ns, n)
        try:
            time.sleep(self.query_delay)
            with self.lock:
                return answer(ns)
        finally:
            with self.lock:
                ns.in_flight -= n

    def query(self, name: str, body: Any) -> dict:
        body = _validate(_QUERY, _QUERY_KEYS, body, "query")
        if body.get("consistency", {"level": "strong"}).get("level") != "strong":
            raise Rejected(400, "the emulator implements only strong consistency")
        result = self._run(name, 1, lambda ns: self._answer(ns, body))
        return {**result, "billing": result.pop("_billing"), "performance": self._performance()}

    def multi_query(self, name: str, body: Any) -> dict:
        body = _validate(_MULTI, _MULTI_KEYS, body, "multi_query")
        queries = body["queries"]
        if not isinstance(queries, list) or not queries:
            raise Rejected(400, "multi_query needs a list of queries")
        if len(queries) > LIMITS["multi_query"]:
            raise Rejected(
                400, f"{len(queries)} queries in one multi_query: at most {LIMITS['multi_query']}", limit=True
            )
        if set(body) - {"queries"}:
            raise Rejected(400, f"the emulator does not implement {sorted(set(body) - {'queries'})}")
        for q in queries:
            _validate(_SUB, _SUB_KEYS, q, "multi_query sub-query")
        results = self._run(name, len(queries), lambda ns: [self._answer(ns, q) for q in queries])
        bills = [r.pop("_billing") for r in results]
        billing = {
            k: sum(b[k] for b in bills) for k in ("billable_logical_bytes_queried", "billable_logical_bytes_returned")
        }
        return {"results": results, "billing": billing, "performance": self._performance()}

    @staticmethod
    def _performance() -> dict:
        return {"approx_namespace_size": 0, "cache_hit_ratio": 1.0, "cache_temperature": "hot",
                "exhaustive_search_count": 0, "query_execution_ms": 0, "server_total_ms": 0}

    def _answer(self, ns: Namespace, q: dict) -> dict:
        flt = q.get("filters")
        if flt is not None:
            check_filter(flt)
            self._check_filterable(ns, flt, ns.schema)
        supported = {"rank_by", "top_k", "filters", "include_attributes", "aggregate_by", "distance_metric"}
        if set(q) - supported:
            raise Rejected(400, f"the emulator does not implement {sorted(set(q) - supported)}")
        rows = self._mask(ns, flt) if flt is not None else ns.rows()
        queried = int(len(rows) * 4 * (ns.dim or 1))
        if "aggregate_by" in q:
            return self._aggregate(q, rows, queried)
        if "rank_by" not in q or "top_k" not in q:
            raise Rejected(400, "rank_by and top_k are required unless aggregate_by is set")
        top_k = q["top_k"]
        if not 1 <= top_k <= LIMITS["top_k"]:
            raise Rejected(400, f"top_k {top_k}: it must be 1 to {LIMITS['top_k']}", limit=True)
        dist, order = self._rank(ns, q, rows)
        order = order[:top_k]
        out = [self._row(ns, int(rows[j]), q.get("include_attributes"), None if dist is None else float(dist[j]))
               for j in order]
        returned = sum(len(json.dumps(r)) for r in out)
        return {
            "rows": out,
            "_billing": {"billable_logical_bytes_queried": queried, "billable_logical_bytes_returned": returned},
        }

    def _aggregate(self, q: dict, rows, queried: int) -> dict:
        if {"rank_by", "top_k", "include_attributes"} & set(q):
            raise Rejected(400, "aggregate_by can't be given with rank_by, top_k or include_attributes")
        aggs = {}
        for label, agg in q["aggregate_by"].items():
            try:
                _COUNT.validate_python(agg)
            except ValidationError:
                raise Rejected(400, f"invalid aggregation {agg!r}") from None
            if list(agg) != ["Count"]:
                raise Rejected(400, f"the emulator implements only ['Count'], not {agg!r}")
            aggs[label] = int(len(rows))
        return {
            "aggregations": aggs,
            "_billing": {"billable_logical_bytes_queried": queried, "billable_logical_bytes_returned": 0},
        }

    def _rank(self, ns: Namespace, q: dict, rows: np.ndarray):
        rank = q["rank_by"]
        if isinstance(rank, list) and len(rank) == 3 and rank[1] == "kNN":
            _KNN.validate_python(rank)
            return self._knn(ns, q, rows, rank)
        if isinstance(rank, list) and len(rank) == 3 and rank[1] == "ANN":
            raise Rejected(400, "the emulator implements exact kNN only, not ANN")
        try:
            attr, direction = _BY_ATTR.validate_python(rank)
        except ValidationError:
            raise Rejected(400, f"the emulator does not implement rank_by {str(rank)[:80]}") from None
        col = ns.column(attr)
        keyed = sorted(
            range(len(rows)), key=lambda j: (col[rows[j]] is None, col[rows[j]]), reverse=direction == "desc"
        )
        return None, np.asarray(keyed, np.int64)

    def _knn(self, ns: Namespace, q: dict, rows: np.ndarray, rank: list):
        if q.get("filters") is None:
            raise Rejected(400, "kNN (exact search) needs filters: it ranks a filtered subset", limit=True)
        if rank[0] != "vector" or ns.dim is None:
            raise Rejected(400, f"no vector attribute {rank[0]!r} in the namespace")
        if q.get("distance_metric", ns.metric) != ns.metric:
            raise Rejected(400, f"the namespace's distance_metric is {ns.metric}", limit=True)
        v = np.asarray(rank[2], np.float32)
        if v.shape != (ns.dim,):
            raise Rejected(400, f"the query vector has {v.size} dimensions, the namespace's have {ns.dim}", limit=True)
        docs = np.stack([ns.vectors[r] for r in rows]) if len(rows) else np.zeros((0, ns.dim), np.float32)
        if ns.metric == "euclidean_squared":
            d = ((docs - v) ** 2).sum(axis=1, dtype=np.float32)
        else:
            dots = docs @ v
            d = np.float32(1) - dots / (np.linalg.norm(docs, axis=1) * np.linalg.norm(v))
        return d, np.argsort(d, kind="stable")

    def _row(self, ns: Namespace, r: int, include, dist) -> dict:
        row = {"id": ns.ids[r]}
        if dist is not None:
            row["$dist"] = dist
        names = list(ns.attrs) + ["vector"] if include is True else include or []
        for a in names:
            if a == "vector":
                row["vector"] = None if ns.vectors[r] is None else ns.vectors[r].tolist()
            elif a in ns.attrs:
                row[a] = ns.attrs[a][r]
        return row

    # --- filters ---
    def _check_filterable(self, ns: Namespace, f: list, schema: dict) -> None:
        if f[0] in ("And", "Or"):
            for g in f[1]:
                self._check_filterable(ns, g, schema)
            return
        if f[0] == "Not":
            return self._check_filterable(ns, f[1], schema)
        attr, op = f[0], f[1]
        if attr == "id":
            if op not in ("Eq", "In", "Lt", "Lte", "Gt", "Gte"):
                raise Rejected(400, f"filter {op} on id is not documented for ids (use Eq, In or a range)", limit=True)
            return
        if attr in schema and not schema[attr]["filterable"]:
            raise Rejected(400, f"attribute {attr!r} is not filterable", limit=True)
        if op not in ("Eq", "NotEq", "In", "NotIn", "Lt", "Lte", "Gt", "Gte"):
            raise Rejected(400, f"the emulator does not implement the {op} filter")

    def _mask(self, ns: Namespace, f: list) -> np.ndarray:
        """The live rows that match ``f``."""
        alive = np.asarray(ns.alive, bool)
        return np.flatnonzero(alive & self._match(ns, f)) if len(alive) else np.zeros(0, np.int64)

    def _match(self, ns: Namespace, f: list) -> np.ndarray:
        n = len(ns.ids)
        if f[0] == "And":
            return np.logical_and.reduce([self._match(ns, g) for g in f[1]] + [np.ones(n, bool)])
        if f[0] == "Or":
            return np.logical_or.reduce([self._match(ns, g) for g in f[1]] + [np.zeros(n, bool)])
        if f[0] == "Not":
            return ~self._match(ns, f[1])
        col, op, v = ns.column(f[0]), f[1], f[2]
        test = {"Eq": lambda x: x == v, "NotEq": lambda x: x != v, "Lt": lambda x: x < v, "Lte": lambda x: x <= v,
                "Gt": lambda x: x > v, "Gte": lambda x: x >= v}.get(op)
        if op in ("In", "NotIn"):
            s = set(v)
            test = (lambda x: x in s) if op == "In" else (lambda x: x not in s)
        try:
            return np.fromiter((x is not None and bool(test(x)) for x in col), bool, n)
        except TypeError:
            raise Rejected(400, f"filter {f!r}: the value's type does not match the attribute's") from None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client expects
    emulator: Emulator

    def log_message(self, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        # Headers and body go out as two writes: without this, Nagle's algorithm and the
        # client's delayed ACK hold every answer for ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _serve(self, method: str) -> None:
        emu, url = self.emulator, urlparse(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        kind = {"DELETE": "delete"}.get(method) or ("list" if url.path == "/v1/namespaces" else
                                                   "metadata" if url.path.endswith("/metadata") else
                                                   "query" if url.path.endswith("/query") else "write")
        entry = {"method": method, "path": url.path, "kind": kind, "t": time.monotonic(),
                 "retry": int(self.headers.get("x-stainless-retry-count") or 0)}
        with emu.lock:
            emu.log.append(entry)
        fault = emu._fault(kind)
        if fault == "drop":
            entry["status"] = "dropped"
            self.close_connection = True
            self.connection.shutdown(2)  # no answer at all, as a dropped connection
            return
        try:
            if fault is not None:
                raise Rejected(int(fault), f"injected fault {fault}")
            if length > LIMITS["request_bytes"]:
                raise Rejected(413, f"a request body of {length} bytes is over {LIMITS['request_bytes']}", limit=True)
            if self.headers.get("Content-Encoding") == "gzip":
                raw = gzip.decompress(raw)
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                raise Rejected(400, "the body is not JSON") from None
            status, answer = emu.handle(method, url.path, parse_qs(url.query), body, self.headers)
        except Rejected as e:
            status, answer = e.status, {"status": "error", "error": e.message}
            if e.limit and fault is None:
                with emu.lock:
                    emu.limit_errors.append((e.status, e.message))
        except Exception as e:  # the emulator's own bug: loud, never a silent pass
            status, answer = 500, {"status": "error", "error": f"emulator error {type(e).__name__}: {e}"}
            with emu.lock:
                emu.internal_errors.append(f"{method} {url.path}: {type(e).__name__}: {e}")
        data = json.dumps(answer).encode()
        entry["status"] = status
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 429:
            self.send_header("retry-after-ms", "200")  # the client's backoff honours it
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._serve("GET")

    def do_POST(self):
        self._serve("POST")

    def do_DELETE(self):
        self._serve("DELETE")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # many clients connect at once in the concurrency tests


def serve(emulator: Emulator) -> tuple[_Server, threading.Thread]:
    """Start ``emulator`` on 127.0.0.1 at a free port (its ``url``); stop with server.shutdown()."""
    handler = type("Handler", (_Handler,), {"emulator": emulator})
    server = _Server(("127.0.0.1", 0), handler)
    emulator.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="tpuf-emulator", daemon=True)
    thread.start()
    return server, thread


@contextmanager
def running(**settings):
    """An emulator of its own for one test (``settings``: Emulator's), stopped at the end."""
    emu = Emulator(**settings)
    server, _ = serve(emu)
    try:
        yield emu
    finally:
        server.shutdown()
        server.server_close()
