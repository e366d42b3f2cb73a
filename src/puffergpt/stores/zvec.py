"""The zvec backend: zvec (Alibaba's in-process vector database), under the data directory.

A study against the embedded default (Qdrant Edge): benchmarks/zvec_vs_qdrant.py and the
zvec section of benchmarks/RESULTS.md. What it uses of zvec:

- exact search only: every metric is a vector field with a Flat (brute-force) index;
  ``inner_product`` is zvec's IP score, ``euclidean_squared`` its L2 score (the squared
  distance), ``cosine_distance`` its COSINE score (1 - cosine); vectors are kept as given;
- a persisted namespace (a model's weights) is written once at load and then searched:
  it is opened read-only for searching, where ``query_internal_ids`` returns numpy arrays
  (no Python object per hit), and read-write only while it is written;
- an ephemeral namespace (a text's keys, written every token) stays read-write and is
  searched with ``query``, which returns one Doc per hit (a few dozen a search).

Layout of the data directory (one process at a time, held by ``zvec/puffergpt.lock``):

    zvec/format.json                  {"format": FORMAT}
    zvec/ns/<namespace>/namespace.json   its vector length, attributes, metrics, text codes
    zvec/ns/<namespace>/col/          its zvec collection
    zvec/meta.json                    put_meta / get_meta, replaced atomically
    zvec/tmp/                         ephemeral namespaces, wiped at open

zvec's fields: ``s``, the document's slot (its zvec primary key too), ``id`` (our string
id) and ``a_<attribute>`` for each attribute. A text attribute is stored as an integer
code (its values listed in namespace.json), so a filter holds numbers only: no quoting.
As in the embedded store, the process keeps ids and attributes (never vectors) as numpy
columns by slot, rebuilt from the collection when a namespace is first used; counts and
deletes are worked out on those columns, exactly.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from puffergpt.stores import datadir
from puffergpt.stores.base import Filter, Hits, Layout, Store, StoreError, check_name

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
    except ImportError as e:  # the package's optional dependency
        raise StoreError(f"the zvec backend needs zvec ({e}): pip install 'puffergpt[zvec]' (or zvec==0.8.0)") from None

    with contextlib.suppress(RuntimeError):  # once a process; RuntimeError: someone did already
        zvec.init(log_level=zvec.LogLevel.ERROR)

FORMAT = 1
LOCK_FILE = "puffergpt.lock"
CLEAN = "closed"  # in a namespace's directory: its collection was closed after its last write
BATCH = 1024  # zvec's largest write batch
MAX_TOP_K = 100_000  # zvec's largest topk
_METRICS = {"inner_product": "IP", "euclidean_squared": "L2", "cosine_distance": "COSINE"}  # zvec.MetricType
_FIELD = {"int": "INT64", "float": "DOUBLE", "str": "INT64"}  # zvec.DataType; str: a code
_CMP = {"=": np.equal, "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal}


def _error(what: str, e: Exception) -> StoreError:
    return StoreError(f"the zvec store failed to {what}: {e}")


class _Gate:
    """Many searches of a read-only collection at once, or one writer (and mode change)."""

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
class _Namespace(datadir.Columns):
    """One namespace: its collection, and its ids and attributes in memory, by slot (= zvec's key)."""

    dim: int
    schema: dict[str, str]
    metrics: tuple[str, ...]
    path: Path  # the namespace's directory
    ephemeral: bool = False
    codes: dict[str, list[str]] = field(default_factory=dict)  # text attribute -> its values, by code
    col: object = None  # zvec.Collection, opened on first use
    read_only: bool = False
    to_slot: np.ndarray | None = None  # read-only: zvec's internal id -> slot
    slots: dict[str, int] = field(default_factory=dict)  # string id -> slot
    cols: dict[str, np.ndarray] = field(default_factory=dict)  # "id", "live" and each attribute, by slot
    counts: dict[str, Counter] = field(default_factory=dict)  # int/str attribute -> value -> live documents
    next: int = 0
    dirty: bool = False
    gate: _Gate = field(default_factory=_Gate)

    def layout(self) -> dict:
        return {"dim": self.dim, "schema": self.schema, "metrics": list(self.metrics), "codes": self.codes}

    @property
    def spec(self) -> Layout:
        return Layout(self.dim, self.schema, self.metrics)

    def code_of(self, attr: str, value: str) -> int | None:
        return self._index(attr).get(value)

    def _index(self, attr: str) -> dict[str, int]:
        cache = self.__dict__.setdefault("_code_index", {})
        if attr not in cache or len(cache[attr]) != len(self.codes[attr]):
            cache[attr] = {v: i for i, v in enumerate(self.codes[attr])}
        return cache[attr]

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


class ZvecStore(Store):
    name = "zvec"
    metrics = ("inner_product", "cosine_distance", "euclidean_squared")
    max_queries = 16384  # 12 heads x 1,024 positions: a whole prefill's attention in one request
    max_top_k = MAX_TOP_K
    thread_safe = True  # it holds its own locks

    def __init__(self, data_dir: Path, borrowed: bool = False, threads: int | None = None):
        """``borrowed``: opened by a reader child (``read_isolated``) while its parent holds the
        lock and waits. ``threads``: a batch of queries to a read-only namespace runs on this many
        threads (default 1: benchmarks/zvec_vs_qdrant.py measures both)."""
        if lacks := cpu_lacks():
            raise StoreError(f"the zvec store needs a CPU with {', '.join(NEEDS).upper()}; this one lacks "
                             f"{', '.join(lacks).upper()} (zvec would die with SIGILL): use --backend embedded")
        if data_dir is None:
            raise StoreError("the zvec store needs a data directory: give --data DIR")
        self.root = Path(data_dir)
        self.home = self.root / "zvec"
        self.path = self.root  # what the CLI names and measures
        self.borrowed = borrowed
        try:
            self.home.mkdir(parents=True, exist_ok=True)
            self._lock_file = open(os.devnull) if borrowed else datadir.hold(self.home / LOCK_FILE, self.root)
            self._check_format()
            for d in ("ns", "tmp"):
                (self.home / d).mkdir(exist_ok=True)
            # Leftovers of a process that died: half-made namespaces, dropped ones, ephemeral ones.
            for p in [] if borrowed else [*(self.home / "ns").glob(".*"), *(self.home / "tmp").iterdir()]:
                shutil.rmtree(p, ignore_errors=True)
        except OSError as e:
            raise StoreError(
                f"can't open the data directory {data_dir}: {e}. Choose another with --data DIR."
            ) from None
        self.lock = threading.RLock()  # the catalog and the metadata file
        self._ns: dict[str, _Namespace] = {}
        self._ephemeral: set[str] = set()
        self.threads = max(1, threads or 1)
        self._pool: ThreadPoolExecutor | None = None  # made on the first batch searched on threads
        self._meta = self._read_meta()

    def _check_format(self) -> None:
        p = self.home / "format.json"
        if not p.exists():
            datadir.write_json(p, {"format": FORMAT})
            return
        try:
            found = json.loads(p.read_text())["format"]
        except (ValueError, KeyError, TypeError) as e:
            raise StoreError(f"can't read {p}: {e}. Move {self.home} away and load the models again") from None
        if found != FORMAT:
            raise StoreError(f"{self.home} holds a zvec store of format {found}; this puffergpt reads format {FORMAT}. "
                             f"Move it away (`mv {self.home} {self.home}.old`) and load the models again "
                             f"(`puffergpt load --model MODEL --backend zvec --data {self.root}`)")

    # --- namespaces ---
    def _dir(self, ns: str) -> Path:
        return self.home / ("tmp" if ns in self._ephemeral else "ns") / check_name(ns)

    def _get(self, ns: str) -> _Namespace:
        n = self._ns.get(ns)
        if n is None:
            with self.lock:
                n = self._ns.get(ns) or self._open(ns)
        return n

    def _open(self, ns: str) -> _Namespace:
        """A persisted namespace, opened read-only: its ids and attributes read from the collection."""
        d = self._dir(ns)
        try:
            lay = json.loads((d / "namespace.json").read_text())
        except FileNotFoundError:
            raise StoreError(f"namespace {ns!r} does not exist") from None
        except ValueError as e:
            raise self._damaged(ns, d, e) from None
        n = _Namespace(lay["dim"], lay["schema"], tuple(lay["metrics"]), d, codes=lay.get("codes", {}))
        n.grow(0)
        try:
            if not (d / CLEAN).exists() and not self.borrowed:  # written when the process died
                zvec.open(str(d / "col")).close()  # opened writable once: zvec replays its log
                _mark_clean(d, True)
            n.col, n.read_only = zvec.open(str(d / "col"), zvec.CollectionOption(read_only=True)), True
            self._rebuild(n)
            n.to_slot = self._internal_slots(n)
        except Exception as e:
            if n.col is not None:
                n.col.close()
            raise self._damaged(ns, d, e) from None
        self._ns[ns] = n
        return n

    @staticmethod
    def _damaged(ns: str, d: Path, e: Exception) -> StoreError:
        return StoreError(f"the zvec store can't read namespace {ns!r} ({d}): {e}. "
                          f"Drop it and load again (`puffergpt load --repair`), or restore the data directory")

    def _rebuild(self, n: _Namespace) -> None:
        fields = ["s", "id", *(f"a_{a}" for a in n.schema)]
        slots, ids, vals = [], [], {a: [] for a in n.schema}
        with n.col.iter_docs(output_fields=fields, include_vector=False) as docs:
            for doc in docs:
                slots.append(doc.field("s"))
                ids.append(doc.field("id"))
                for a in n.schema:
                    vals[a].append(doc.field(f"a_{a}"))
        for a, t in n.schema.items():
            if t == "str":
                vals[a] = [n.codes[a][c] for c in vals[a]]
        s = np.asarray(slots, np.int64)
        n.slots = dict(zip(ids, slots, strict=True))
        n.next = int(s.max()) + 1 if len(s) else 0
        n.grow(n.next)
        n.record(s, ids, vals)

    def _mode(self, n: _Namespace, read_only: bool) -> None:
        """(Re)open n's collection read-only (to search it) or read-write (to write it)."""
        if n.col is not None and n.read_only == read_only:
            return
        if n.col is not None:
            n.col.close()  # writes it out
            n.col, n.dirty = None, False
            if not n.ephemeral:
                _mark_clean(n.path, True)
        if not read_only and not n.ephemeral:
            _mark_clean(n.path, False)  # until it is closed: a kill meanwhile leaves zvec a log to replay
        n.col = zvec.open(str(n.path / "col"), zvec.CollectionOption(read_only=read_only))
        n.read_only = read_only
        n.to_slot = self._internal_slots(n) if read_only else None

    def _internal_slots(self, n: _Namespace) -> np.ndarray:
        """zvec's internal ids -> our slots (-1: none), for ``query_internal_ids``."""
        probe = zvec.Query(n.metrics[0], vector=np.ones(n.dim, np.float32))
        internal = []
        for lo in range(0, max(n.next, 1), MAX_TOP_K):
            got = n.col.query_internal_ids(probe, topk=MAX_TOP_K, filter=f"s >= {lo} and s < {lo + MAX_TOP_K}")
            internal.append(got[got >= 0])
        internal = np.concatenate(internal)
        out = np.full(int(internal.max()) + 1 if len(internal) else 0, -1, np.int64)
        out[internal] = np.asarray(n.col.resolve_internal_ids(internal), dtype=np.int64)
        return out

    def _layout(self, ns):
        if ns not in self._ns and not (self._dir(ns) / "namespace.json").exists():
            return None
        return self._get(ns).spec

    def _create_namespace(self, ns, layout, ephemeral):
        with self.lock:
            if (old := self._layout(ns)) is not None:
                return old
            codes = {a: [] for a, t in layout.schema.items() if t == "str"}
            if ephemeral:
                self._ephemeral.add(ns)
            n = _Namespace(layout.dim, dict(layout.schema), layout.metrics, self._dir(ns), ephemeral, codes)
            n.grow(0)
            try:
                self._make(n)
            except Exception as e:
                self._ephemeral.discard(ns)
                raise StoreError(f"can't create namespace {ns!r} in {self.home}: {e}") from None
            self._ns[ns] = n
        return None

    def _make(self, n: _Namespace) -> None:
        """Its collection, made under a hidden name and renamed into place: a process killed
        half-way leaves no half-made namespace, only a leftover that the next open removes."""
        index = zvec.InvertIndexParam(enable_range_optimization=True)
        fields = [zvec.FieldSchema("s", zvec.DataType.INT64, index_param=index),
                  zvec.FieldSchema("id", zvec.DataType.STRING)]
        fields += [zvec.FieldSchema(f"a_{a}", getattr(zvec.DataType, _FIELD[t]), index_param=index)
                   for a, t in n.schema.items()]
        vectors = [zvec.VectorSchema(m, zvec.DataType.VECTOR_FP32, n.dim,
                                     zvec.FlatIndexParam(metric_type=getattr(zvec.MetricType, _METRICS[m])))
                   for m in n.metrics]
        tmp = n.path if n.ephemeral else n.path.parent / f".new-{uuid.uuid4().hex}"
        tmp.mkdir()
        col = zvec.create_and_open(str(tmp / "col"), zvec.CollectionSchema(name="ns", fields=fields, vectors=vectors))
        datadir.write_json(tmp / "namespace.json", n.layout())
        if n.ephemeral:
            n.col, n.read_only = col, False
            return
        col.close()
        datadir.fsync_dir(tmp)
        os.rename(tmp, n.path)
        datadir.fsync_dir(n.path.parent)
        self._mode(n, read_only=False)  # made to be written

    def _drop_namespace(self, ns):
        with self.lock:
            d = self._dir(ns)
            if not d.is_dir():
                return
            n = self._ns.pop(ns, None)
            if n is not None and n.col is not None:
                with n.gate.exclusive():
                    n.col.close()
                    n.col = None
            datadir.remove(d, ns in self._ephemeral)
            self._ephemeral.discard(ns)

    def _namespaces(self, prefix):
        with self.lock:
            stored = [p.name for p in (self.home / "ns").iterdir() if not p.name.startswith(".")]
            return {ns: self._stored_layout(ns) for ns in {*stored, *self._ephemeral} if ns.startswith(prefix)}

    def _stored_layout(self, ns: str) -> Layout:
        if (n := self._ns.get(ns)) is not None:
            return n.spec
        return datadir.read_layout(self._dir(ns) / "namespace.json", ns, "the zvec store")

    # --- documents ---
    def _upsert(self, ns, layout, ids, v, cols):
        n = self._get(ns)
        with n.gate.exclusive():
            self._mode(n, read_only=False)
            codes = self._codes(n, cols)
            slots = n.reserve(ids)
            new = ~n.cols["live"][slots]
            docs = [zvec.Doc(id=str(s), vectors={m: v[i] for m in n.metrics},
                             fields={"s": s, "id": ids[i], **{f"a_{a}": codes[a][i] for a in n.schema}})
                    for i, s in enumerate(slots.tolist())]
            try:
                for b in range(0, len(docs), BATCH):
                    _check(n.col.upsert(docs[b:b + BATCH]))
            except Exception as e:
                for i in np.asarray(ids, object)[new]:  # the columns do not hold them: forget the new slots
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

    def _fetch(self, ns, layout, ids):
        n = self._get(ns)
        keys = [str(n.slots[i]) for i in ids if i in n.slots]
        if not keys:
            return {}
        with n.gate.exclusive():
            try:
                docs = n.col.fetch(keys, output_fields=[], include_vector=True)
            except Exception as e:
                raise _error(f"read from {ns!r}", e) from None
        if len(docs) != len(set(keys)):
            raise StoreError(f"namespace {ns!r} lost documents its ids list; the store is damaged: "
                             "run `puffergpt load --repair`")
        return {n.cols["id"][int(k)]: np.asarray(d.vector(n.metrics[0]), np.float32) for k, d in docs.items()}

    def _delete(self, ns, layout, filter):
        n = self._get(ns)
        with n.gate.exclusive():
            slots = np.flatnonzero(n.mask(filter))
            if not len(slots):
                return
            self._mode(n, read_only=False)
            try:
                for b in range(0, len(slots), BATCH):
                    _check(n.col.delete([str(s) for s in slots[b:b + BATCH].tolist()]))
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
            run = self._read_only_ask if n.read_only else self._writable_ask
            if self.threads > 1 and n.read_only and len(asks) > 1:  # zvec lets go of the GIL as it searches
                parts = list(self._threads().map(lambda a: run(n, metric, a), asks))
            else:
                parts = [run(n, metric, a) for a in asks]
        qi = np.concatenate([np.full(len(s), a[0], np.int64) for a, (s, _) in zip(asks, parts, strict=True)] or
                            [np.zeros(0, np.int64)])
        slots = np.concatenate([s for s, _ in parts] or [np.zeros(0, np.int64)])
        dist = np.concatenate([d for _, d in parts] or [np.zeros(0)]).astype(np.float64)
        # A split query (every row, no order) has its parts next to each other: hits stay by query.
        return Hits(qi, dist, {a: n.cols[a][slots] for a in include})

    def _threads(self) -> ThreadPoolExecutor:
        with self.lock:
            if self._pool is None or self._pool._max_workers != self.threads:
                if self._pool is not None:
                    self._pool.shutdown(wait=False)
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="zvec")
            return self._pool

    @contextlib.contextmanager
    def _searching(self, n: _Namespace):
        """n's collection, read-only (shared) for a persisted namespace, read-write (exclusive) otherwise."""
        if n.ephemeral:
            with n.gate.exclusive():
                yield
            return
        while True:
            with n.gate.shared():
                if n.read_only:
                    yield
                    return
            with n.gate.exclusive():
                try:
                    self._mode(n, read_only=True)
                except Exception as e:
                    raise _error(f"open {n.path.name!r} to search it", e) from None

    def _asks(self, n: _Namespace, i: int, q) -> list[tuple]:
        """(query number, vector, zvec filter, topk) for each part of query q: none if nothing can
        match; several where an every-row query has more matches than zvec's topk allows."""
        f = self._filter(n, q.filter)
        if f is None:
            return []
        if q.top_k is not None:
            if q.top_k > MAX_TOP_K:
                raise StoreError(f"the zvec store returns at most {MAX_TOP_K:,} hits a query, not top_k={q.top_k:,}")
            return [(i, q.vector, f, q.top_k)] if q.top_k else []
        limit = n.bound(q.filter)
        if limit == 0:
            return []
        if limit <= MAX_TOP_K:
            return [(i, q.vector, f, limit)]
        # More matches than zvec returns at once: runs of slots. (Splitting a 3,072-row product
        # this way across threads was measured 10x slower: zvec scans the range condition.)
        cuts = list(range(0, n.next, MAX_TOP_K)) + [n.next]
        return [(i, q.vector, " and ".join(x for x in (f, f"s >= {lo} and s < {hi}") if x), MAX_TOP_K)
                for lo, hi in zip(cuts, cuts[1:], strict=False)]

    @staticmethod
    def _read_only_ask(n: _Namespace, metric: str, ask) -> tuple[np.ndarray, np.ndarray]:
        _, v, f, k = ask
        try:
            ids, scores = n.col.query_internal_ids(zvec.Query(metric, vector=v), topk=k, filter=f or None,
                                                  return_scores=True)
        except Exception as e:
            raise _error(f"search {n.path.name!r}", e) from None
        keep = ids >= 0
        return n.to_slot[ids[keep]], scores[keep]

    @staticmethod
    def _writable_ask(n: _Namespace, metric: str, ask) -> tuple[np.ndarray, np.ndarray]:
        _, v, f, k = ask
        try:
            docs = n.col.query(zvec.Query(metric, vector=v), topk=k, filter=f or None, output_fields=[])
        except Exception as e:
            raise _error(f"search {n.path.name!r}", e) from None
        return (np.fromiter((int(d.id) for d in docs), np.int64, len(docs)),
                np.fromiter((d.score for d in docs), np.float64, len(docs)))

    @staticmethod
    def _filter(n: _Namespace, f: Filter) -> str | None:
        """f as a zvec filter ("" for none), or None where nothing can match it. Values are
        numbers only (a text value is its code), written so that zvec reads them back exactly."""
        out = []
        for attr, op, value in f:
            t = "id" if attr == "id" else n.schema[attr]
            if t == "str" and op not in ("=", "in"):
                raise StoreError(
                    f"the zvec store can't compare the text attribute {attr!r} with {op!r}: use '=' or 'in'"
                )
            if t == "id" and op not in ("=", "in"):
                raise StoreError(f"the zvec store filters ids by '=' and 'in' only, not {op!r}")
            vals = [value] if op != "in" else list(value)
            if t == "id":
                vals = [n.slots[x] for x in vals if x in n.slots]
            elif t == "str":
                vals = [c for x in vals if (c := n.code_of(attr, x)) is not None]
            elif t == "float" and not all(math.isfinite(x) for x in vals):
                raise StoreError(f"filter {attr!r} {op} {value!r}: the zvec store compares finite numbers only")
            if not vals:
                return None  # a value no document holds
            name = "s" if t == "id" else f"a_{attr}"
            text = [repr(x) for x in vals]  # repr: the shortest decimal that reads back as the same float
            out.append(f"{name} in ({', '.join(text)})" if len(vals) > 1 or op == "in" else f"{name} {op} {text[0]}")
        return " and ".join(out)

    # --- metadata ---
    def _read_meta(self) -> dict:
        return datadir.read_meta(self.home / "meta.json")

    def _put_meta(self, key, value):
        with self.lock:
            self._flush()  # documents before the metadata that vouches for them
            meta = {**self._meta, key: value}
            datadir.write_json(self.home / "meta.json", meta)
            self._meta = meta

    def _get_meta(self, key):
        with self.lock:
            v = self._meta.get(key)
            return json.loads(json.dumps(v)) if v is not None else None

    def _flush(self) -> None:
        for n in list(self._ns.values()):
            if n.dirty and not n.ephemeral:
                with n.gate.exclusive():
                    n.col.flush()
                    n.dirty = False

    # --- what loading checks ---
    def stamp(self, namespaces, known=None):
        """{file: [size, mtime_ns, sha256]} of these namespaces' files (``datadir.fingerprint``;
        zvec's own LOCK files left out)."""
        return datadir.fingerprint([self.home / "ns" / check_name(ns) for ns in namespaces], self.root, known,
                                   skip=("LOCK",))

    def release(self, namespaces) -> None:
        """Write out and close these namespaces' collections (reopened on next use): a reader
        child opens them, and zvec locks a collection to one opener."""
        with self.lock:
            self._flush()
            for ns in namespaces:
                if ns not in self._ephemeral and (n := self._ns.pop(ns, None)) is not None and n.col is not None:
                    with n.gate.exclusive():
                        n.col.close()
                        n.col = None
                        _mark_clean(n.path, True)

    def read_isolated(self, target, payload, namespaces=()):
        """Run ``target`` on this store in a child process, where zvec aborting on damaged files
        can't take this one down. Yields the target's lines; ReaderDied if the child died first."""
        self.release(namespaces)
        yield from datadir.read_in_child(self.root, target, payload, "puffergpt.stores.zvec:_child",
                                         "the zvec store's reader")

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.home.rglob("*") if p.is_file())

    def cli_args(self):
        return f"--backend zvec --data {self.root}"

    def close(self):
        with self.lock:
            if self._lock_file is None:
                return
            if not self.borrowed:
                self._flush()
            for ns in list(self._ephemeral):
                self.drop_namespace(ns)
            for n in self._ns.values():
                if n.col is not None:
                    n.col.close()
                    n.col = None
                    if not n.ephemeral and not self.borrowed:
                        _mark_clean(n.path, True)
            self._ns.clear()
            if self._pool is not None:
                self._pool.shutdown()
            self._lock_file.close()  # releases the lock
            self._lock_file = None


def _check(statuses) -> None:
    bad = [s for s in statuses if not s.ok()]
    if bad:
        raise StoreError(f"{len(bad)} of {len(statuses)} documents refused: {bad[0]}")


def _child() -> None:
    """A reader child (``read_isolated``): the store borrowed from its waiting parent."""
    datadir.child_main(lambda root: ZvecStore(root, borrowed=True, threads=1))


def _mark_clean(d: Path, clean: bool) -> None:
    """The marker that d's collection was closed since it was last opened writable."""
    p = d / CLEAN
    if clean and not p.exists():
        p.touch()
        datadir.fsync_dir(d)
    elif not clean and p.exists():
        p.unlink()
        datadir.fsync_dir(d)


