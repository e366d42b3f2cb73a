"""zvec (Alibaba's in-process vector database): the embedded store's database for the weights
(``embedded.py``), its persisted namespaces, written once at load and then searched.

What it uses of zvec 0.8.0:

- exact search only: every metric is a vector field with a Flat (brute-force) index;
  ``inner_product`` is zvec's IP score, ``euclidean_squared`` its L2 score (the squared
  distance), ``cosine_distance`` its COSINE score (1 - cosine); vectors are kept as given;
- one collection per value of the namespace's partition attribute (``create_namespace``'s
  ``partition``: the weights' ``matrix``), so that a product reads its own matrix's rows with
  no filter; a search without that attribute in its filter reads every collection and merges;
- a collection is opened read-only to be searched, where ``query_internal_ids`` returns numpy
  arrays (no Python object per hit) and zvec lets go of Python's lock, so a batch of queries
  runs on a thread per core; it is reopened writable only while it is written (a load).
- beside the weights, where ``build_index`` made one (``--output-search approximate``): an HNSW
  collection of one partition's vectors, padded to one length and searched by cosine, under
  ``zvec-index/`` (the weights' Flat collections, their searches and their stamp are untouched).

Its files in the data directory (the lock and meta.json are the ``datadir.Home``'s):

    zvec/<namespace>/namespace.json   vector length, attributes, metrics, partition, text codes
    zvec/<namespace>/p<code>/col/     the collection of the partition value numbered <code>
    zvec/<namespace>/p<code>/closed   there when the collection was closed after its last write

zvec's fields: ``s``, the document's slot (its zvec primary key too), ``id`` (our string
id) and ``a_<attribute>`` for each attribute. A text attribute is stored as an integer
code (its values listed in namespace.json), so a filter holds numbers only: no quoting.
The process keeps ids and attributes (never vectors) as numpy columns by slot, rebuilt from
the collections when a namespace is first used; counts and deletes are worked out on those
columns, exactly.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import struct
import threading
import uuid
from collections import Counter
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from puffergpt.stores import datadir
from puffergpt.stores.base import Filter, Hits, Layout, NoIndex, Store, StoreError, check_name

# zvec 0.8.0's wheel dies with SIGILL (no Python error) on import on an x86-64 CPU without
# AVX2 or BMI1, and searches need FMA (measured under qemu-user: tests/stores/test_zvec.py).
# AVX-512 it chooses at run time. So it is imported only where /proc/cpuinfo lists these.
NEEDS = ("avx2", "fma", "bmi1")


def cpu_lacks() -> list[str]:
    """The flags of NEEDS this x86-64 CPU lacks ([] elsewhere, or where /proc/cpuinfo can't be read)."""
    if os.uname().machine != "x86_64":
        return []
    try:
        flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), None)
    except OSError:
        return []
    return [] if flags is None else [f for f in NEEDS if f not in flags]


if not cpu_lacks():
    try:
        import zvec
    except ImportError as e:  # a broken install
        raise StoreError(f"the embedded store needs zvec ({e}): pip install zvec==0.8.0") from None

    with contextlib.suppress(RuntimeError):  # once a process; RuntimeError: someone did already
        zvec.init(log_level=zvec.LogLevel.ERROR)

KEPT = "zvec"  # its directory, under the data directory
INDEXES = "zvec-index"  # approximate indexes: INDEXES/<namespace>/<value>.<metric>/col, beside the weights
BUILT = "built.json"  # in an index's directory: what was built (written last: no file, no index)
# M, the padded length, over the longest vector: any M > max |d| ranks alike, and a longer one
# leaves the longest vectors less alone at the edge of the graph (on the demo model at ef 100, 13
# greedy changes in 391 positions against 42 with M just over the longest; the logit's rounding
# grows with M, by as much: still ~5e-6).
PAD_SLACK = 1.5
COPIES = "copies.npy"  # in an index's directory: documents whose vector is another's, left out of the graph
CLEAN = "closed"  # in a collection's directory: closed after its last write
BATCH = 1024  # zvec's largest write batch
MAX_TOP_K = 100_000  # zvec's largest topk
_METRICS = {"inner_product": "IP", "euclidean_squared": "L2", "cosine_distance": "COSINE"}  # zvec.MetricType
_FIELD = {"int": "INT64", "float": "DOUBLE", "str": "INT64"}  # zvec.DataType; str: a code
_CMP = {"=": np.equal, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


def _error(what: str, e: Exception) -> StoreError:
    return StoreError(f"the embedded store (zvec) failed to {what}: {e}")


class _Gate:
    """Many searches of read-only collections at once, or one writer (and mode change)."""

    def __init__(self):
        self.cond, self.readers, self.writing = threading.Condition(), 0, False

    @contextlib.contextmanager
    def shared(self):
        with self.cond:
            self.cond.wait_for(lambda: not self.writing)
            self.readers += 1
        try:
            yield
        finally:
            with self.cond:
                self.readers -= 1
                self.cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self):
        with self.cond:
            self.cond.wait_for(lambda: not self.writing and self.readers == 0)
            self.writing = True
        try:
            yield
        finally:
            with self.cond:
                self.writing = False
                self.cond.notify_all()


@dataclass
class _Part:
    """One collection: the documents of one value of the partition attribute (or all of them)."""

    path: Path  # p<code>/, holding col/ and the clean marker
    col: object = None  # zvec.Collection
    read_only: bool = False
    to_slot: np.ndarray | None = None  # read-only: zvec's internal id -> slot (-1: none)


@dataclass
class _Namespace(datadir.Columns):
    """One namespace: its collections, and its ids and attributes in memory, by slot (= zvec's key)."""

    dim: int
    schema: dict[str, str]
    metrics: tuple[str, ...]
    path: Path  # the namespace's directory
    partition: str | None = None  # the attribute whose values have a collection each
    codes: dict[str, list[str]] = field(default_factory=dict)  # text attribute -> its values, by code
    parts: dict[int, _Part] = field(default_factory=dict)  # partition code (0: no partition) -> collection
    slots: dict[str, int] = field(default_factory=dict)  # string id -> slot
    cols: dict[str, np.ndarray] = field(default_factory=dict)  # "id", "live" and each attribute, by slot
    counts: dict[str, Counter] = field(default_factory=dict)  # int/str attribute -> value -> live documents
    next: int = 0
    dirty: bool = False
    gate: _Gate = field(default_factory=_Gate)

    def layout(self) -> dict:
        return {"dim": self.dim, "schema": self.schema, "metrics": list(self.metrics), "partition": self.partition,
                "codes": self.codes}

    @property
    def spec(self) -> Layout:
        return Layout(self.dim, self.schema, self.metrics, self.partition)

    @property
    def fetch_vector(self) -> str:
        return next(m for m in self.metrics if m != "cosine_distance")  # COSINE ones are normalised

    @property
    def read_only(self) -> bool:
        return all(p.read_only for p in self.parts.values())

    def code_of(self, attr: str, value: str) -> int | None:
        return self._index(attr).get(value)

    def _index(self, attr: str) -> dict[str, int]:
        cache = self.__dict__.setdefault("_code_index", {})
        if attr not in cache or len(cache[attr]) != len(self.codes[attr]):
            cache[attr] = {v: i for i, v in enumerate(self.codes[attr])}
        return cache[attr]

    def part_of(self, slots: np.ndarray) -> np.ndarray:
        """The partition code of each of these live documents: (n,) int64."""
        if self.partition is None:
            return np.zeros(len(slots), np.int64)
        idx = self._index(self.partition)
        return np.fromiter((idx[v] for v in self.cols[self.partition][slots].tolist()), np.int64, len(slots))

    def size(self, key: int) -> int:
        """Live documents in one partition."""
        if self.partition is None:
            return len(self.slots)
        return self.counts[self.partition][self.codes[self.partition][key]]

    def mask(self, f: Filter) -> np.ndarray:
        """(next,) bool: the live documents every condition of f holds for (exact, in numpy)."""
        m = self.cols["live"][: self.next].copy() if self.cols else np.zeros(0, bool)
        for a, op, v in f:
            if a == "id":
                wanted = [self.slots[i] for i in ([v] if op == "=" else v) if i in self.slots]
                m &= np.isin(np.arange(self.next), wanted)
                continue
            col = self.cols[a][: self.next]
            m &= np.isin(col, list(v)) if op == "in" else _CMP[op](col, v)
        return m


class ZvecStore(datadir.NamespaceDirs, Store):
    name = "zvec"
    what = "the embedded store (zvec)"
    metrics = ("inner_product", "cosine_distance", "euclidean_squared")
    max_queries = 16384  # 12 heads x 1,024 positions: a whole prefill in one request
    max_top_k = MAX_TOP_K
    thread_safe = True  # it holds its own locks

    def __init__(self, home: datadir.Home, threads: int | None = None):
        """Its files under ``home``'s directory (see above). ``threads``: a batch of queries runs on
        this many threads (default: one per core; a lone query runs on the caller's)."""
        if lacks := cpu_lacks():
            raise StoreError(f"zvec needs a CPU with {', '.join(NEEDS).upper()}; this one lacks "
                             f"{', '.join(lacks).upper()} (zvec would die with SIGILL)")
        self.home, self.root = home, home.root
        self.kept = self.root / KEPT
        self.kept.mkdir(exist_ok=True)
        for p in [] if home.borrowed else self.kept.glob(".*"):  # half-made or dropped namespaces
            shutil.rmtree(p, ignore_errors=True)
        self.lock = threading.RLock()  # the catalog
        self._ns: dict[str, _Namespace] = {}
        self.threads = max(1, threads or os.cpu_count() or 1)
        self._pool: ThreadPoolExecutor | None = None  # made on the first batch searched on threads
        self._indexes: dict[tuple, object] = {}  # (ns, value, metric) -> an index's collection, read-only

    # --- namespaces ---
    def _open_files(self, ns: str, d: Path, lay: dict) -> _Namespace:
        """A namespace's collections, opened read-only, and its ids and attributes read from them
        (``NamespaceDirs._open``)."""
        n = _Namespace(lay["dim"], lay["schema"], tuple(lay["metrics"]), d, lay.get("partition"), lay.get("codes", {}))
        n.grow(0)
        for p in [] if self.home.borrowed else d.glob(".*"):  # a collection half-made when its process died
            shutil.rmtree(p, ignore_errors=True)
        n.parts = {int(p.name[1:]): _Part(p) for p in sorted(d.glob("p*"), key=lambda p: int(p.name[1:]))}
        try:  # the collections opened and read on the store's threads (zvec lets go of Python's lock)
            for slots, ids, vals in self._each(lambda kp: self._reopen(kp[1], read_only=True) or _read(n, *kp),
                                               n.parts.items()):
                n.slots.update(zip(ids, slots.tolist(), strict=True))
                n.next = max(n.next, int(slots.max()) + 1 if len(slots) else 0)
                n.grow(n.next)
                n.record(slots, ids, vals)
            parts = list(n.parts.values())
            for part, to_slot in zip(parts, self._each(lambda p: _internal_slots(p.col, n), parts), strict=True):
                part.to_slot = to_slot
        except Exception as e:
            self._close(n)
            raise self._damaged(ns, d, e) from None
        return n

    def _each(self, f, items) -> list:
        """f of each item on the store's threads, every one finished; the first error raised."""
        done = [fut.exception() or fut.result() for fut in [self._threads().submit(f, x) for x in items]]
        if bad := next((x for x in done if isinstance(x, BaseException)), None):
            raise bad
        return done

    def _mode(self, n: _Namespace, part: _Part, read_only: bool) -> None:
        """(Re)open a collection read-only (to search it) or writable (to write it)."""
        if part.col is not None and part.read_only == read_only:
            return
        self._reopen(part, read_only)
        part.to_slot = _internal_slots(part.col, n) if read_only else None

    def _reopen(self, part: _Part, read_only: bool) -> None:
        """A collection closed and opened in the mode asked. One written when its process died
        is opened writable once first, so that zvec replays its log."""
        if part.col is not None:
            part.col.close()  # writes it out
            part.col = None
            _mark_clean(part.path, True)
        elif read_only and not (part.path / CLEAN).exists() and not self.home.borrowed:
            zvec.open(str(part.path / "col")).close()
            _mark_clean(part.path, True)
        if not read_only:
            _mark_clean(part.path, False)  # until it is closed: a kill meanwhile leaves zvec a log to replay
        part.col = zvec.open(str(part.path / "col"), zvec.CollectionOption(read_only=read_only))
        part.read_only = read_only

    def _create_namespace(self, ns, layout, ephemeral):
        if ephemeral:  # the embedded store keeps these on Qdrant Edge
            raise StoreError(f"the zvec store keeps persisted namespaces only, not {ns!r}")
        with self.lock:
            if (old := self._layout(ns)) is not None:
                return old
            codes = {a: [] for a, t in layout.schema.items() if t == "str"}
            # zvec keeps COSINE vectors normalised (they come back off by a rounding): a namespace
            # created for cosine also keeps them as given, for fetch, as inner-product vectors.
            metrics = layout.metrics + ("inner_product",) if layout.metrics == ("cosine_distance",) else layout.metrics
            n = _Namespace(layout.dim, dict(layout.schema), metrics, self._dir(ns), layout.partition, codes)
            n.grow(0)
            try:  # made under a hidden name and renamed into place: a kill leaves a leftover, not half a namespace
                tmp = self.kept / f".new-{uuid.uuid4().hex}"
                tmp.mkdir()
                datadir.write_json(tmp / "namespace.json", n.layout())
                os.rename(tmp, n.path)
                datadir.fsync_dir(self.kept)
            except OSError as e:
                raise StoreError(f"can't create namespace {ns!r} in {self.kept}: {e}") from None
            self._ns[ns] = n
        return None

    def _writable(self, n: _Namespace, key: int) -> _Part:
        """Partition key's collection, open to be written (made if it is new)."""
        part = n.parts.get(key)
        if part is None:
            part = self._make_part(n, key)
        self._mode(n, part, read_only=False)
        return part

    @staticmethod
    def _make_part(n: _Namespace, key: int) -> _Part:
        """A new collection, made under a hidden name and renamed into place. No field is indexed:
        a partition's searches filter by nothing else, and each index is a RocksDB that costs
        ~14 ms at every open (75 collections for GPT-2 small)."""
        fields = [zvec.FieldSchema("s", zvec.DataType.INT64), zvec.FieldSchema("id", zvec.DataType.STRING)]
        fields += [zvec.FieldSchema(f"a_{a}", getattr(zvec.DataType, _FIELD[t])) for a, t in n.schema.items()]
        vectors = [zvec.VectorSchema(m, zvec.DataType.VECTOR_FP32, n.dim,
                                     zvec.FlatIndexParam(metric_type=getattr(zvec.MetricType, _METRICS[m])))
                   for m in n.metrics]
        tmp = n.path / f".new-{uuid.uuid4().hex}"
        tmp.mkdir()
        zvec.create_and_open(str(tmp / "col"), zvec.CollectionSchema(name="ns", fields=fields, vectors=vectors)).close()
        _mark_clean(tmp, True)
        os.rename(tmp, n.path / f"p{key}")
        datadir.fsync_dir(n.path)
        n.parts[key] = part = _Part(n.path / f"p{key}")
        return part

    def _drop_namespace(self, ns):
        with self.lock:
            d = self._dir(ns)
            if not d.is_dir():
                return
            n = self._ns.pop(ns, None)
            if n is not None:
                with n.gate.exclusive():
                    self._close(n)
            datadir.remove(d, False)
            self._close_index(ns)
            if (idx := self.root / INDEXES / ns).is_dir():
                datadir.remove(idx, False)

    # --- documents ---
    def _upsert(self, ns, layout, ids, v, cols):
        n = self._get(ns)
        with n.gate.exclusive():
            codes = self._codes(n, cols)
            keys = np.asarray(codes[n.partition], np.int64) if n.partition else np.zeros(len(ids), np.int64)
            slots = n.reserve(ids)
            live = n.cols["live"][slots]
            try:
                moved = live.copy()
                moved[live] = n.part_of(slots[live]) != keys[live]  # its partition value changed
                self._remove(n, slots[moved])
                for key in np.unique(keys).tolist():
                    mine = np.flatnonzero(keys == key).tolist()
                    docs = [_doc(n, int(slots[i]), ids[i], v[i], codes, i) for i in mine]
                    part = self._writable(n, key)
                    for b in range(0, len(docs), BATCH):
                        _check(part.col.upsert(docs[b:b + BATCH]))
            except Exception as e:
                for i in np.asarray(ids, object)[~live]:  # the columns do not hold them: forget the new slots
                    n.slots.pop(i)
                raise _error(f"write to {ns!r}", e) from None
            n.record(slots, ids, cols)
            n.dirty = True

    def _codes(self, n: _Namespace, cols: dict) -> dict[str, list]:
        """The attributes as zvec stores them: a text value as its code, new values recorded
        in namespace.json before any document that holds them is written."""
        out = dict(cols)
        for a in n.codes:
            fresh = [x for x in dict.fromkeys(cols[a]) if n.code_of(a, x) is None]
            if fresh:
                n.codes[a].extend(fresh)
                datadir.write_json(n.path / "namespace.json", n.layout())
            out[a] = [n.code_of(a, x) for x in cols[a]]
        return out

    def _remove(self, n: _Namespace, slots: np.ndarray) -> None:
        """Delete these live documents from their collections (the columns are the caller's)."""
        keys = n.part_of(slots)
        for key in np.unique(keys).tolist():
            part = self._writable(n, key)
            mine = slots[keys == key]
            for b in range(0, len(mine), BATCH):
                _check(part.col.delete([str(s) for s in mine[b:b + BATCH].tolist()]))

    def _fetch(self, ns, layout, ids):
        n = self._get(ns)
        with self._searching(n):
            slots = np.array([n.slots[i] for i in ids if i in n.slots], np.int64)
            keys, got = n.part_of(slots), {}
            for key in np.unique(keys).tolist():
                want = [str(s) for s in slots[keys == key].tolist()]
                try:
                    docs = n.parts[key].col.fetch(want, output_fields=[], include_vector=True)
                except Exception as e:
                    raise _error(f"read from {ns!r}", e) from None
                if len(docs) != len(set(want)):
                    raise StoreError(f"namespace {ns!r} lost documents its ids list; the store is damaged: "
                                     "run `puffergpt load --repair`")
                got |= {n.cols["id"][int(k)]: np.asarray(d.vector(n.fetch_vector), np.float32) for k, d in docs.items()}
        return got

    def _delete(self, ns, layout, filter):
        n = self._get(ns)
        with n.gate.exclusive():
            slots = np.flatnonzero(n.mask(filter))
            if not len(slots):
                return
            try:
                self._remove(n, slots)
            except Exception as e:
                raise _error(f"delete from {ns!r}", e) from None
            n.forget(slots)
            n.dirty = True

    def _count(self, ns, layout, filter):
        n = self._get(ns)
        with n.gate.shared():
            return int(n.mask(filter).sum())

    # --- search ---
    def _search(self, ns, layout, queries, metric, include):
        n = self._get(ns)
        with self._searching(n):
            asks = [a for i, q in enumerate(queries) for a in self._asks(n, i, q)]
            if self.threads > 1 and len(asks) > 1:  # zvec lets go of Python's lock as it searches
                got = self._on_threads(n, metric, asks)
            else:
                got = [_ask(n, metric, a) for a in asks]
        best_first = metric == "inner_product"  # larger is closer; the other two: smaller
        by_query: dict[int, list] = {}
        for a, hit in zip(asks, got, strict=True):
            by_query.setdefault(a.query, []).append(hit)
        parts = [_merged(hits, queries[i].top_k, best_first) for i, hits in sorted(by_query.items())]
        qi = np.concatenate([np.full(len(s), i, np.int64) for i, (s, _) in zip(sorted(by_query), parts, strict=True)]
                            or [np.zeros(0, np.int64)])
        slots = np.concatenate([s for s, _ in parts] or [np.zeros(0, np.int64)])
        dist = np.concatenate([d for _, d in parts] or [np.zeros(0)]).astype(np.float64)
        return Hits(qi, dist, {a: n.cols[a][slots] for a in include})

    def _on_threads(self, n: _Namespace, metric: str, asks: list) -> list:
        """The asks in as many runs as there are threads, one a thread (a task each would cost
        the pool's hand-off 128 times for a 128-token prefill's product), in their order."""
        k = min(self.threads, len(asks))
        cuts = [len(asks) * j // k for j in range(k + 1)]
        runs = [self._threads().submit(lambda lo, hi: [_ask(n, metric, a) for a in asks[lo:hi]], lo, hi)
                for lo, hi in zip(cuts, cuts[1:], strict=False)]
        futures.wait(runs)  # every run ended before an error is raised: none searches on behind it
        return [hit for run in runs for hit in run.result()]

    def _threads(self) -> ThreadPoolExecutor:
        with self.lock:
            if self._pool is None or self._pool._max_workers != self.threads:  # made anew if threads changed
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="zvec")
            return self._pool

    @contextlib.contextmanager
    def _searching(self, n: _Namespace):
        """n's collections, all read-only, held shared (reopened read-only first where written)."""
        while True:
            with n.gate.shared():
                if n.read_only:
                    yield
                    return
            with n.gate.exclusive():
                try:
                    for part in n.parts.values():
                        self._mode(n, part, read_only=True)
                except Exception as e:
                    raise _error(f"open {n.path.name!r} to search it", e) from None

    def _asks(self, n: _Namespace, i: int, q) -> list[_Ask]:
        """What query i asks of each collection: none if nothing can match; a part of each
        collection its filter's partition values allow (every one without them); several
        where an every-row query has more matches than zvec's topk allows."""
        keys, rest = self._partitions(n, q.filter)
        f = self._filter(n, rest)
        if f is None or (q.top_k is not None and q.top_k == 0):
            return []
        if q.top_k is not None and q.top_k > MAX_TOP_K:
            raise StoreError(f"the zvec store returns at most {MAX_TOP_K:,} hits a query, not top_k={q.top_k:,}")
        out = []
        for key in keys:
            limit = min(n.size(key), n.bound(rest)) if q.top_k is None else min(q.top_k, n.size(key))
            if limit == 0:
                continue
            if limit <= MAX_TOP_K:
                out.append(_Ask(i, key, q.vector, f, limit))
                continue
            # More matches than zvec returns at once: runs of slots (zvec scans such a range: slow, rare).
            cuts = list(range(0, n.next, MAX_TOP_K)) + [n.next]
            out += [_Ask(i, key, q.vector, " and ".join(x for x in (f, f"s >= {lo} and s < {hi}") if x), MAX_TOP_K)
                    for lo, hi in zip(cuts, cuts[1:], strict=False)]
        return out

    @staticmethod
    def _partitions(n: _Namespace, f: Filter) -> tuple[list[int], Filter]:
        """The partitions f can match (from its '=' and 'in' on the partition attribute), and
        the rest of f, which zvec filters within each."""
        keys = set(n.parts)
        if n.partition is None:
            return sorted(keys), f
        rest = []
        for a, op, v in f:
            if a == n.partition and op in ("=", "in"):
                keys &= {c for x in ([v] if op == "=" else v) if (c := n.code_of(a, x)) is not None}
            else:
                rest.append((a, op, v))
        return sorted(keys), tuple(rest)

    @staticmethod
    def _filter(n: _Namespace, f: Filter) -> str | None:
        """f as a zvec filter ("" for none), or None where nothing can match it. Values are
        numbers only (a text value is its code), written so that zvec reads them back exactly."""
        out = []
        for attr, op, value in f:
            t = "id" if attr == "id" else n.schema[attr]
            if t == "str" and op not in ("=", "in"):
                raise StoreError(f"the embedded store can't compare the text attribute {attr!r} with {op!r}: "
                                 "use '=' or 'in'")
            if t == "id" and op not in ("=", "in"):
                raise StoreError(f"the embedded store filters ids by '=' and 'in' only, not {op!r}")
            vals = [value] if op != "in" else list(value)
            if t == "id":
                vals = [n.slots[x] for x in vals if x in n.slots]
            elif t == "str":
                vals = [c for x in vals if (c := n.code_of(attr, x)) is not None]
            elif t == "float" and not all(math.isfinite(x) for x in vals):
                raise StoreError(f"filter {attr!r} {op} {value!r}: the embedded store compares finite numbers only")
            if not vals:
                return None  # a value no document holds
            name = "s" if t == "id" else f"a_{attr}"
            text = [repr(x) for x in vals]  # repr: the shortest decimal that reads back as the same float
            out.append(f"{name} in ({', '.join(text)})" if len(vals) > 1 or op == "in" else f"{name} {op} {text[0]}")
        return " and ".join(out)

    # --- an approximate index (HNSW) over one partition: a collection of its own ---
    def _index_dir(self, ns: str, on: tuple[str, str], metric: str) -> Path:
        if on[0] != self._get(ns).partition:
            raise StoreError(f"the embedded store indexes the documents of one value of a namespace's partition "
                             f"attribute ({self._get(ns).partition}), not of {on[0]!r}")
        return self.root / INDEXES / check_name(ns) / f"{hashlib.sha1(on[1].encode()).hexdigest()[:16]}.{metric}"

    def _has_index(self, ns, on, metric):
        return (self._index_dir(ns, on, metric) / BUILT).exists()

    def _build_index(self, ns, layout, on, metric, params, progress):
        """A copy of the partition's vectors in a collection of its own with an HNSW index (zvec
        builds it at ``optimize``), its primary key the document's slot. The weights' Flat
        collections are left as they are: the exact search, and their stamp, do not change.

        HNSW finds nearest neighbours; the inner product is not a distance. The standard
        reduction: each vector d is padded to one length M, (d, sqrt(M^2 - |d|^2)), and a query
        q to (q, 0), so that the cosine between them is d.q / (M |q|): the nearest by cosine is
        the largest inner product (measured: better recall than HNSW on the inner product itself).

        Identical vectors go into the graph once (the demo model's 34,643 untrained tokens share
        one vector: HNSW can't find its way through thousands of copies of one point, measured
        recall 0.01 to 0.9 from build to build); a hit on one brings its copies, same score, after it."""
        if metric != "inner_product":
            raise StoreError(f"the embedded store's approximate index ranks by inner product (puffergpt's default "
                             f"encoding), not {metric}: load the model without --metric")
        n, final = self._get(ns), self._index_dir(ns, on, metric)
        slots = np.flatnonzero(n.mask(((on[0], "=", on[1]),)))
        if not len(slots):
            raise StoreError(f"namespace {ns!r} holds no documents with {on[0]}={on[1]!r} to index")
        m, efc = int(params.get("m", 16)), int(params.get("ef_construction", 100))
        vectors = self._fetch(ns, layout, n.cols["id"][slots].tolist())
        d = np.stack([vectors[i] for i in n.cols["id"][slots]])  # (rows, dim)
        _, first, inverse = np.unique(d, axis=0, return_index=True, return_inverse=True)
        every, copy_of = slots, slots[first][inverse.ravel()]  # each document's first copy (itself where none)
        first = np.sort(first)
        slots, d = slots[first], d[first]  # the distinct vectors, in slot order
        sq = (d.astype(np.float64) ** 2).sum(axis=1)
        M = float(np.sqrt(sq.max())) * PAD_SLACK + 1e-6
        d = np.concatenate([d, np.sqrt(M * M - sq).astype(np.float32)[:, None]], axis=1)  # (rows, dim + 1), |.| = M
        hnsw = zvec.HnswIndexParam(metric_type=zvec.MetricType.COSINE, m=m, ef_construction=efc)
        schema = zvec.CollectionSchema(name="ann", fields=[zvec.FieldSchema("s", zvec.DataType.INT64)],
                                       vectors=[zvec.VectorSchema("ann", zvec.DataType.VECTOR_FP32, n.dim + 1, hnsw)])
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".new-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            col = zvec.create_and_open(str(tmp / "col"), schema)
            try:
                for b in range(0, len(slots), BATCH):
                    _check(col.upsert([zvec.Doc(id=str(int(sl)), vectors={"ann": d[b + j]}, fields={"s": int(sl)})
                                       for j, sl in enumerate(slots[b:b + BATCH])]))
                    if progress:
                        progress(min(b + BATCH, len(slots)), len(slots))
                col.optimize()  # the HNSW graph, built on every core
            finally:
                col.close()
            built = {"kind": "hnsw", "database": "zvec", "metric": metric, "m": m, "ef_construction": efc,
                     "rows": len(copy_of), "distinct": int(len(slots)),
                     "reduction": "padded to one length, searched by cosine"}
            copy = every != copy_of
            np.save(tmp / COPIES, np.stack([every[copy], copy_of[copy]]))  # (2, copies): slot, its first copy
            datadir.write_json(tmp / BUILT, {**built, "M": M})
            self._close_index(ns, on, metric)
            if final.exists():
                datadir.remove(final, False)
            os.rename(tmp, final)
            datadir.fsync_dir(final.parent)
        except Exception as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise _error(f"build an index over {ns} {on[0]}={on[1]}", e) from None
        return built

    def _index_stamp(self, ns, on, metric):
        d = self._index_dir(ns, on, metric)
        if not (d / BUILT).exists():
            return None
        return datadir.fingerprint([d], self.root, _file_digest, skip=("LOCK",))

    def _index(self, ns: str, on: tuple[str, str], metric: str) -> tuple[object, float, dict, int]:
        """The index's collection, opened read-only once (searches share it), its vectors' length M,
        the copies left out of its graph (first copy's slot -> the others' slots), its vectors' count.
        Files that can't be read are a StoreError naming them and the command that builds it again."""
        k = (ns, on, metric)
        with self.lock:
            if k not in self._indexes:
                d = self._index_dir(*k)
                if not (d / BUILT).exists():
                    raise NoIndex(f"the embedded store has no approximate index over {ns} {on[0]}={on[1]}")
                try:
                    built = json.loads((d / BUILT).read_text())
                    copies = _groups(*np.load(d / COPIES))
                    M, distinct = float(built["M"]), int(built["distinct"])
                    col = zvec.open(str(d / "col"), zvec.CollectionOption(read_only=True))
                except Exception as e:  # garbage in built.json, a truncated file: zvec's RuntimeError
                    raise StoreError(f"the approximate index of {ns} {on[0]}={on[1]} in {d} can't be read "
                                     f"({type(e).__name__}: {e}): it is damaged; build it again "
                                     "(`puffergpt load --model M --output-index --repair`)") from None
                self._indexes[k] = (col, M, copies, distinct)
            return self._indexes[k]

    def _close_index(self, ns: str, on: tuple | None = None, metric: str | None = None) -> None:
        with self.lock:
            for k in [k for k in self._indexes if k[0] == ns and on in (None, k[1]) and metric in (None, k[2])]:
                self._indexes.pop(k)[0].close()

    def _search_approximate(self, ns, layout, on, queries, metric, include, ef):
        """Each query's top_k by the HNSW graph. zvec scores each hit on its full-precision vector
        (no quantization): the cosine c of (d, pad) and (q, 0) gives d.q = (1 - c) M |q|."""
        n, (col, M, copies, distinct) = self._get(ns), self._index(ns, on, metric)
        qi, slots, dist = [], [], []
        for i, q in enumerate(queries):
            try:
                ask = zvec.Query("ann", vector=np.append(q.vector, np.float32(0)), param=zvec.HnswQueryParam(ef=ef))
                ids, scores = col.query_internal_ids(ask, topk=max(q.top_k, 1), return_scores=True)
            except Exception as e:
                raise _error(f"search the index of {ns} {on[0]}={on[1]}", e) from None
            keep = ids[ids >= 0][: q.top_k]
            if len(keep) < min(q.top_k, distinct):  # zvec pads a short answer with -1: a graph that lost nodes
                raise StoreError(f"the approximate index of {ns} {on[0]}={on[1]} returned {len(keep)} of "
                                 f"{q.top_k} hits: it is damaged; build it again "
                                 "(`puffergpt load --model M --output-index --repair`)")
            found = np.asarray(col.resolve_internal_ids(keep), dtype=np.int64)
            qn = float(np.sqrt((q.vector.astype(np.float64) ** 2).sum()))
            score = (1 - scores[: len(keep)].astype(np.float64)) * M * qn  # cosine distance -> d.q
            with_copies = [np.concatenate([[s], copies.get(int(s), [])]).astype(np.int64) for s in found]
            mine = np.concatenate(with_copies or [np.zeros(0, np.int64)])[: q.top_k]  # a copy: its first's score
            slots.append(mine)
            dist.append(np.repeat(score, [len(c) for c in with_copies])[: q.top_k])
            qi.append(np.full(len(mine), i, np.int64))
        s = np.concatenate(slots)
        return Hits(np.concatenate(qi), np.concatenate(dist), {a: n.cols[a][s] for a in include})

    # --- metadata: the data directory's (one file for every database in it) ---
    def _put_meta(self, key, value):
        with self.lock:
            self._flush()  # documents before the metadata that vouches for them
            self.home.put_meta(key, value)

    def _get_meta(self, key):
        return self.home.get_meta(key)

    def _flush(self) -> None:
        for n in list(self._ns.values()):
            if n.dirty:
                with n.gate.exclusive():
                    for part in n.parts.values():
                        if not part.read_only:
                            part.col.flush()
                    n.dirty = False

    # --- what loading checks ---
    def stamp(self, namespaces):
        """{file: [size, digest]} of these namespaces' files, read in full (``datadir.fingerprint``;
        the Flat indexes' digests leave out what zvec rewrites at every close: ``_index_digest``)."""
        return datadir.fingerprint([self._dir(ns) for ns in namespaces], self.root, _file_digest, skip=("LOCK",))

    def release(self, namespaces) -> None:
        """Write out and close these namespaces' collections (reopened on next use): a reader
        child opens them, and zvec locks a collection to one opener."""
        with self.lock:
            self._flush()
            for ns in namespaces:
                if (n := self._ns.pop(ns, None)) is not None:
                    with n.gate.exclusive():
                        self._close(n)

    def _close(self, n: _Namespace) -> None:
        for part in n.parts.values():
            if part.col is not None:
                part.col.close()
                part.col = None
                if not self.home.borrowed:
                    _mark_clean(part.path, True)

    def close(self):
        with self.lock:
            if not self.home.borrowed:
                self._flush()
            for col, *_ in self._indexes.values():
                col.close()
            self._indexes.clear()
            for n in self._ns.values():
                self._close(n)
            self._ns.clear()
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None


@dataclass(frozen=True)
class _Ask:
    """One search of one collection: a query's part."""

    query: int  # its number in the batch
    key: int  # the partition
    vector: np.ndarray
    filter: str  # zvec's filter ("" for none)
    top_k: int


def _read(n: _Namespace, key: int, part: _Part) -> tuple[np.ndarray, list[str], dict[str, list]]:
    """One collection's (slots, ids, attributes), to go into the columns (its partition value
    is its key's, so zvec is not asked for it)."""
    read = [a for a in n.schema if a != n.partition]
    with part.col.iter_docs(output_fields=["id", *(f"a_{a}" for a in read)], include_vector=False) as docs:
        got = [(d.id, d.fields) for d in docs]
    slots = np.fromiter((int(k) for k, _ in got), np.int64, len(got))
    vals = {a: [f[f"a_{a}"] for _, f in got] for a in read}
    for a in read:
        if n.schema[a] == "str":
            vals[a] = [n.codes[a][c] for c in vals[a]]
    if n.partition is not None:
        vals[n.partition] = [n.codes[n.partition][key]] * len(got)
    return slots, [f["id"] for _, f in got], vals


def _doc(n: _Namespace, slot: int, id: str, vector: np.ndarray, codes: dict[str, list], i: int):
    """Document i of a write as zvec keeps it: its slot as primary key, a vector per metric."""
    fields = {"s": slot, "id": id, **{f"a_{a}": codes[a][i] for a in n.schema}}
    return zvec.Doc(id=str(slot), vectors={m: vector for m in n.metrics}, fields=fields)


def _ask(n: _Namespace, metric: str, a: _Ask) -> tuple[np.ndarray, np.ndarray]:
    """(slots, scores) of one ask, best first, on its read-only collection."""
    part = n.parts[a.key]
    try:
        ids, scores = part.col.query_internal_ids(zvec.Query(metric, vector=a.vector), topk=a.top_k,
                                                  filter=a.filter or None, return_scores=True)
    except Exception as e:
        raise _error(f"search {n.path.name!r}", e) from None
    keep = ids >= 0
    return part.to_slot[ids[keep]], scores[keep]


def _merged(hits: list[tuple[np.ndarray, np.ndarray]], top_k: int | None, larger_first: bool):
    """One query's hits from several collections: all of them, or the top_k best, best first."""
    slots, scores = (np.concatenate(x) for x in zip(*hits, strict=True)) if len(hits) > 1 else hits[0]
    if top_k is None or len(hits) == 1:
        return slots, scores
    order = np.argsort(-scores if larger_first else scores, kind="stable")[:top_k]
    return slots[order], scores[order]


def _internal_slots(col, n: _Namespace) -> np.ndarray:
    """zvec's internal ids -> our slots (-1: none), for ``query_internal_ids``: every document
    of the collection found by one search (by runs of slots where there are more than zvec's topk)."""
    probe, count = zvec.Query(n.metrics[0], vector=np.ones(n.dim, np.float32)), col.stats.doc_count
    if count <= MAX_TOP_K:
        internal = [col.query_internal_ids(probe, topk=max(count, 1))]
    else:
        internal = [col.query_internal_ids(probe, topk=MAX_TOP_K, filter=f"s >= {lo} and s < {lo + MAX_TOP_K}")
                    for lo in range(0, n.next, MAX_TOP_K)]
    internal = np.concatenate(internal)
    internal = internal[internal >= 0]
    out = np.full(int(internal.max()) + 1 if len(internal) else 0, -1, np.int64)
    out[internal] = np.asarray(col.resolve_internal_ids(internal), dtype=np.int64)
    return out


def _groups(copy: np.ndarray, of: np.ndarray) -> dict[int, np.ndarray]:
    """Copies by their first copy: {first's slot: the others' slots, in slot order} (none: {})."""
    order = np.lexsort((copy, of))
    firsts, starts = np.unique(of[order], return_index=True)
    ends = [*starts[1:].tolist(), len(of)] if len(of) else []
    return {int(f): copy[order][a:b] for f, a, b in zip(firsts.tolist(), starts.tolist(), ends, strict=True)}


def _check(statuses) -> None:
    bad = [s for s in statuses if not s.ok()]
    if bad:
        raise StoreError(f"{len(bad)} of {len(statuses)} documents refused: {bad[0]}")


def _mark_clean(d: Path, clean: bool) -> None:
    """The marker that d's collection was closed since it was last opened writable."""
    p = d / CLEAN
    if clean and not p.exists():
        p.touch()
        datadir.fsync_dir(d)
    elif not clean and p.exists():
        p.unlink()
        datadir.fsync_dir(d)


# --- the digest of a collection's files (the stamp) ---
_HEADER = struct.Struct("<IHHIIHHIIIQ3Q")  # a Flat index file's meta header (zvec's IndexFormat::MetaHeader)
_FOOTER = struct.Struct("<IIIIIIQQQQ8QQ")  # its meta footer: footer_crc, ..., update_time, reserved[8], total_size
_SEGMENT = struct.Struct("<IIQQQ")  # a segment's meta: id offset, data crc, data index, data size, padding


def _file_digest(p: Path) -> str:
    return _index_digest(p) if p.suffix == ".proxima" else datadir.sha256(p)


def _index_digest(p: Path) -> str:
    """sha256 of a Flat index file (``*.proxima``, where zvec keeps the vectors) with the 20 bytes
    zvec 0.8.0 rewrites whenever it closes the collection, even read-only, read as zeros: its meta
    footer's update time and that footer's crc32c, and the update time in the 'flat.linear_meta'
    segment. zvec checks the footer's crc whenever it opens the file (so a flip there is refused by
    zvec itself), and no search reads the linear meta's update time (tests/stores/test_zvec.py
    flips both). A file that is not laid out as expected is hashed whole."""
    holes = _rewritten(p)
    h = hashlib.sha256()
    with open(p, "rb") as f:
        at = 0
        for start, n in holes + [(None, 0)]:
            while start is None or at < start:
                chunk = f.read(1 << 20 if start is None else min(1 << 20, start - at))
                if not chunk:
                    break
                h.update(chunk)
                at += len(chunk)
            if start is not None:
                h.update(bytes(n))
                f.seek(n, os.SEEK_CUR)
                at += n
    return h.hexdigest()


def _rewritten(p: Path) -> list[tuple[int, int]]:
    """(offset, length) of what zvec rewrites in a Flat index file (or an HNSW graph's: the same
    footer, and the update time at byte 96 of its 'HnswT2S0' segment, beside its creation time)
    at every close, in order; [] where the file is not the one meta section with its footer
    where zvec 0.8.0 puts it."""
    with open(p, "rb") as f:
        head = f.read(_HEADER.size)
        if len(head) < _HEADER.size:
            return []
        hsize, fsize, foff, content = _HEADER.unpack(head)[5:9]
        if hsize != _HEADER.size or fsize != _FOOTER.size or content < foff + fsize:
            return []
        f.seek(foff)
        footer = _FOOTER.unpack(f.read(fsize))
        count, table_size, reserved = footer[3], footer[4], footer[10:18]
        if any(reserved) or table_size > foff:  # a second meta section (next_meta_header_offset): not ours
            return []
        f.seek(foff - table_size)
        table = f.read(table_size)
    for i in range(count):
        id_at, _, index, size, _ = _SEGMENT.unpack_from(table, i * _SEGMENT.size)
        name = table[id_at:table.index(b"\0", id_at)]
        if name == b"flat.linear_meta" and size >= 16:
            return [(foff, 4), (foff + 48, 8), (content + index + 8, 8)]
        if name == b"HnswT2S0" and size >= 104:  # an HNSW graph's file (the approximate index): its update time
            return [(foff, 4), (foff + 48, 8), (content + index + 96, 8)]
    return []
