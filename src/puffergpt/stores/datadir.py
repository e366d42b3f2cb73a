"""What the in-process databases of the embedded store (zvec for the weights, Qdrant Edge for a
text's keys) share about the data directory they keep their files in: one process at a time
and one metadata file (``Home``), files replaced whole or not at all, the fingerprint of a
namespace's files (``stamp``), and a reader child that opens the store where a database that
aborts on a damaged file can't take the parent down (``read_isolated``); a namespace as a
directory of its own, opened on first use (``NamespaceDirs``); and the ids and attributes of a
namespace's documents, kept in memory by slot (``Columns``)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from puffergpt.stores.base import Filter, Layout, ReaderDied, Store, StoreError, StoreHeld, check_name, resolve

_DTYPES = {"int": np.int64, "float": np.float64, "str": object}
LOCK_FILE = "puffergpt.lock"
META_FILE = "meta.json"


class Columns:
    """A namespace's documents in memory, by slot (the integer key its database gives each): both
    databases key documents by integer, and neither returns attributes as arrays. Mixed into a
    store's namespace dataclass, which holds ``schema``, ``slots`` (string id -> slot), ``cols``
    ("id", "live" and each attribute, by slot), ``counts`` (int or str attribute -> value -> live
    documents: a search's bound) and ``next`` (the next free slot)."""

    def reserve(self, ids) -> np.ndarray:
        """Slots for these ids: their own if they exist, new ones otherwise. (n,) int64"""
        out = np.empty(len(ids), np.int64)
        for i, s in enumerate(ids):
            slot = self.slots.get(s)
            if slot is None:
                slot = self.slots[s] = self.next
                self.next += 1
            out[i] = slot
        self.grow(self.next)
        return out

    def grow(self, n: int) -> None:
        if not self.cols:
            self.cols = {a: np.zeros(0, _DTYPES[t]) for a, t in {"id": "str", **self.schema}.items()}
            self.cols["live"] = np.zeros(0, bool)
            self.counts = {a: Counter() for a, t in self.schema.items() if t in ("int", "str")}
        cap = len(self.cols["id"])
        if n > cap:
            for a, c in self.cols.items():
                new = np.zeros(max(n, 2 * cap, 1024), c.dtype)  # doubling: appends stay cheap
                new[:cap] = c
                self.cols[a] = new

    def record(self, slots: np.ndarray, ids, attrs: dict) -> None:
        """Write ids and attributes into the columns (a slot may have held a document)."""
        old = self.cols["live"][slots]
        for a in self.counts:
            self.counts[a].subtract(self.cols[a][slots[old]].tolist())
            self.counts[a].update(attrs[a])
        self.cols["id"][slots] = ids
        for a in self.schema:
            self.cols[a][slots] = attrs[a]
        self.cols["live"][slots] = True

    def forget(self, slots: np.ndarray) -> None:
        for a in self.counts:
            self.counts[a].subtract(self.cols[a][slots].tolist())
        for s in self.cols["id"][slots].tolist():
            self.slots.pop(s, None)
        self.cols["live"][slots] = False

    def bound(self, f: Filter) -> int:
        """An upper bound on the documents matching f, from the value counts (a search's limit)."""
        n = len(self.slots)
        for a, op, v in f:
            if a in self.counts and op == "=":
                n = min(n, self.counts[a][v])
            elif a in self.counts and op == "in":
                n = min(n, sum(self.counts[a][x] for x in set(v)))
            elif a == "id":
                n = min(n, 1 if op == "=" else len(set(v)))
        return n


class NamespaceDirs:
    """A persisted namespace as a directory of its own under ``kept`` (its layout in namespace.json),
    opened on first use and kept open. Mixed into each in-process database's store, which holds
    ``kept``, ``lock`` (the catalog), ``_ns`` (namespace -> its open namespace) and ``what`` (its
    name in messages), and opens a namespace's files with ``_open_files(ns, d, layout)``."""

    def _dir(self, ns: str) -> Path:
        return self.kept / check_name(ns)

    def _get(self, ns: str):
        n = self._ns.get(ns)
        if n is None:  # checked again under the lock: two threads may ask at once
            with self.lock:
                n = self._ns.get(ns) or self._open(ns)
        return n

    def _open(self, ns: str):
        d = self._dir(ns)
        try:
            layout = json.loads((d / "namespace.json").read_text())
        except FileNotFoundError:
            raise StoreError(f"namespace {ns!r} does not exist") from None
        except ValueError as e:
            raise self._damaged(ns, d, e) from None
        self._ns[ns] = n = self._open_files(ns, d, layout)
        return n

    def _damaged(self, ns: str, d: Path, e: Exception) -> StoreError:
        return StoreError(f"{self.what} can't read namespace {ns!r} ({d}): {e}. "
                          f"Drop it and load again (`puffergpt load --repair`), or restore the data directory")

    def _layout(self, ns):
        if ns not in self._ns and not (self._dir(ns) / "namespace.json").exists():
            return None
        return self._get(ns).spec

    def _namespaces(self, prefix, also=()):
        """{namespace: layout} of the kept namespaces (and ``also``'s) whose names start with prefix."""
        with self.lock:
            kept = [p.name for p in self.kept.iterdir() if not p.name.startswith(".")] if self.kept.is_dir() else []
            return {ns: self._stored_layout(ns) for ns in {*kept, *also} if ns.startswith(prefix)}

    def _stored_layout(self, ns: str) -> Layout:
        """The layout from memory, or from namespace.json (listing opens no database file)."""
        if (n := self._ns.get(ns)) is not None:
            return n.spec
        return read_layout(self._dir(ns) / "namespace.json", ns, self.what)


class Home:
    """A data directory, held by one process: its lock file, and the metadata file (put_meta,
    get_meta) of every database that keeps files in it. ``borrowed``: opened by a reader child
    (``read_isolated``) while its parent holds the lock and waits: no lock of its own, and the
    parent's leftovers are kept."""

    def __init__(self, root: Path, borrowed: bool = False):
        self.root, self.borrowed = Path(root), borrowed
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_file = open(os.devnull) if borrowed else hold(self.root / LOCK_FILE, self.root)
        self.lock = threading.RLock()
        try:
            self._meta = read_meta(self.root / META_FILE)
        except StoreError:
            self.close()
            raise

    def put_meta(self, key: str, value) -> None:
        with self.lock:
            meta = {**self._meta, key: value}
            write_json(self.root / META_FILE, meta)
            self._meta = meta

    def get_meta(self, key: str):
        with self.lock:
            v = self._meta.get(key)
            return json.loads(json.dumps(v)) if v is not None else None  # a copy, as a database returns

    @property
    def closed(self) -> bool:
        return self._lock_file is None

    def close(self) -> None:
        """Let go of the directory (the lock goes with the file)."""
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


def hold(path: Path, data_dir: Path):
    """The data directory's lock file, held (open) until it is closed: one process at a time;
    it holds the holder's pid, for the error another process gets."""
    f = open(path, "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise StoreHeld(f"the data directory {data_dir} is in use by another puffergpt process (pid {holder}): "
                        f"stop that one first, or give this one another --data DIR", data_dir, holder) from None
    f.truncate(0)
    f.write(f"{os.getpid()}\n")
    f.flush()
    return f


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(p: Path, value) -> None:
    """Whole or not at all: written beside, synced, renamed over."""
    tmp = p.with_suffix(f".{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        json.dump(value, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    fsync_dir(p.parent)


def read_meta(p: Path) -> dict:
    """The metadata file's contents ({} before the first put)."""
    try:
        return json.loads(p.read_text()) if p.exists() else {}
    except (OSError, ValueError) as e:
        raise StoreError(f"can't read {p}: {e}. Move it away and load the models again (`puffergpt load`)") from None


def read_layout(p: Path, ns: str, what: str) -> Layout:
    """A namespace's layout from its namespace.json (listing opens no database file)."""
    try:
        d = json.loads(p.read_text())
        return Layout(d["dim"], d["schema"], tuple(d["metrics"]), d.get("partition"))
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise StoreError(f"{what} can't read {p}: {e}. Drop namespace {ns!r} and load again "
                         "(`puffergpt load --repair`), or restore the data directory") from None


def remove(d: Path, ephemeral: bool) -> None:
    """A namespace's directory gone: a kept one is first renamed aside, at once, so a crash
    mid-delete leaves no half namespace (the store removes ``.drop-*`` leftovers at open)."""
    gone = d if ephemeral else d.parent / f".drop-{uuid.uuid4().hex}"
    if gone != d:
        os.rename(d, gone)
    shutil.rmtree(gone, ignore_errors=True)


def fingerprint(dirs: Iterable[Path], root: Path, digest: Callable[[Path], str] | None = None,
                skip: tuple[str, ...] = ()) -> dict[str, list]:
    """{file: [size, digest]} of every file under ``dirs``, named relative to root: read in full,
    whatever their mtimes say (bit rot leaves the mtime alone), on a thread per core (hashlib lets
    go of Python's lock). ``digest``: sha256 of the file unless the database's own is given (zvec's
    leaves out what zvec rewrites at every close). Files named in ``skip`` (a database's own lock)
    are left out."""
    files = [p for d in dirs for p in (sorted(d.rglob("*")) if d.is_dir() else [])
             if p.is_file() and p.name not in skip]
    files.sort(key=lambda p: -p.stat().st_size)  # the big ones first: the threads end together
    with ThreadPoolExecutor(os.cpu_count() or 1, thread_name_prefix="puffergpt-stamp") as pool:
        sums = list(pool.map(digest or sha256, files))
    return {str(p.relative_to(root)): [p.stat().st_size, h] for p, h in sorted(zip(files, sums, strict=True))}


def sha256(p: Path) -> str:
    with open(p, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_in_child(root: Path, target: str, payload, child: str, what: str) -> Iterator[dict]:
    """Run ``target(store, payload)`` in a child process (``child``: "module:function", the
    store's own ``child_main``), yielding its results as they come; ReaderDied (``what``
    died, how, and its last words) if the child died before the end."""
    import puffergpt

    env = {**os.environ, "RUST_BACKTRACE": "0",
           "PYTHONPATH": os.pathsep.join([str(Path(puffergpt.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    module, fn = child.split(":")
    req = json.dumps({"root": str(root), "target": target, "payload": payload})
    with subprocess.Popen([sys.executable, "-c", f"from {module} import {fn}; {fn}()"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as p:
        err = []
        reader = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)  # a full pipe would stall it
        reader.start()
        p.stdin.write(req.encode())
        p.stdin.close()
        done = False
        for line in p.stdout:
            msg = json.loads(line)
            if msg == {"end": True}:
                done = True
                break
            yield msg
        rc = p.wait()
        reader.join(5)
    if not done or rc != 0:
        text = [x.decode(errors="replace").strip() for x in err if x.strip()]
        last = next((t for t in reversed(text) if not t.startswith(("note:", "stack backtrace"))), "")
        how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        raise ReaderDied(f"{what} died ({how}{': ' + last if last else ''})")


def child_main(open_store: Callable[[Path], Store]) -> None:
    """A reader child (``read_in_child``): the request on stdin, one JSON line a result on
    stdout, then {"end": true}. Only a complete run ends with that line."""
    req = json.loads(sys.stdin.read())
    store = open_store(Path(req["root"]))
    try:
        for msg in resolve(req["target"])(store, req["payload"]):
            sys.stdout.write(json.dumps(msg) + "\n")
            sys.stdout.flush()
    finally:
        store.close()
    sys.stdout.write(json.dumps({"end": True}) + "\n")
    sys.stdout.flush()
