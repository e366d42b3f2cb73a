"""The store seam: what puffergpt needs from a vector database, and what a backend writes.

Small on purpose, so that it maps onto an embedded engine, PostgreSQL with
pgvector and turbopuffer alike:

- namespaces: create (with a vector length, typed attributes, and the attribute every search
  of it filters by, if one does: ``partition``), drop, list;
- upsert documents (id, vector, attributes) in batches, overwriting by id;
- exact search, one or many queries per request, each with its own filter and
  top_k (None: every matching document), under one metric;
- fetch vectors by id; delete by filter; count;
- a little JSON metadata (the manifest of a loaded model).

A filter is a tuple of (attribute, op, value) conditions, all of which must hold;
op is one of ``=``, ``<``, ``<=``, ``>``, ``>=``, ``in``.

``Store``'s public methods are what callers use. Each one checks its input (names,
attributes and their types, vector lengths, filters, metrics, duplicate ids), splits a
batch of queries at ``max_queries``, and only then calls the protected method of the
same name (``upsert`` -> ``_upsert``) that a backend writes: so a backend talks to its
database and nothing else. docs/backends.md walks through writing one.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib
import json
import numbers
import re
import threading
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from puffergpt.settings import Setting

Filter = tuple[tuple[str, str, Any], ...]
OPS = ("=", "<", "<=", ">", ">=", "in")
ATTR_TYPES = ("int", "float", "str")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_NP_TYPES = {"int": np.int64, "float": np.float64, "str": object}


class StoreError(Exception):
    """The store can't do what was asked; the message says why and what to do."""


class NoSpace(StoreError):
    """The disk holding the store has no room for a write (the server answers 507)."""


@contextlib.contextmanager
def disk_space(path) -> Iterator[None]:
    """A write that finds the disk full (ENOSPC, or a database's "No space left") raised as
    NoSpace naming the disk, not as whatever the database raised."""
    try:
        yield
    except NoSpace:
        raise
    except Exception as e:
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "no space left" in str(e).lower():
            raise NoSpace(f"the disk holding {path} is full ({e}): free some space there; what was stored "
                          "before is as it was") from e
        raise


class StoreHeld(StoreError):
    """Another process holds the store's data directory (an embedded store is one process's)."""

    def __init__(self, message: str, data_dir=None, holder: str | None = None):
        super().__init__(message)
        self.data_dir, self.holder = data_dir, holder


class NoIndex(StoreError):
    """The store has no approximate index where one was asked for (``build_index`` makes one)."""


class ReaderDied(StoreError):
    """The process reading the store died (the database aborted on damaged files)."""


def resolve(target: str) -> Callable:
    """``module:function`` -> the function (what a reader child is asked to run)."""
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Query:
    vector: np.ndarray  # (dim,)
    filter: Filter = ()
    top_k: int | None = None  # None: every matching document, in no particular order


@dataclass(frozen=True)
class Layout:
    """A namespace's shape: what the base checks every call against."""

    dim: int  # the vectors' length
    schema: dict[str, str]  # attribute -> "int" | "float" | "str"
    metrics: tuple[str, ...]  # the metrics it can be searched with
    partition: str | None = None  # a str attribute every search filters with '=' (create_namespace)


@dataclass
class Hits:
    """The results of a batch of queries, flattened: hit i answers query ``query[i]``.

    Within one query, top-k hits come best first."""

    query: np.ndarray  # (n,) int
    distance: np.ndarray  # (n,) float: the metric's value (inner_product: larger is closer)
    attrs: dict[str, np.ndarray] = field(default_factory=dict)  # the attributes asked for

    @staticmethod
    def concat(parts: list[Hits], include: Sequence[str], offsets: Sequence[int] | None = None) -> Hits:
        """Hits of several requests as one; ``offsets`` shifts each part's query numbers."""
        if len(parts) == 1 and not offsets:
            return parts[0]
        offsets = offsets or [0] * len(parts)
        return Hits(np.concatenate([p.query + o for p, o in zip(parts, offsets, strict=True)]),
                    np.concatenate([p.distance for p in parts]),
                    {a: np.concatenate([p.attrs[a] for p in parts]) for a in include})


# --- the checks every call passes before it reaches a backend ---
def check_name(ns: str) -> str:
    if not isinstance(ns, str) or not _NAME.match(ns):
        raise StoreError(f"invalid namespace name {ns!r}: use letters, digits, '.', '_' and '-' (at most 128)")
    return ns


def check_schema(schema: dict[str, str]) -> None:
    """Attribute names and types every backend stores."""
    for k, t in schema.items():
        if t not in ATTR_TYPES:
            raise StoreError(f"attribute {k!r} has type {t!r}; use one of {sorted(ATTR_TYPES)}")
        if not isinstance(k, str) or not k.isidentifier() or k in ("id", "vector"):
            raise StoreError(f"invalid attribute name {k!r}: a Python identifier other than 'id' and 'vector'")


def check_filter(f: Filter, schema: dict[str, str]) -> Filter:
    """The filter with each value as its attribute's Python type (numpy scalars and arrays
    become ints, floats, strs and lists), or a StoreError naming the bad condition."""
    out = []
    for cond in f:
        if not isinstance(cond, (tuple, list)) or len(cond) != 3 or cond[1] not in OPS:
            raise StoreError(f"invalid filter condition {cond!r}: (attribute, op, value) with op one of {OPS}")
        attr, op, value = cond
        if attr not in schema and attr != "id":
            raise StoreError(f"filter on unknown attribute {attr!r} (the namespace has {sorted(schema)})")
        t = schema.get(attr, "id")
        if op == "in":
            if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, np.ndarray, set, frozenset)):
                raise StoreError(f"filter {attr!r} in {value!r}: 'in' takes a list of values")
            value = [_scalar(x, t, attr) for x in (value.tolist() if isinstance(value, np.ndarray) else value)]
        else:
            value = _scalar(value, t, attr)
        out.append((attr, op, value))
    return tuple(out)


def _scalar(x, t: str, attr: str):
    """A filter value as the attribute's Python type ("id": a str), or a clear error."""
    if isinstance(x, np.generic):
        x = x.item()
    if t == "id":
        return str(x)
    if t == "str" and isinstance(x, str):
        return x
    if t == "int" and isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    if t == "float" and isinstance(x, numbers.Real) and not isinstance(x, bool):
        return float(x)
    raise StoreError(f"filter value {x!r} for attribute {attr!r} is not of its type {t}")


def _values(seq, t: str, attr: str) -> list:
    """An attribute's values as plain Python values of its type (what a backend writes)."""
    a = np.asarray(seq)
    try:
        if t == "int":
            if a.size and not np.issubdtype(a.dtype, np.integer):
                raise TypeError
            return a.astype(np.int64).tolist()
        if t == "float":
            return a.astype(np.float64).tolist()
        out = a.tolist()
        if not all(isinstance(x, str) for x in out):
            raise TypeError
        return out
    except (TypeError, ValueError):
        raise StoreError(
            f"attribute {attr!r} holds {t} values; got {a.dtype} ({a.ravel()[:3].tolist()!r}...)"
        ) from None


def _vectors(vectors, n: int, dim: int, what: str = "vectors") -> np.ndarray:
    v = np.ascontiguousarray(vectors, dtype=np.float32)
    if v.shape != (n, dim):
        raise StoreError(f"{what} have shape {v.shape}, the namespace holds vectors of length {dim}")
    return v


_nested = threading.local()  # public calls under way in this thread: one inside another is not told apart


def _serial(method):
    """A public method, one call at a time unless the backend says it is thread_safe; each
    call (not one made inside another, as search reads the layout) timed for the store's
    watchers (``Store.watch``)."""
    op = method.__name__

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        t, ok, depth = time.perf_counter(), False, getattr(_nested, "depth", 0)
        _nested.depth = depth + 1
        try:
            if self.thread_safe:
                out = method(self, *args, **kwargs)
            else:
                with self._serial_lock:
                    out = method(self, *args, **kwargs)
            ok = True
            return out
        finally:
            _nested.depth = depth
            if self._watchers and depth == 0:
                self._tell(op, time.perf_counter() - t, ok)
    return run


class Store(ABC):
    """One vector database. A backend subclasses it (one per module in ``puffergpt.stores``),
    sets ``name`` and ``metrics``, and writes the abstract ``_`` methods below; the public
    methods check every input first, so those see only valid, normalised arguments.
    docs/backends.md walks through it; tests/stores/test_contract.py is what it must pass."""

    # --- what a backend says about itself (name and metrics are required) ---
    name: str  # what --backend calls it
    metrics: tuple[str, ...]  # the metrics it searches exactly, most precise first
    max_queries: int = 1024  # queries one _search call is given; the base splits bigger batches
    max_top_k: int | None = None  # hits a query may return (None: no limit); the engine splits a
    # matrix's rows into ranges of at most this many (turbopuffer's 10,000)
    metric_per_namespace: bool = False  # True: a namespace is searched by one metric only, fixed
    # when it is created (metric=None: metrics[0]); False: by any of those it was created for
    thread_safe: bool = False  # False: the base lets one call at a time reach the backend (the
    # engine writes a text's keys in a background thread while it searches); True: it locks itself
    settings: tuple[Setting, ...] = ()  # what it is opened with beside data_dir (a DSN, a key): each an
    # argument of its factory, set by a flag or an environment variable that the CLI reads

    def __new__(cls, *args, **kwargs):
        try:
            ok = isinstance(cls.name, str) and isinstance(cls.metrics, tuple) and len(cls.metrics) > 0
        except AttributeError:
            ok = False
        if not ok:
            raise TypeError(f"{cls.__name__}: a store sets `name` (a str) and `metrics` (a tuple of metric names)")
        store = super().__new__(cls)
        store._serial_lock = threading.RLock()
        store._watchers = []  # weak references to bound methods: (op, seconds, ok) after each call
        return store

    def watch(self, observer: Callable[[str, float, bool], None]) -> None:
        """Call ``observer(op, seconds, ok)`` after each public call (search, fetch, upsert, ...):
        a server's metrics. Held weakly (a bound method): an app that is gone stops watching."""
        self._watchers.append(weakref.WeakMethod(observer))

    def _tell(self, op: str, seconds: float, ok: bool) -> None:
        for ref in list(self._watchers):
            observer = ref()
            if observer is None:
                with contextlib.suppress(ValueError):  # another thread removed it first
                    self._watchers.remove(ref)
            else:
                observer(op, seconds, ok)

    # --- what a backend writes: each talks to the database, nothing else ---
    @abstractmethod
    def _namespaces(self, prefix: str) -> dict[str, Layout]:
        """The namespaces whose name starts with prefix, and their layouts."""

    def _layout(self, ns: str) -> Layout | None:
        """ns's layout, None if it does not exist. Override it where listing is slow."""
        return self._namespaces(ns).get(ns)

    @abstractmethod
    def _create_namespace(self, ns: str, layout: Layout, ephemeral: bool) -> Layout | None:
        """Create ns with this layout and return None; if ns exists already, change nothing
        and return its layout (the base compares the two). ``ephemeral``: it need not outlive
        the process (a text's keys), so it may live in memory or skip a write-ahead log.
        ``layout.partition`` is a hint a backend may ignore (``create_namespace``)."""

    @abstractmethod
    def _drop_namespace(self, ns: str) -> None:
        """Remove ns and its documents; nothing if it does not exist."""

    @abstractmethod
    def _upsert(self, ns: str, layout: Layout, ids: list[str], vectors: np.ndarray, attrs: dict[str, list]) -> None:
        """Write documents, replacing any with the same id. ids are distinct; vectors
        (n, dim) float32; attrs holds every attribute of the schema, n Python values each."""

    @abstractmethod
    def _search(self, ns: str, layout: Layout, queries: list[Query], metric: str, include: tuple[str, ...]) -> Hits:
        """Exact search: the true metric value to every document that matches each filter
        (or the top_k best, best first). 1 to max_queries queries, vectors (dim,) float32,
        metric one of layout.metrics, include names "id" or attributes."""

    @abstractmethod
    def _fetch(self, ns: str, layout: Layout, ids: list[str]) -> dict[str, np.ndarray]:
        """The vectors of those ids that exist, by id (the base reports the missing ones)."""

    @abstractmethod
    def _delete(self, ns: str, layout: Layout, filter: Filter) -> None:
        """Delete the documents matching filter (every document for ())."""

    @abstractmethod
    def _count(self, ns: str, layout: Layout, filter: Filter) -> int:
        """How many documents match filter."""

    @abstractmethod
    def _put_meta(self, key: str, value: dict) -> None: ...

    @abstractmethod
    def _get_meta(self, key: str) -> dict | None:
        """The value put under key (a copy, with its keys in their order), None if none."""

    # --- what callers use: checks, then the backend's method ---
    @_serial
    def create_namespace(self, ns: str, dim: int, schema: dict[str, str], metric: str | None = None,
                         ephemeral: bool = False, partition: str | None = None) -> None:
        """Create ns for vectors of length dim with typed attributes; a no-op if it exists alike.
        ``metric`` is the one it will be searched with (stores that fix it per namespace need it);
        ``ephemeral`` says it need not outlive the process (a text's keys), so a store may keep it
        in memory or skip its write-ahead log. ``partition`` names a str attribute that every
        search of ns filters with '=' (the weights' ``matrix``): a store may keep each value's
        documents apart, so that such a search reads only its own (the embedded store: a zvec
        collection each); a search without it must still see every document. A hint: pgvector
        (a B-tree on the attributes narrows the scan already) and turbopuffer ignore it."""
        check_name(ns)
        self._check_metric(metric)
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral) or int(dim) < 1:
            raise StoreError(f"invalid vector length {dim!r}: a positive integer")
        check_schema(schema)
        if partition is not None and schema.get(partition) != "str":
            raise StoreError(f"partition {partition!r} is not a str attribute of the namespace ({schema})")
        metrics = (metric,) if metric else self.metrics[:1] if self.metric_per_namespace else self.metrics
        want = Layout(int(dim), dict(schema), metrics, partition)
        old = self._create_namespace(ns, want, bool(ephemeral))
        if old is not None and (
            old.dim != want.dim or old.schema != want.schema or not set(metrics) <= set(old.metrics)
        ):
            shown = {"dim": old.dim, "schema": old.schema, "metrics": list(old.metrics)}
            raise StoreError(f"namespace {ns!r} exists with another layout {shown}; drop it first")

    @_serial
    def drop_namespace(self, ns: str) -> None:
        self._drop_namespace(check_name(ns))

    @_serial
    def namespaces(self, prefix: str = "") -> list[str]:
        if not isinstance(prefix, str):
            raise StoreError(f"invalid namespace prefix {prefix!r}")
        return sorted(self._namespaces(prefix))

    @_serial
    def upsert(self, ns: str, ids: Sequence[str], vectors: np.ndarray, attrs: dict[str, Sequence]) -> None:
        """Write documents, replacing any with the same id."""
        layout = self.layout(ns)
        if set(attrs) != set(layout.schema):
            raise StoreError(f"upsert to {ns!r} needs attributes {sorted(layout.schema)}, got {sorted(attrs)}")
        ids = [str(i) for i in ids]
        if len(vectors) != len(ids) or any(len(v) != len(ids) for v in attrs.values()):
            raise StoreError("upsert: ids, vectors and attributes differ in length")
        if len(set(ids)) != len(ids):
            raise StoreError("upsert: an id appears twice in one batch")
        v = _vectors(vectors, len(ids), layout.dim)
        self._upsert(ns, layout, ids, v, {a: _values(attrs[a], t, a) for a, t in layout.schema.items()})

    @_serial
    def search(self, ns: str, queries: Sequence[Query], metric: str, include: Sequence[str] = ()) -> Hits:
        """Exact search: the true metric value to every document that matches each filter.
        Any number of queries: the base sends them ``max_queries`` at a time."""
        layout = self.layout(ns)
        self._check_metric(metric)
        if metric not in layout.metrics:
            fixed = f" ({self.name} fixes the metric per namespace)" if self.metric_per_namespace else ""
            raise StoreError(f"namespace {ns!r} was created for {', '.join(layout.metrics)}, not {metric}{fixed}: "
                             f"drop it and create it with metric={metric!r}")
        include = tuple(include)
        for a in include:
            if a not in layout.schema and a != "id":
                raise StoreError(f"unknown attribute {a!r} to include (the namespace has {sorted(layout.schema)})")
        qs = [self._valid_query(q, layout) for q in queries]
        if not qs:
            types = {"id": "str", **layout.schema}
            return Hits(np.zeros(0, np.int64), np.zeros(0), {a: np.zeros(0, _NP_TYPES[types[a]]) for a in include})
        n = self.max_queries
        starts = range(0, len(qs), n)
        parts = [self._search(ns, layout, qs[s:s + n], metric, include) for s in starts]
        return parts[0] if len(parts) == 1 else Hits.concat(parts, include, list(starts))

    @staticmethod
    def _valid_query(q: Query, layout: Layout) -> Query:
        v = np.asarray(q.vector, np.float32)
        if v.shape != (layout.dim,):
            raise StoreError(f"a query has shape {v.shape}, the namespace holds vectors of length {layout.dim}")
        k = q.top_k
        if k is not None and (isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0):
            raise StoreError(f"invalid top_k {k!r}: None (every match) or a count")
        return Query(v, check_filter(q.filter, layout.schema), None if k is None else int(k))

    @_serial
    def fetch(self, ns: str, ids: Sequence[str]) -> np.ndarray:
        """Vectors of the given ids, in that order: (n, dim). A missing id is an error."""
        layout = self.layout(ns)
        ids = [str(i) for i in ids]
        got = self._fetch(ns, layout, ids) if ids else {}
        missing = [i for i in ids if i not in got]
        if missing:
            raise StoreError(f"namespace {ns!r} has no document {missing[0]!r} ({len(missing)} missing); "
                             "the store is incomplete: run `puffergpt load` again")
        return np.array([got[i] for i in ids], np.float32).reshape(len(ids), layout.dim)

    @_serial
    def delete(self, ns: str, filter: Filter) -> None:
        layout = self.layout(ns)
        self._delete(ns, layout, check_filter(filter, layout.schema))

    @_serial
    def count(self, ns: str, filter: Filter = ()) -> int:
        layout = self.layout(ns)
        return int(self._count(ns, layout, check_filter(filter, layout.schema)))

    @_serial
    def put_meta(self, key: str, value: dict) -> None:
        if not isinstance(key, str) or not key:
            raise StoreError(f"invalid metadata key {key!r}: a non-empty string")
        try:
            value = json.loads(json.dumps(value))
        except (TypeError, ValueError) as e:
            raise StoreError(f"metadata {key!r} is not JSON: {e}") from None
        self._put_meta(key, value)

    @_serial
    def get_meta(self, key: str) -> dict | None:
        if not isinstance(key, str) or not key:
            raise StoreError(f"invalid metadata key {key!r}: a non-empty string")
        return self._get_meta(key)

    @_serial
    def layout(self, ns: str) -> Layout:
        """ns's layout; a StoreError if it does not exist."""
        layout = self._layout(check_name(ns))
        if layout is None:
            raise StoreError(f"namespace {ns!r} does not exist")
        return layout

    def _check_metric(self, metric: str | None) -> None:
        if metric is not None and metric not in self.metrics:
            raise StoreError(f"the {self.name} store has no metric {metric!r}; it has {', '.join(self.metrics)}")

    # --- optional: an approximate (ANN) index over the documents of one attribute value ---
    @_serial
    def build_index(self, ns: str, on: tuple[str, str], metric: str, params: dict, progress=None) -> dict:
        """Build (or rebuild) an approximate nearest-neighbour index over the documents of ns whose
        str attribute ``on[0]`` is ``on[1]`` (the weights' ``("matrix", "wte")``), ranked by ``metric``.
        ``params``: the index's own (HNSW: ``m``, ``ef_construction``); ``progress(done, total)``
        is called as rows go in. -> what was built (kind, params, rows), for the manifest."""
        layout = self.layout(ns)
        self._check_metric(metric)
        return self._build_index(ns, layout, self._on(on, layout), metric, dict(params), progress)

    @_serial
    def has_index(self, ns: str, on: tuple[str, str], metric: str) -> bool:
        """Whether an approximate index over ns's ``on`` documents, by ``metric``, is built here."""
        return self._has_index(ns, self._on(on, self.layout(ns)), metric)

    @_serial
    def index_stamp(self, ns: str, on: tuple[str, str], metric: str) -> dict | None:
        """{file: [size, digest]} of the approximate index's files, read in full (bit rot leaves
        the mtime alone), recorded in the manifest when it is built and checked by ``verify`` and
        at the start (``verify.index_damage``); None where the store can't say (a server's
        database, whose files are its own) or where no index is built."""
        layout = self.layout(ns)
        self._check_metric(metric)
        return self._index_stamp(ns, self._on(on, layout), metric)

    @_serial
    def search_approximate(self, ns: str, on: tuple[str, str], queries: Sequence[Query], metric: str,
                           include: Sequence[str] = (), ef: int = 128) -> Hits:
        """Approximate top-k through the index ``build_index`` made: each query's ``top_k`` hits
        (best first) among ns's ``on`` documents, with the metric's value computed in full
        precision for each hit returned (so a hit's score is exact; which hits come back is not:
        the index may miss some of the true top k). ``ef``: the search's candidate list (HNSW).
        NoIndex where none is built."""
        layout = self.layout(ns)
        self._check_metric(metric)
        on = self._on(on, layout)
        qs = [self._valid_query(q, layout) for q in queries]
        if any(q.top_k is None or q.filter for q in qs):
            raise StoreError("an approximate search asks for a top_k and filters by nothing else")
        if isinstance(ef, bool) or not isinstance(ef, numbers.Integral) or not 1 <= ef <= 1000:
            raise StoreError(f"invalid ef {ef!r}: an integer from 1 to 1,000")
        return self._search_approximate(ns, layout, on, qs, metric, tuple(include), int(ef))

    @staticmethod
    def _on(on, layout: Layout) -> tuple[str, str]:
        if (not isinstance(on, (tuple, list)) or len(on) != 2 or layout.schema.get(on[0]) != "str"
                or not isinstance(on[1], str)):
            raise StoreError(f"an index is over the documents of one value of a str attribute, "
                             f"(attribute, value), not {on!r}")
        return on[0], on[1]

    def _build_index(self, ns, layout, on, metric, params, progress) -> dict:
        raise NoIndex(f"the {self.name} store can't build an approximate index")

    def _has_index(self, ns, on, metric) -> bool:
        return False

    def _index_stamp(self, ns, on, metric) -> dict | None:
        return None

    def _search_approximate(self, ns, layout, on, queries, metric, include, ef) -> Hits:
        """The searches; NoIndex where none is built (checked here, not by a request of its own
        before every search: the output search costs one request, as the exact one does)."""
        raise NoIndex(f"the {self.name} store has no approximate index")

    # --- optional capabilities: these defaults are right for a database on a server ---
    def disk_bytes(self) -> int | None:
        """Bytes of the store's files on this machine, None where it can't say (a server's)."""
        return None

    def free_bytes(self) -> int | None:
        """Bytes free on the disk holding the store's files (``path``), None where they are not
        on this machine (a server's): what a load or a text is checked against (search/space.py)."""
        return None

    def stamp(self, namespaces: Sequence[str]) -> dict | None:
        """A digest of the stored bytes of these namespaces, read in full (so that a verified
        store is not read again through the database until they change), or None where the
        store can't say: a database on a server, whose files are its own (those are checked by
        count on open, and read in full by `puffergpt verify`)."""
        return None

    def reserve_path(self) -> Path | None:
        """A directory of this process's, on the disk its memory-mapped writes go to, where a server
        holds a reserve of free space (``search/space.Reserve``), removed with the store's leftovers;
        None where the store writes through no memory map of this machine (a server's database)."""
        return None

    def release(self, namespaces: Sequence[str]) -> None:  # noqa: B027 - optional: nothing to release by default
        """Close what this process holds open of these namespaces (before another reads them)."""

    keeps_spares = 0  # dropped ephemeral namespaces kept, at most, for the next of their layout (embedded)

    def read_isolated(self, target: str, payload: dict, namespaces: Sequence[str] = ()) -> Iterator[dict]:
        """Run ``target`` (``module:function``, called as f(store, payload) and yielding JSON-able
        dicts) where the database aborting cannot take this process down, and yield its dicts;
        ReaderDied if it died first. Here: in this process, since a server's database crashes
        in its own (the embedded store runs it in a child)."""
        yield from resolve(target)(self, payload)

    def worker_options(self) -> dict:
        """What a worker process (``serve --workers``) gives ``open_store``, beside the settings
        this store was opened with, to open this same store while this process holds it. Here:
        nothing more (a database server takes many clients)."""
        return {}

    def cli_args(self) -> str:
        """The CLI options that reach this same store, for messages that name a command."""
        return f"--backend {self.name}"

    def close(self) -> None:  # noqa: B027 - optional: nothing to close by default
        """Let go of connections, files and locks."""
