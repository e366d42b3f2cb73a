"""The embedded backend, the default: two in-process databases under one data directory.

- **the weights** (persisted namespaces) on zvec (``zvec.py``): one read-only Flat collection
  per matrix, searched with ``query_internal_ids``, which returns numpy arrays and lets go of
  Python's lock, so a batch of queries runs on every core (benchmarks/RESULTS.md);
- **a text's keys** (ephemeral namespaces, written every token) on Qdrant Edge
  (``qdrant_edge.py``), whose writes and small searches are the faster (12 ms against zvec's
  66 ms for 12 heads x 511 keys).

On a CPU zvec can't run on (an x86-64 without AVX2, FMA or BMI1: its wheel dies with SIGILL)
everything goes to Qdrant Edge, and the store says so in one line (a log warning: stderr).
``fallback=True`` does the same anywhere (the tests run both).

The data directory (one process at a time; ``datadir.Home``):

    format.json       {"format": FORMAT, "weights": "zvec" | "qdrant-edge"}: how it was made
    puffergpt.lock    held by the process that has it open
    meta.json         put_meta / get_meta (manifests, stamps), replaced atomically
    zvec/             the weights on zvec (zvec.py)
    zvec-index/       approximate (HNSW) indexes over the token vectors, where built (zvec.py)
    qdrant/           the weights on Qdrant Edge, where zvec can't run (qdrant_edge.py)
    tmp/              a text's keys, and a server's reserve of free space (search/space.py), wiped at open

A data directory made by an earlier puffergpt (``edge/``, or the zvec study's ``zvec/`` without
a format.json) is refused with the commands that rebuild it; one made in one mode and opened in
the other says so.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
from pathlib import Path

from puffergpt.stores import datadir, qdrant_edge
from puffergpt.stores import zvec as zv
from puffergpt.stores.base import NoIndex, Store, StoreError, disk_space

log = logging.getLogger("puffergpt")
FORMAT = 2  # 1: an earlier release's (weights on Qdrant Edge under edge/, no format.json)
FORMAT_FILE = "format.json"
ZVEC, QDRANT = "zvec", "qdrant-edge"  # where the weights are
OLD_DB_FILE = "puffergpt.duckdb"
OLD = ("edge", "zvec", "meta.json")  # what an earlier release kept in the data directory


class EmbeddedStore(Store):
    name = "embedded"
    metrics = ("inner_product", "cosine_distance", "euclidean_squared")
    max_queries = 16384  # 12 heads x 1,024 positions: a whole prefill's attention in one request
    thread_safe = True  # each database holds its own locks
    keeps_spares = qdrant_edge.SPARE  # a text's shard, emptied, for the next text

    def __init__(self, data_dir: Path, borrowed: bool = False, fallback: bool = False,
                 threads: int | None = None):
        """``borrowed``: opened by a reader child (``read_isolated``) while its parent holds the
        directory's lock and waits. ``fallback``: everything on Qdrant Edge, as where zvec can't
        run. ``threads``: a batch of queries to the weights runs on this many (default: a core each)."""
        if data_dir is None:
            raise StoreError("the embedded store needs a data directory: give --data DIR")
        self.root = self.path = Path(data_dir)  # path: what the CLI names and measures
        weights = _weights(self.root, fallback, borrowed)
        try:
            self.home = datadir.Home(self.root, borrowed)
        except OSError as e:
            raise _unopenable(data_dir, e) from None
        try:
            if not (self.root / FORMAT_FILE).exists():
                datadir.write_json(self.root / FORMAT_FILE, {"format": FORMAT, "weights": weights})
            self.fallback = weights == QDRANT
            self.texts = qdrant_edge.QdrantEdgeStore(self.home)
            self.weights = self.texts if self.fallback else zv.ZvecStore(self.home, threads)
        except BaseException as e:
            self.home.close()
            if isinstance(e, OSError):
                raise _unopenable(data_dir, e) from None
            raise
        self.max_top_k = self.weights.max_top_k

    def _of(self, ns: str) -> Store:
        """The database that holds ns: a text's keys are Qdrant Edge's."""
        return self.texts if self.texts.ephemeral(ns) else self.weights

    # --- what the base calls: each goes to the database that holds the namespace ---
    def _namespaces(self, prefix):
        if self.fallback:
            return self.texts._namespaces(prefix)
        return {**self.weights._namespaces(prefix), **self.texts._namespaces(prefix)}

    def _layout(self, ns):
        return self._of(ns)._layout(ns)

    def _create_namespace(self, ns, layout, ephemeral):
        if (old := self._layout(ns)) is not None:
            return old
        with disk_space(self.root):
            return (self.texts if ephemeral else self.weights)._create_namespace(ns, layout, ephemeral)

    def _drop_namespace(self, ns):
        self._of(ns)._drop_namespace(ns)

    def _upsert(self, ns, layout, ids, vectors, attrs):
        with disk_space(self.root):
            self._of(ns)._upsert(ns, layout, ids, vectors, attrs)

    def _search(self, ns, layout, queries, metric, include):
        return self._of(ns)._search(ns, layout, queries, metric, include)

    def _fetch(self, ns, layout, ids):
        return self._of(ns)._fetch(ns, layout, ids)

    def _delete(self, ns, layout, filter):
        self._of(ns)._delete(ns, layout, filter)

    def _count(self, ns, layout, filter):
        return self._of(ns)._count(ns, layout, filter)

    # --- the approximate index over the token vectors: zvec's HNSW (none where the weights are on Qdrant Edge) ---
    def _build_index(self, ns, layout, on, metric, params, progress):
        return self._indexer()._build_index(ns, layout, on, metric, params, progress)

    def _has_index(self, ns, on, metric):
        return not self.fallback and self.weights._has_index(ns, on, metric)

    def _index_stamp(self, ns, on, metric):
        return None if self.fallback else self.weights._index_stamp(ns, on, metric)

    def _search_approximate(self, ns, layout, on, queries, metric, include, ef):
        return self._indexer()._search_approximate(ns, layout, on, queries, metric, include, ef)

    def _indexer(self) -> zv.ZvecStore:
        if self.fallback:
            raise NoIndex("this data directory keeps the weights on Qdrant Edge (zvec can't run on this CPU, or it "
                          "was made so), where puffergpt builds no approximate index: use --output-search exact")
        return self.weights

    def _put_meta(self, key, value):
        with disk_space(self.root):
            self.weights._put_meta(key, value)  # the weights written out first

    def _get_meta(self, key):
        return self.home.get_meta(key)

    # --- what loading checks, and the reader child ---
    def stamp(self, namespaces):
        """A digest of every file of these namespaces (the weights), read in full at every start."""
        return self.weights.stamp(namespaces)

    def release(self, namespaces) -> None:
        self.weights.release(namespaces)

    def read_isolated(self, target, payload, namespaces=()):
        """Run ``target`` on this store in a child process: Qdrant aborts the process on some
        damaged files (an allocation of 100 GB from a flipped id map), and zvec may, which no try
        can catch. Yields the target's lines as they come; ReaderDied if the child died first."""
        self.release(namespaces)
        yield from datadir.read_in_child(self.root, target, payload, "puffergpt.stores.embedded:_child",
                                         "the embedded store's reader")

    def free_bytes(self) -> int:
        return shutil.disk_usage(self.root).free

    def reserve_path(self) -> Path:
        """Under tmp/, which the next process to hold the directory wipes (a killed server's too)."""
        return self.texts.tmp / f".reserve-{os.getpid()}"

    def disk_bytes(self) -> int:
        """Bytes of this store's files (weights, keys, metadata), not those of others sharing
        --data (pgvector's local server, the notebook)."""
        own = [self.root / d for d in (zv.KEPT, zv.INDEXES, qdrant_edge.KEPT, "tmp", datadir.META_FILE, FORMAT_FILE)]
        return sum(p.stat().st_size for d in own if d.exists()
                   for p in ([d] if d.is_file() else d.rglob("*")) if p.is_file())

    def worker_options(self):
        """Borrowed: a worker opens the data directory this process holds (its lock, its leftovers
        kept), reads the weights where they lie and keeps its texts' keys apart. Not where the
        weights are on Qdrant Edge, which one process opens at a time."""
        if self.fallback:
            raise StoreError("the weights of this data directory are on Qdrant Edge (zvec can't run on this CPU, "
                             "or the directory was made so), which one process opens at a time: serve with "
                             "--workers 1, or several servers over one database (docs/deploy.md)")
        return {"borrowed": True}

    def cli_args(self):
        return f"--backend embedded --data {self.root}"

    def close(self):
        if self.home.closed:
            return
        self.texts.close()
        if self.weights is not self.texts:
            self.weights.close()
        self.home.close()  # releases the lock


def _unopenable(data_dir, e: OSError) -> StoreError:
    return StoreError(f"can't open the data directory {data_dir}: {e}. Choose another with --data DIR.")


def _weights(root: Path, fallback: bool, borrowed: bool) -> str:
    """Where this data directory keeps the weights (zvec, or Qdrant Edge where zvec can't run or
    ``fallback`` says so), or a StoreError naming the commands that make it readable."""
    made = _made_with(root)
    lacks = zv.cpu_lacks()
    if made == ZVEC and (lacks or fallback):
        why = f"this CPU lacks {', '.join(lacks).upper()}" if lacks else "it was opened with everything on Qdrant Edge"
        raise StoreError(f"{root} keeps the weights in zvec, which needs a CPU with {', '.join(zv.NEEDS).upper()}, "
                         f"and {why}. Load the models into another data directory, where they go to Qdrant Edge: "
                         f"`puffergpt load --model MODEL --data NEWDIR`")
    if borrowed:
        return made or QDRANT
    if lacks:
        log.warning("puffergpt: this CPU lacks %s, which zvec needs: the embedded store keeps the weights on "
                    "Qdrant Edge, whose searches are slower", ", ".join(lacks).upper())
        return QDRANT
    if made == QDRANT and not fallback:
        log.warning("puffergpt: %s keeps the weights on Qdrant Edge (made where zvec could not run), whose searches "
                    "are slower; to move them to zvec: %s", root,
                    _move_aside(root, [FORMAT_FILE, qdrant_edge.KEPT, datadir.META_FILE]))
    return made or (QDRANT if fallback else ZVEC)


def _made_with(root: Path) -> str | None:
    """What format.json says holds the weights; None for a new data directory; a StoreError for
    one of another format or an earlier release's."""
    if (root / OLD_DB_FILE).exists():
        old = root / OLD_DB_FILE
        raise StoreError(
            f"{root} holds a store of the old DuckDB format ({old}), which this puffergpt no longer reads. "
            f"Move it away (`mv {old} {old}.old`) and rebuild the store with "
            f"`puffergpt load --model MODEL --data {root}` for each model it held (e.g. --model gpt2)")
    p = root / FORMAT_FILE
    if not p.exists():
        found = [x for x in OLD if (root / x).exists()]
        if found:
            raise StoreError(f"{root} holds a store made by an earlier puffergpt ({', '.join(found)}), which this "
                             f"one no longer reads: the weights are now kept in zvec, a collection per matrix. "
                             f"Move it aside and load each model again (e.g. --model gpt2): {_move_aside(root, found)}")
        return None
    try:
        info = json.loads(p.read_text())
        found, weights = info["format"], info["weights"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StoreError(f"can't read {p}: {e}. Move the store aside and load again: "
                         f"{_move_aside(root, [FORMAT_FILE, *OLD, qdrant_edge.KEPT])}") from None
    if found != FORMAT or weights not in (ZVEC, QDRANT):
        raise StoreError(f"{root} holds a store of format {found} ({weights}); this puffergpt reads format {FORMAT}. "
                         f"Move it aside and load again: {_move_aside(root, [FORMAT_FILE, *OLD, qdrant_edge.KEPT])}")
    return weights


def _move_aside(root: Path, parts: list[str]) -> str:
    """The commands that move a store's files aside (the notebook and the rest stay) and load again."""
    old = root / "old-store"
    moved = " ".join(shlex.quote(str(root / x)) for x in parts if (root / x).exists())
    return (f"`mkdir -p {shlex.quote(str(old))} && mv {moved} {shlex.quote(str(old))}/`, "
            f"then `puffergpt load --model MODEL --data {shlex.quote(str(root))}`")


def _child() -> None:
    """A reader child (``read_isolated``): the store borrowed from its waiting parent."""
    datadir.child_main(lambda root: EmbeddedStore(root, borrowed=True))
