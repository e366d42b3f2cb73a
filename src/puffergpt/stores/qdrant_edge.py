"""Qdrant Edge (``qdrant-edge-py``), in-process, under the data directory: the embedded store's
database for a text's keys (written every token), and for everything where zvec can't run
(``embedded.py``).

Chosen by measurement (benchmarks/embedded_dbs.py): one exact product of 3,072 rows
under a filter runs several times faster than in DuckDB, the embedded store before it.

Its files in the data directory (the lock and meta.json are the ``datadir.Home``'s):

    qdrant/<namespace>/shard/           one Qdrant Edge shard per persisted namespace (WAL on)
    qdrant/<namespace>/namespace.json   its vector length, attributes and metrics
    tmp/<namespace>/                    ephemeral namespaces (a text's keys, WAL off), wiped at open

Every metric is a named vector of the shard, searched exactly (``SearchParams(exact=True)``,
HNSW never built): ``inner_product`` is Qdrant's Dot; ``euclidean_squared`` is its Euclid
score (the plain distance) squared; ``cosine_distance`` is 1 - its Cosine score. Qdrant
normalises Cosine vectors when it writes them, so a namespace searched by cosine also keeps
the vectors as given (a Dot vector) for ``fetch``. A namespace created for one metric holds
only that one's vectors; created without one it holds all three.

Qdrant's ids are integers; ours are strings. Each document gets a slot number as its point
id and carries its string id in the payload. The process keeps every namespace's ids and
attributes (never vectors) as numpy columns indexed by slot, rebuilt from the shard's payload
when a namespace is first used, so a search asks Qdrant for ids and scores only: building
payload dicts in the binding cost ~4 ms for 3,072 hits, the ids and scores 0.3 ms.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import qdrant_edge as qe

from puffergpt.stores import datadir
from puffergpt.stores.base import (
    Filter,
    Hits,
    Layout,
    Store,
    StoreError,
    check_name,
)

_INDEX = {"int": qe.IntegerIndexParams(lookup=True, range=True), "float": qe.PayloadSchemaType.Float,
          "str": qe.PayloadSchemaType.Keyword}
_DISTANCES = {
    "inner_product": qe.Distance.Dot,
    "euclidean_squared": qe.Distance.Euclid,
    "cosine_distance": qe.Distance.Cosine,
}
_EXACT = qe.SearchParams(exact=True)
# indexing_threshold 0: never build HNSW; prevent_unoptimized False: a written point is searchable at once.
_OPTIMIZERS = qe.EdgeOptimizersConfig(indexing_threshold=0, prevent_unoptimized=False)
KEPT = "qdrant"  # the directory of persisted namespaces, under the data directory
SCROLL = 10_000
CONDITIONS = 8192  # single-value filter conditions a namespace keeps made (_kept_condition)
SPARE = 32  # emptied ephemeral shards kept for reuse (~200 KB each): as many as a server's open texts
REUSE = 32  # namespaces one ephemeral shard may hold, one after another


def _error(what: str, e: Exception) -> StoreError:
    return StoreError(f"the embedded store (Qdrant Edge) failed to {what}: {e}")


@dataclass
class _Namespace(datadir.Columns):
    """One namespace: its shard, and its ids and attributes in memory, indexed by slot (= point id)."""

    dim: int
    schema: dict[str, str]
    metrics: tuple[str, ...]  # the named vectors it holds
    shard: object = None  # qe.EdgeShard, opened on first use
    slots: dict[str, int] = field(default_factory=dict)  # string id -> slot
    cols: dict[str, np.ndarray] = field(default_factory=dict)  # "id", "live" and each attribute, by slot
    counts: dict[str, Counter] = field(default_factory=dict)  # attribute -> value -> live documents
    next: int = 0  # the next free slot
    dirty: bool = False  # written since the last flush
    lock: threading.Lock = field(default_factory=threading.Lock)
    uses: int = 1  # ephemeral: the namespaces its shard has held (``EmbeddedStore._keep_spare``)
    conditions: dict = field(default_factory=dict)  # (attr, op, value) -> its Qdrant condition (_filter)

    @property
    def fetch_vector(self) -> str:
        # Cosine vectors are stored normalised; the others as given.
        return next(m for m in self.metrics if m != "cosine_distance")

    def layout(self) -> dict:
        return {"dim": self.dim, "schema": self.schema, "metrics": list(self.metrics)}

    @property
    def spec(self) -> Layout:
        return Layout(self.dim, self.schema, self.metrics)


@dataclass
class _Spare:
    """The emptied shard of a dropped ephemeral namespace (a text's keys), kept for the next."""

    dir: Path
    shard: object
    layout: dict
    uses: int


class QdrantEdgeStore(datadir.NamespaceDirs, Store):
    name = "qdrant-edge"
    what = "the embedded store (Qdrant Edge)"
    metrics = ("inner_product", "cosine_distance", "euclidean_squared")
    max_queries = 16384  # 12 heads x 1,024 positions: a whole prefill's attention in one request
    thread_safe = True  # it holds its own locks
    keeps_spares = SPARE  # a text's shard, emptied, for the next text (_keep_spare)

    def __init__(self, home: datadir.Home):
        """Its files under ``home``'s directory (see above); leftovers of a process that died
        (half-made namespaces, dropped ones, ephemeral shards) removed, unless borrowed."""
        self.home = home
        self.root = home.root
        self.kept, self.tmp = self.root / KEPT, self.root / "tmp"  # kept/: made with its first namespace
        self.tmp.mkdir(exist_ok=True)
        for p in [] if home.borrowed else [*self.kept.glob(".*"), *self.tmp.iterdir()]:
            shutil.rmtree(p, ignore_errors=True)
        self.lock = threading.RLock()  # the catalog
        self._ns: dict[str, _Namespace] = {}
        self._ephemeral: dict[str, Path] = {}  # ephemeral namespace -> its directory under tmp/
        self._spare: list[_Spare] = []  # emptied shards of dropped ephemeral namespaces, to reuse

    def ephemeral(self, ns: str) -> bool:
        return ns in self._ephemeral

    # --- namespaces ---
    def _dir(self, ns: str) -> Path:
        return self._ephemeral[ns] if ns in self._ephemeral else super()._dir(ns)

    def _open_files(self, ns: str, d: Path, layout: dict) -> _Namespace:
        """A namespace's shard, and its ids and attributes read from the payload (``NamespaceDirs._open``)."""
        n = _Namespace(layout["dim"], layout["schema"], tuple(layout["metrics"]))
        try:
            n.shard = qe.EdgeShard.load(str(d / "shard"))
            self._rebuild(n)
        except Exception as e:
            raise self._damaged(ns, d, e) from None
        return n

    @staticmethod
    def _rebuild(n: _Namespace) -> None:
        offset = None
        while True:
            recs, offset = n.shard.scroll(
                qe.ScrollRequest(offset=offset, limit=SCROLL, with_payload=True, with_vector=False)
            )
            if recs:
                slots = np.fromiter((r.id for r in recs), np.int64, len(recs))
                pays = [r.payload for r in recs]
                ids = [p["id"] for p in pays]
                n.slots.update(zip(ids, slots.tolist(), strict=True))
                n.next = max(n.next, int(slots.max()) + 1)
                n.grow(n.next)
                n.record(slots, ids, {a: [p[a] for p in pays] for a in n.schema})
            if offset is None:
                return

    def _create_namespace(self, ns, layout, ephemeral):
        # A namespace created for cosine also keeps the vectors as given, for fetch (see above).
        metrics = layout.metrics + ("inner_product",) if layout.metrics == ("cosine_distance",) else layout.metrics
        with self.lock:
            if (old := self._layout(ns)) is not None:
                return old
            n = _Namespace(layout.dim, dict(layout.schema), metrics)
            n.grow(0)
            if ephemeral and (spare := self._reuse(n)) is not None:
                self._ephemeral[ns], n.shard = spare.dir, spare.shard
                n.uses = spare.uses + 1
            else:
                if ephemeral:
                    self._ephemeral[ns] = self.tmp / check_name(ns)
                try:
                    n.shard = self._make_shard(ns, n, ephemeral)
                except Exception as e:
                    self._ephemeral.pop(ns, None)
                    raise StoreError(f"can't create namespace {ns!r} in {self.root}: {e}") from None
            self._ns[ns] = n
        return None

    def _reuse(self, n: _Namespace) -> _Spare | None:
        """An emptied shard of the same layout, if one is kept (the lock held)."""
        for i, spare in enumerate(self._spare):
            if spare.layout == n.layout():
                return self._spare.pop(i)
        return None

    def _keep_spare(self, ns: str, n: _Namespace) -> bool:
        """A dropped ephemeral namespace's shard emptied and kept for the next (the lock held):
        making one costs ~45 ms (a shard, three field indexes) and dropping it ~20 ms, emptying
        a text's keys ~2 ms. Kept at most SPARE at once, each reused at most REUSE times
        (deleted points stay in a shard until it goes). -> whether it was kept"""
        if n.shard is None or len(self._spare) >= SPARE or n.uses >= REUSE:
            return False
        try:
            with n.lock:
                if n.slots:
                    n.shard.update(qe.UpdateOperation.delete_points(self._matching(n, None).tolist()))
                if n.shard.count(qe.CountRequest(exact=True)) != 0:
                    return False
        except Exception:  # noqa: BLE001 - a shard that can't be emptied is dropped instead
            return False
        self._spare.append(_Spare(self._ephemeral[ns], n.shard, n.layout(), n.uses))
        return True

    def _make_shard(self, ns: str, n: _Namespace, ephemeral: bool):
        cfg = qe.EdgeConfig(vectors={m: qe.EdgeVectorParams(n.dim, _DISTANCES[m]) for m in n.metrics},
                            optimizers=_OPTIMIZERS, wal_enabled=not ephemeral)
        final = self._dir(ns)
        # Made under a hidden name and renamed into place: a process killed half-way leaves
        # no half-made namespace, only a leftover that the next open removes.
        tmp = final if ephemeral else self.kept / f".new-{uuid.uuid4().hex}"
        tmp.parent.mkdir(exist_ok=True)
        tmp.mkdir()
        shard = qe.EdgeShard.create(str(tmp / "shard"), cfg)
        for a, t in n.schema.items():
            shard.update(qe.UpdateOperation.create_field_index(a, _INDEX[t]))
        (tmp / "namespace.json").write_text(json.dumps(n.layout()))
        if ephemeral:
            return shard
        shard.close()
        datadir.fsync_dir(tmp)
        os.rename(tmp, final)
        datadir.fsync_dir(final.parent)
        return qe.EdgeShard.load(str(final / "shard"))

    def _drop_namespace(self, ns):
        with self.lock:
            d = self._dir(ns)
            if not d.is_dir():
                return
            n = self._ns.pop(ns, None)
            if ns in self._ephemeral and n is not None and self._keep_spare(ns, n):
                del self._ephemeral[ns]
                return
            if n is not None and n.shard is not None:
                n.shard.close()
            datadir.remove(d, ns in self._ephemeral)
            self._ephemeral.pop(ns, None)

    def _namespaces(self, prefix):
        with self.lock:
            return super()._namespaces(prefix, also=list(self._ephemeral))

    # --- documents ---
    def _upsert(self, ns, layout, ids, v, cols):
        n = self._get(ns)
        with n.lock:
            new = np.array([i not in n.slots for i in ids], bool)
            slots = n.reserve(ids)
            points = [qe.Point(s, {m: v[i] for m in n.metrics}, {"id": ids[i], **{a: cols[a][i] for a in n.schema}})
                      for i, s in enumerate(slots.tolist())]
            try:
                n.shard.update(qe.UpdateOperation.upsert_points(points))
            except Exception as e:
                for i in np.asarray(ids, object)[new]:  # nothing was written: forget the new slots
                    n.slots.pop(i)
                raise _error(f"write to {ns!r}", e) from None
            n.record(slots, ids, cols)
            n.dirty = True

    def _fetch(self, ns, layout, ids):
        n = self._get(ns)
        slots = [n.slots[i] for i in ids if i in n.slots]
        if not slots:
            return {}
        try:
            recs = n.shard.retrieve(slots, with_payload=False, with_vector=[n.fetch_vector])
        except Exception as e:
            raise _error(f"read from {ns!r}", e) from None
        got = {r.id: r.vector.get(n.fetch_vector) for r in recs}
        if None in got.values():  # its vector flagged deleted while the point lives: damaged files
            raise StoreError(
                f"namespace {ns!r} has lost the vectors of {sum(v is None for v in got.values())} documents; "
                f"the store is damaged: run `puffergpt load --repair`"
            )
        if len(got) != len(set(slots)):
            raise StoreError(
                f"namespace {ns!r} lost documents its payload lists; "
                "the store is damaged: run `puffergpt load --repair`"
            )
        return {n.cols["id"][s]: np.asarray(v, np.float32) for s, v in got.items()}

    def _filter(self, n: _Namespace, f: Filter) -> qe.Filter | None:
        return qe.Filter(must=[self._kept_condition(n, c) for c in f]) if f else None

    def _kept_condition(self, n: _Namespace, c: tuple):
        """A condition on one value, made once a namespace (a text's keys are searched by the same
        layer, head and position bounds every step, a prefill's by thousands at once); a set of
        ids or values ('in') is made each time. At most CONDITIONS are kept."""
        attr, op, value = c
        if op == "in" or attr == "id":
            return self._condition(n, attr, op, value)
        got = n.conditions.get(c)
        if got is None:
            if len(n.conditions) >= CONDITIONS:
                n.conditions.clear()
            got = n.conditions[c] = self._condition(n, attr, op, value)
        return got

    @staticmethod
    def _condition(n: _Namespace, attr: str, op: str, value):
        t = "id" if attr == "id" else n.schema[attr]
        if t == "id":
            if op not in ("=", "in"):
                raise StoreError(f"the embedded store filters ids by '=' and 'in' only, not {op!r}")
            wanted = [value] if op == "=" else list(value)
            return qe.HasIdCondition({n.slots[i] for i in wanted if i in n.slots})
        if op in ("=", "in"):
            vals = [value] if op == "=" else list(value)
            if t == "float":  # no exact match on floats in Qdrant: a range of one value
                return qe.Filter(should=[qe.FieldCondition(attr, range=qe.RangeFloat(gte=x, lte=x)) for x in vals])
            return qe.FieldCondition(attr, match=qe.MatchValue(vals[0]) if op == "=" else qe.MatchAny(vals))
        if t == "str":
            raise StoreError(
                f"the embedded store can't compare the text attribute {attr!r} with {op!r}: use '=' or 'in'"
            )
        bound = {"<": "lt", "<=": "lte", ">": "gt", ">=": "gte"}[op]
        return qe.FieldCondition(attr, range=qe.RangeFloat(**{bound: float(value)}))

    def _delete(self, ns, layout, filter):
        n = self._get(ns)
        f = self._filter(n, filter)
        with n.lock:
            try:
                slots = self._matching(n, f)
                if len(slots):
                    n.shard.update(qe.UpdateOperation.delete_points(slots.tolist()))
            except Exception as e:
                raise _error(f"delete from {ns!r}", e) from None
            n.forget(slots)
            n.dirty = True

    @staticmethod
    def _matching(n: _Namespace, f) -> np.ndarray:
        out, offset = [], None
        while True:
            recs, offset = n.shard.scroll(
                qe.ScrollRequest(offset=offset, limit=SCROLL, filter=f, with_payload=False, with_vector=False)
            )
            out.extend(r.id for r in recs)
            if offset is None:
                return np.asarray(out, np.int64)

    def _count(self, ns, layout, filter):
        n = self._get(ns)
        f = self._filter(n, filter)
        try:
            return n.shard.count(qe.CountRequest(exact=True, filter=f))
        except Exception as e:
            raise _error(f"count in {ns!r}", e) from None

    def _search(self, ns, layout, queries, metric, include):
        n = self._get(ns)
        filters: dict[str, qe.Filter | None] = {}  # one Filter object per distinct filter
        reqs = []
        for q in queries:
            key = repr(q.filter)
            if key not in filters:
                filters[key] = self._filter(n, q.filter)
            # Every matching document: the limit is an upper bound on the matches, kept tight
            # because the engine allocates for it (a limit of 134k costs ~1 ms over one of 3k).
            limit = q.top_k if q.top_k is not None else n.bound(q.filter)
            reqs.append(
                qe.QueryRequest(
                    limit=max(int(limit), 1),
                    query=qe.Query.Nearest(q.vector, using=metric),
                    filter=filters[key],
                    with_payload=False,
                    with_vector=False,
                    params=_EXACT,
                )
            )
        try:
            results = n.shard.query_batch(qe.QueryBatchRequest(reqs)) if len(reqs) > 1 else [n.shard.query(reqs[0])]
        except Exception as e:
            raise _error(f"search {ns!r}", e) from None
        lens = [len(r) for r in results]
        points = [p for r in results for p in r]
        slots = np.fromiter((p.id for p in points), np.int64, len(points))
        score = np.fromiter((p.score for p in points), np.float64, len(points))
        dist = score if metric == "inner_product" else score ** 2 if metric == "euclidean_squared" else 1.0 - score
        return Hits(np.repeat(np.arange(len(results)), lens), dist, {a: n.cols[a][slots] for a in include})

    # --- metadata: the data directory's (one file for every database in it) ---
    def _put_meta(self, key, value):
        with self.lock:
            self._flush()  # documents before the metadata that vouches for them
            self.home.put_meta(key, value)

    def _get_meta(self, key):
        return self.home.get_meta(key)

    def _flush(self) -> None:
        for ns, n in list(self._ns.items()):
            if n.dirty and ns not in self._ephemeral:
                n.shard.flush()
                n.dirty = False

    # --- what loading checks ---
    def stamp(self, namespaces):
        """{file: [size, sha256]} of every file of these namespaces, read in full
        (``datadir.fingerprint``). Qdrant rewrites some files at every open, with the same bytes."""
        return datadir.fingerprint([self._dir(ns) for ns in namespaces], self.root)

    def release(self, namespaces) -> None:
        """Write out and close these namespaces' shards (reopened on next use): a reader
        child opens them, and a shard is never open in two processes."""
        with self.lock:
            self._flush()
            for ns in namespaces:
                if ns not in self._ephemeral and (n := self._ns.pop(ns, None)) is not None and n.shard is not None:
                    with n.lock:
                        n.shard.close()

    def close(self):
        """Every shard closed, the ephemeral ones removed (the data directory is the Home's)."""
        with self.lock:
            if not self.home.borrowed:
                self._flush()
            for ns in list(self._ephemeral):
                self.drop_namespace(ns)
            for spare in self._spare:
                spare.shard.close()
                datadir.remove(spare.dir, True)
            self._spare.clear()
            for n in self._ns.values():
                if n.shard is not None:
                    n.shard.close()
            self._ns.clear()
