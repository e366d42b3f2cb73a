"""Room on the disk before a store writes, so that a full disk is an error naming it, never a
signal: the embedded store writes a text's keys through memory maps (Qdrant Edge), and a page
of a map that finds no room on the disk kills the process with SIGBUS, which nothing can catch.

So what is about to be written is checked against the disk's free space first (``check``):
a load (``load.load``: its documents), the server's spare text namespaces (``Engine.ready_texts``)
and each text opened (``Engine.open``: its keys at a full context). What the estimates leave
out is kept spare (MARGIN). A store whose disk is not on this machine (a database server) has
no free space to ask (``Store.free_bytes``: None), and nothing is checked.

The disk may still fill while texts write (another program, a log): so a server holds a
``Reserve``, RESERVE bytes allocated in a file of the store's (``Store.reserve_path``), and
before every write of a text's keys looks at the free space (``guard``, one statvfs): below
LOW, the reserve is let go, so the texts in flight finish in its room, while every new text is
refused (NoSpace: a 507) until the disk has room for the reserve again, when it is taken back.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

from puffergpt.model.checkpoints import GPT2Config
from puffergpt.stores.base import NoSpace, Store

log = logging.getLogger("puffergpt")

MB = 1 << 20
MARGIN = 64 * MB  # kept free beside every estimate: metadata, a store's own files, the notebook
NAMESPACE_BYTES = 8 * MB  # a text's namespace on the embedded store, empty (16 spares: ~120 MB on tmpfs)
OVERHEAD = 3  # bytes a store keeps per byte of vector (ids, attributes, its segments): ~2.1-2.6 measured
RESERVE = 64 * MB  # a server's room for the texts in flight, held until the disk runs low (``Reserve``)
LOW = 32 * MB  # free below this at a key write: the reserve is let go (Qdrant Edge grows its maps by MBs)


def check(store: Store, need: int, what: str) -> None:
    """NoSpace naming the disk, what needs the room and how much, where the store's disk has
    less than ``need`` and MARGIN free."""
    free = store.free_bytes()
    if free is not None and free < need + MARGIN:
        raise NoSpace(f"{what} needs about {mb(need + MARGIN)} MB on the disk holding {store.path}, which has "
                      f"{mb(free)} MB free: free some space there, or give --data a larger disk")


def load_bytes(rows_and_dims: list[tuple[int, int]]) -> int:
    """About what a load's documents take: (rows, dim) a matrix, float32 each, OVERHEAD times."""
    return OVERHEAD * sum(rows * dim * 4 for rows, dim in rows_and_dims)


def text_bytes(config: GPT2Config) -> int:
    """About what one text's keys take at a full context: an empty namespace, then a key and a
    value a layer and a position, n_embd floats each, OVERHEAD times."""
    return NAMESPACE_BYTES + OVERHEAD * config.n_layer * 2 * config.n_ctx * config.n_embd * 4


def mb(n: int) -> int:
    return -(-n // MB)


class Reserve:
    """RESERVE bytes of the disk held in a file (``posix_fallocate``), let go when the disk runs
    low so that the texts in flight can finish, taken back when there is room again."""

    def __init__(self, store: Store, nbytes: int = RESERVE, low: int = LOW):
        self.store, self.nbytes, self.low = store, nbytes, low
        self.dir: Path = store.reserve_path()
        self.held = False
        self._lock = threading.Lock()
        gone(self.dir.parent)
        if not self.take():
            raise NoSpace(f"the server's reserve for the texts in flight needs {mb(nbytes + MARGIN)} MB on the disk "
                          f"holding {store.path}, which has {mb(store.free_bytes())} MB free: free some space there, "
                          "or give --data a larger disk")

    @property
    def file(self) -> Path:
        return self.dir / "reserve"

    def take(self) -> bool:
        """Hold the reserve where the disk has room for it and MARGIN; -> whether it is held."""
        with self._lock:
            if self.held:
                return True
            if self.store.free_bytes() < self.nbytes + MARGIN:
                return False
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                with open(self.file, "wb") as f:
                    os.posix_fallocate(f.fileno(), 0, self.nbytes)  # blocks of its own: no sparse file
            except OSError as e:
                shutil.rmtree(self.dir, ignore_errors=True)
                log.warning("could not hold a reserve of %d MB on the disk holding %s: %s", mb(self.nbytes),
                            self.store.path, e)
                return False
            self.held = True
            return True

    def guard(self) -> None:
        """Before a text's keys are written: the reserve let go where the disk is nearly full."""
        if self.held and self.store.free_bytes() < self.low:
            with self._lock:
                if not self.held:
                    return
                shutil.rmtree(self.dir, ignore_errors=True)
                self.held = False
            log.warning("the disk holding %s is nearly full: its reserve of %d MB is let go so the texts in flight "
                        "finish; new texts are refused (507) until there is room", self.store.path, mb(self.nbytes))

    def check_text(self) -> None:
        """Before a text opens: NoSpace while the reserve is let go and can't be taken back."""
        if not self.held and not self.take():
            raise NoSpace(f"the disk holding {self.store.path} is nearly full ({mb(self.store.free_bytes())} MB free): "
                          f"its reserve went to the texts in flight, and new texts wait until it has "
                          f"{mb(self.nbytes + MARGIN)} MB free again: free some space there")

    def close(self) -> None:
        with self._lock:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.held = False


def gone(where: Path) -> None:
    """The reserves of processes that died (a worker killed and started again) removed."""
    for d in where.glob(".reserve-*"):
        try:
            os.kill(int(d.name.rsplit("-", 1)[1]), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError):
            pass
