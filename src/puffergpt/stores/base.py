"""The store protocol: what puffergpt needs from a vector database.

Small on purpose, so that it maps onto an embedded engine, PostgreSQL with
pgvector and turbopuffer alike:

- namespaces: create (with a vector length and typed attributes), drop, list;
- upsert documents (id, vector, attributes) in batches, overwriting by id;
- exact search, one or many queries per request, each with its own filter and
  top_k (None: every matching document), under one metric;
- fetch vectors by id; delete by filter; count;
- a little JSON metadata (the manifest of a loaded model).

A filter is a tuple of (attribute, op, value) conditions, all of which must hold;
op is one of ``=``, ``<``, ``<=``, ``>``, ``>=``, ``in``.
"""

from __future__ import annotations

import importlib
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

Filter = tuple[tuple[str, str, Any], ...]
OPS = ("=", "<", "<=", ">", ">=", "in")
ATTR_TYPES = ("int", "float", "str")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")


class StoreError(Exception):
    """The store can't do what was asked; the message says why and what to do."""


class StoreHeld(StoreError):
    """Another process holds the store's data directory (an embedded store is one process's)."""

    def __init__(self, message: str, data_dir=None, holder: str | None = None):
        super().__init__(message)
        self.data_dir, self.holder = data_dir, holder


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


@dataclass
class Hits:
    """The results of a batch of queries, flattened: hit i answers query ``query[i]``.

    Within one query, top-k hits come best first."""

    query: np.ndarray  # (n,) int
    distance: np.ndarray  # (n,) float: the metric's value (inner_product: larger is closer)
    attrs: dict[str, np.ndarray] = field(default_factory=dict)  # the attributes asked for

    @staticmethod
    def concat(parts: list["Hits"], include: Sequence[str], offsets: Sequence[int] | None = None) -> "Hits":
        """Hits of several requests as one; ``offsets`` shifts each part's query numbers."""
        if len(parts) == 1 and not offsets:
            return parts[0]
        offsets = offsets or [0] * len(parts)
        return Hits(np.concatenate([p.query + o for p, o in zip(parts, offsets)]),
                    np.concatenate([p.distance for p in parts]),
                    {a: np.concatenate([p.attrs[a] for p in parts]) for a in include})


def check_name(ns: str) -> str:
    if not isinstance(ns, str) or not _NAME.match(ns):
        raise StoreError(f"invalid namespace name {ns!r}: use letters, digits, '.', '_' and '-' (at most 128)")
    return ns


def check_filter(f: Filter, schema: dict[str, str]) -> None:
    for cond in f:
        if len(cond) != 3 or cond[1] not in OPS:
            raise StoreError(f"invalid filter condition {cond!r}: (attribute, op, value) with op one of {OPS}")
        if cond[0] not in schema and cond[0] != "id":
            raise StoreError(f"filter on unknown attribute {cond[0]!r} (the namespace has {sorted(schema)})")


def check_schema(schema: dict[str, str], types: dict[str, str]) -> None:
    """Attribute names and types a backend can store (``types``: ours -> its column type)."""
    for k, t in schema.items():
        if t not in types:
            raise StoreError(f"attribute {k!r} has type {t!r}; use one of {sorted(types)}")
        if not isinstance(k, str) or not k.isidentifier() or k in ("id", "vector"):
            raise StoreError(f"invalid attribute name {k!r}: a Python identifier other than 'id' and 'vector'")


def check_upsert(ns: str, ids: Sequence[str], vectors, attrs: dict, schema: dict[str, str]) -> None:
    """What every backend refuses before it writes anything."""
    if set(attrs) != set(schema):
        raise StoreError(f"upsert to {ns!r} needs attributes {sorted(schema)}, got {sorted(attrs)}")
    if len(ids) != len(vectors) or any(len(v) != len(ids) for v in attrs.values()):
        raise StoreError("upsert: ids, vectors and attributes differ in length")
    if len(set(ids)) != len(ids):
        raise StoreError("upsert: an id appears twice in one batch")


class Store(ABC):
    """One vector database. Subclasses live one per module in ``puffergpt.stores``."""

    name: str
    metrics: tuple[str, ...]  # the metrics it searches exactly, most precise first
    max_queries: int  # queries one search request may carry

    @abstractmethod
    def create_namespace(self, ns: str, dim: int, schema: dict[str, str], metric: str | None = None,
                         ephemeral: bool = False) -> None:
        """Create ns for vectors of length dim with typed attributes; a no-op if it exists alike.
        ``metric`` is the one it will be searched with (stores that fix it per namespace need it);
        ``ephemeral`` says it need not outlive the process (a text's keys), so a store may keep it
        in memory or skip its write-ahead log."""

    @abstractmethod
    def drop_namespace(self, ns: str) -> None: ...

    @abstractmethod
    def namespaces(self, prefix: str = "") -> list[str]: ...

    @abstractmethod
    def upsert(self, ns: str, ids: Sequence[str], vectors: np.ndarray, attrs: dict[str, Sequence]) -> None:
        """Write documents, replacing any with the same id."""

    @abstractmethod
    def search(self, ns: str, queries: Sequence[Query], metric: str, include: Sequence[str] = ()) -> Hits:
        """Exact search: the true metric value to every document that matches each filter."""

    @abstractmethod
    def fetch(self, ns: str, ids: Sequence[str]) -> np.ndarray:
        """Vectors of the given ids, in that order: (n, dim). A missing id is an error."""

    @abstractmethod
    def delete(self, ns: str, filter: Filter) -> None: ...

    @abstractmethod
    def count(self, ns: str, filter: Filter = ()) -> int: ...

    @abstractmethod
    def put_meta(self, key: str, value: dict) -> None: ...

    @abstractmethod
    def get_meta(self, key: str) -> dict | None: ...

    def check_search(self, queries: Sequence[Query], metric: str, include: Sequence[str], schema: dict[str, str]) -> None:
        """What every backend refuses before it searches."""
        if metric not in self.metrics:
            raise StoreError(f"the {self.name} store has no metric {metric!r}; it has {', '.join(self.metrics)}")
        for a in include:
            if a not in schema and a != "id":
                raise StoreError(f"unknown attribute {a!r} to include (the namespace has {sorted(schema)})")
        if len(queries) > self.max_queries:
            raise StoreError(f"{len(queries)} queries in one request; the {self.name} store takes at most {self.max_queries}")
        for q in queries:
            check_filter(q.filter, schema)

    def stamp(self, namespaces: Sequence[str], known: dict | None = None) -> dict | None:
        """What identifies the stored bytes of these namespaces (so that a verified store is
        not read again until they change), or None where the store can't say: a database on
        a server, whose files are its own (those are checked by count on open, and read in full
        by `puffergpt verify`)."""
        return None

    def release(self, namespaces: Sequence[str]) -> None:
        """Close what this process holds open of these namespaces (before another reads them)."""

    def read_isolated(self, target: str, payload: dict, namespaces: Sequence[str] = ()) -> Iterator[dict]:
        """Run ``target`` (``module:function``, called as f(store, payload) and yielding JSON-able
        dicts) where the database aborting cannot take this process down, and yield its dicts;
        ReaderDied if it died first. Here: in this process, since a server's database crashes
        in its own (the embedded store runs it in a child)."""
        yield from resolve(target)(self, payload)

    def cli_args(self) -> str:
        """The CLI options that reach this same store, for messages that name a command."""
        return f"--backend {self.name}"

    def close(self) -> None:
        pass
