"""Read replicas of a store's read-only namespaces (the weights), each searched by a worker process.

Qdrant Edge (the embedded store) holds Python's lock while it searches, so a server's searches
run on one core, one after another, however many learners it serves. The weights never change
once loaded, so they can be copied: a replica is a copy of the weights' files (made when the
server starts, under the store's ``tmp/``, which every open of the store wipes) opened by a
store of its own in a worker process. The weights' searches go to idle replicas, a merged
request (``scheduler.Batcher``) split among them by queries; meanwhile the server process goes
on with the arithmetic, the texts' own keys and the HTTP.

Exactness: a copy holds the same bytes and the same database code scores them, so a replica's
hits are the same numbers as the store's own (tests/stores/test_replicas.py checks them equal).

A replica that dies (killed, out of memory) is started again in the background; the part of
a search it held is asked of the store itself, so no learner sees it. A search the store
refuses (a bad filter) is refused with the store's own error.
"""

from __future__ import annotations

import logging
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np

from puffergpt.stores.base import Hits, Query, Store, StoreError, resolve

log = logging.getLogger("puffergpt")
START_S = 120.0  # a replica opens its copy within this long (GPT-2 small's: a few seconds)
STOP_S = 5.0  # a replica told to stop ends within this long, or is killed
MAX_REPLICAS = 64


@dataclass
class _Replica:
    root: Path  # its copy: a data directory of its own
    process: subprocess.Popen
    conn: Connection  # a socket pair's end: pickled messages


class Replicas:
    """``n`` worker processes, each a store (``factory``, "module:function", called with a data
    directory) over a copy of ``namespaces`` in ``roots[i]``. ``search`` is ``Store.search``
    for those namespaces; ``primary`` answers what a dead replica could not."""

    def __init__(self, primary: Store, roots: Sequence[Path], factory: str, namespaces: Sequence[str]):
        if not 1 <= len(roots) <= MAX_REPLICAS:
            raise StoreError(f"replicas: between 1 and {MAX_REPLICAS}, got {len(roots)}")
        self.primary = primary
        self.factory = factory
        self.namespaces = list(namespaces)
        self.restarts = 0  # replicas started again after they died
        self._lost = 0  # replicas that died and could not be started again
        self._cond = threading.Condition()
        self._closed = False
        self._all: list[_Replica] = [self._start(Path(r)) for r in roots]  # all start at once,
        try:
            for r in self._all:  # then each is waited for
                self._ready(r)
        except BaseException:
            self.close()
            raise
        self._idle: list[_Replica] = list(self._all)

    def __len__(self) -> int:
        return len(self._all)

    # --- the workers ---
    def _start(self, root: Path) -> _Replica:
        """A new Python running ``_child``: never a fork of a threaded server, and never the
        caller's main module run again (as multiprocessing's spawn would)."""
        mine, theirs = socket.socketpair()
        code = "from puffergpt.stores.replicas import _child; _child()"
        args = [sys.executable, "-c", code, str(theirs.fileno()), self.factory, str(root), *self.namespaces]
        try:
            p = subprocess.Popen(args, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        return _Replica(root, p, Connection(mine.detach()))

    def _ready(self, r: _Replica) -> None:
        """Wait for a started replica to say it opened its copy; StoreError if it did not."""
        fix = "start the server with --replicas 0 to search the weights in its own process"
        try:
            if not r.conn.poll(START_S):
                raise StoreError(f"a replica of the weights did not open its copy within {START_S:.0f} s: {fix}")
            kind, what = r.conn.recv()
        except (EOFError, OSError):
            raise StoreError(f"a replica of the weights died as it started (exit code {_exit(r)}): "
                             f"{fix}") from None
        if kind != "ready":
            raise StoreError(f"a replica of the weights could not open its copy ({what}): {fix}")

    def _restart(self, dead: _Replica) -> None:
        """A replica died: a new one on the same copy, in the background; idle once ready."""
        dead.conn.close()
        _exit(dead)

        def start() -> None:
            try:
                r = self._start(dead.root)
                self._ready(r)
            except StoreError as e:
                log.warning("a replica of the weights could not be started again: %s", e)
                with self._cond:
                    self._lost += 1  # when none is left, the store itself answers
                    self._cond.notify_all()
                return
            with self._cond:
                if self._closed:
                    _stop(r)
                    return
                self._all = [r if x is dead else x for x in self._all]
                self._idle.append(r)
                self.restarts += 1
                self._cond.notify_all()

        threading.Thread(target=start, name="puffergpt-replica-restart", daemon=True).start()

    # --- searching ---
    def search(self, ns: str, queries: Sequence[Query], metric: str, include: Sequence[str] = ()) -> Hits:
        """``Store.search`` on the replicas: the queries split among the idle ones (at least one,
        waited for), each part's hits as the store's own, query numbers from 0."""
        queries, include = list(queries), tuple(include)
        got = self._take(max(1, len(queries)))
        if not got:  # every replica died and none could be started again
            return self.primary.search(ns, queries, metric, include)
        cuts = np.linspace(0, len(queries), len(got) + 1).round().astype(int).tolist()
        parts = [(ns, queries[a:b], metric, include) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
        sent = [self._send(r, part) for r, part in zip(got, parts, strict=True)]
        answers = [self._receive(r, ok, part) for r, ok, part in zip(got, sent, parts, strict=True)]
        for a in answers:  # every replica answered first: none is left with a reply unread
            if isinstance(a, BaseException):
                raise a
        return answers[0] if len(answers) == 1 else Hits.concat(answers, include, cuts[:-1])

    def _take(self, most: int) -> list[_Replica]:
        with self._cond:
            self._cond.wait_for(lambda: self._idle or self._closed or self._lost == len(self._all))
            if self._closed:
                raise StoreError("the replicas of the weights are closed (the server is stopping)")
            n = min(most, len(self._idle))
            got, self._idle = self._idle[:n], self._idle[n:]
            return got

    def _give(self, r: _Replica) -> None:
        with self._cond:
            self._idle.append(r)
            self._cond.notify_all()

    @staticmethod
    def _send(r: _Replica, part: tuple) -> bool:
        try:
            r.conn.send(part)
            return True
        except (OSError, ValueError):  # its end of the pipe is gone: it died
            return False

    def _receive(self, r: _Replica, sent: bool, part: tuple) -> Hits | BaseException:
        """The replica's hits, or the store's error; a dead replica's part from the store itself."""
        try:
            if not sent:
                raise EOFError
            kind, what = r.conn.recv()
        except (EOFError, OSError):
            if not self._closed:  # closing ends them all: nothing to start again
                log.warning("a replica of the weights died (exit code %s); starting another", _exit(r))
                self._restart(r)
            try:
                return self.primary.search(*part)
            except BaseException as e:
                return e
        self._give(r)
        return what if kind == "hits" else what if isinstance(what, BaseException) else StoreError(str(what))

    def close(self) -> None:
        """Stop every replica and remove its copy."""
        with self._cond:
            self._closed = True
            replicas, self._idle = list(self._all), []
            self._cond.notify_all()
        for r in replicas:
            _stop(r)
        for r in replicas:
            shutil.rmtree(r.root, ignore_errors=True)


def _exit(r: _Replica, wait_s: float = 1.0) -> int | None:
    """A dead replica's exit code (None: still running after ``wait_s``)."""
    try:
        return r.process.wait(wait_s)
    except subprocess.TimeoutExpired:
        return None


def _stop(r: _Replica) -> None:
    try:
        r.conn.send(None)
    except (OSError, ValueError):
        pass
    if _exit(r, STOP_S) is None:
        r.process.kill()
        _exit(r, STOP_S)
    r.conn.close()


def _child() -> None:
    """A replica's process: ``python -c ... FD FACTORY ROOT NAMESPACE...``."""
    fd, factory, root, *namespaces = sys.argv[1:]
    _worker(Connection(int(fd)), factory, root, namespaces)


def _worker(conn: Connection, factory: str, root: str, namespaces: list[str]) -> None:
    """A replica: a store over its copy; a search a message, its hits or its error the reply.
    Ends when told (None) or when the server's end of the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the server, which stops its replicas
    try:
        store = resolve(factory)(Path(root))
        for ns in namespaces:
            store.layout(ns)  # open each namespace now, not at the first search
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    try:
        while (msg := _next(conn)) is not None:
            try:
                conn.send(("hits", store.search(*msg)))
            except Exception as e:  # the store's refusal, for the server to raise
                conn.send(("error", e if isinstance(e, StoreError) else StoreError(f"{type(e).__name__}: {e}")))
    finally:
        store.close()


def _next(conn: Connection):
    try:
        return conn.recv()
    except (EOFError, OSError):  # the server is gone
        return None
