"""Serving on every core: ``serve --workers N`` runs N worker processes, each a whole server
(``create_app``) over the same store, behind one front (``front.py``) that keeps each text on
the worker that holds it.

One process can't use more than about one core: a text's step is mostly Python, and Python's
lock lets one thread run it at a time (benchmarks/RESULTS.md, "Every core"). Texts in
processes of their own run side by side. The weights are read where they lie: the embedded
store's zvec collections are opened read-only by every worker (the pages are shared, not
copied), a database server is a client away.

The parent opens the store first (loading the model if needed, checking it against its
manifest) and holds it while the workers run; each worker opens the same store beside it
(``Store.worker_options``: the embedded store borrowed, pgvector's local server by its
address) and does not check it again. A worker's settings reach it on stdin as JSON, never
on its command line, where a password in a DSN or an API key would show. A worker watches
its parent and ends when the parent is gone; the pool starts a worker that died again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, make_dataclass
from pathlib import Path

from puffergpt import settings
from puffergpt.texts.text import log

MAX_WORKERS = 64
START_S = 180.0  # a worker has this long to open the store and listen
WATCH_S = 0.5  # how often the pool looks for a worker that died, and a worker for its parent


def count(value: str | int) -> int:
    """--workers: a count of worker processes, or "auto": one a core and one more, to use the
    time a worker waits (its key writes, its stream's hand-offs; on 2 cores, 8 learners: 2
    workers 1.4x one after another, 3 workers 1.6-1.8x, 4 1.65x; benchmarks/RESULTS.md)."""
    if value == "auto":
        return min((os.cpu_count() or 1) + 1, MAX_WORKERS)
    n = value
    try:
        n = int(n)
    except (TypeError, ValueError):
        raise ValueError(f"--workers takes a number of processes (1..{MAX_WORKERS}) or 'auto', got {value!r}") from None
    if not 1 <= n <= MAX_WORKERS:
        raise ValueError(f"--workers takes 1..{MAX_WORKERS} processes (or 'auto'), got {n}")
    return n


def share(total: int, n: int) -> int:
    """One worker's part of a server's bound (texts open, texts generating): the bound shared
    out, rounded up, so that together the workers hold at least the bound."""
    return max(1, -(-total // n))


# What a worker needs to serve, sent on its stdin as one JSON line: what the server serves, where,
# and the settings that go to "worker" (puffergpt.settings: named, typed and defaulted there).
WorkerSpec = make_dataclass("WorkerSpec", [
    ("model", str),
    ("data_dir", str | None),
    ("store_options", dict),  # what open_store takes beside data_dir (the backend's settings, Store.worker_options)
    ("config", dict),  # ServerConfig's fields
    ("notebook", str | None),
    *settings.fields("worker"),
], frozen=True, namespace={"__module__": __name__})


class Worker:
    """One worker process: its port once it listens, its output passed on."""

    def __init__(self, spec: WorkerSpec, index: int):
        self.index = index
        code = "from puffergpt.server.processes.workers import worker_main; worker_main()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
)
        self.port: int | None = None
        self._listening = threading.Event()
        threading.Thread(target=self._read, name=f"puffergpt-worker-{index}", daemon=True).start()
        self.proc.stdin.write((json.dumps(asdict(spec)) + "\n").encode())
        self.proc.stdin.close()

    def _read(self) -> None:
        """The first line a worker writes is its port; what follows is passed on to our stdout."""
        for line in self.proc.stdout:
            if self.port is None:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    self.port = int(json.loads(line)["port"])
                    self._listening.set()
                    continue
            sys.stdout.buffer.write(line)
            sys.stdout.flush()

    def wait_listening(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self._listening.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return False
        return True

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None and self.port is not None


class WorkersDidNotStart(RuntimeError):
    pass


class Pool:
    """N workers; one that dies is started again (a new ``generation`` of its slot, so the
    front knows its texts are gone). ``url(i)`` is where worker i listens, None while it starts."""

    def __init__(self, spec: WorkerSpec, n: int, start_s: float = START_S):
        self.spec, self.n, self.start_s = spec, n, start_s
        self.workers: list[Worker | None] = [None] * n
        self.generation = [0] * n
        self._stopping = threading.Event()
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start every worker and wait until each listens; WorkersDidNotStart (and none left
        running) if one can't."""
        self.workers = [Worker(self.spec, i) for i in range(self.n)]
        bad = [w.index for w in self.workers if not w.wait_listening(self.start_s)]
        if bad:
            self.stop()
            raise WorkersDidNotStart(f"worker {bad[0]} of {self.n} did not start within {self.start_s:.0f} s "
                                     f"(its error is above); `puffergpt serve --workers 1` serves in one process")
        threading.Thread(target=self._watch, name="puffergpt-workers", daemon=True).start()

    def url(self, i: int) -> str | None:
        w = self.workers[i]
        return f"http://127.0.0.1:{w.port}" if w is not None and w.alive else None

    def alive(self) -> list[int]:
        return [i for i in range(self.n) if self.url(i) is not None]

    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_S):
            for i, w in enumerate(self.workers):
                if w is not None and w.proc.poll() is not None and not self._stopping.is_set():
                    self._restart(i, w.proc.returncode)

    def _restart(self, i: int, code: int) -> None:
        how = f"signal {-code}" if code < 0 else f"exit status {code}"
        log.warning("worker %d died (%s): starting it again; the texts it held reopen where asked next", i, how)
        with self._lock:
            self.generation[i] += 1
            w = self.workers[i] = Worker(self.spec, i)
        if not w.wait_listening(self.start_s) and not self._stopping.is_set():
            log.warning("worker %d did not start again; it is tried again in %.1f s", i, WATCH_S)

    def kill(self, i: int) -> None:
        """End worker i at once (SIGKILL: a stopped process too); ``_watch`` starts it again."""
        w = self.workers[i]
        if w is not None and w.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                w.proc.kill()

    def terminate(self) -> None:
        """Ask every worker to end (SIGTERM: each ends its open requests with their final word)."""
        self._stopping.set()
        for w in self.workers:
            if w is not None and w.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signal.SIGTERM)
                    w.proc.send_signal(signal.SIGCONT)  # a stopped one, to hear it

    def stop(self, wait_s: float = 15.0) -> None:
        """End every worker: SIGTERM, then SIGKILL after ``wait_s``."""
        self.terminate()
        deadline = time.monotonic() + wait_s
        for w in self.workers:
            if w is None:
                continue
            try:
                w.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not end within %.0f s: killed", w.index, wait_s)
                w.proc.kill()
                w.proc.wait()


@contextlib.contextmanager
def running(spec: WorkerSpec, n: int) -> Iterator[Pool]:
    pool = Pool(spec, n)
    pool.start()
    try:
        yield pool
    finally:
        pool.stop()


# --- the worker's side ---------------------------------------------------------------------

def _watch_parent(parent: int) -> None:
    """End this worker (as SIGTERM does) when its parent is gone: a worker never outlives serve."""
    def watch():
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="puffergpt-parent", daemon=True).start()


def worker_config(fields: dict):
    """The ServerConfig a worker serves with, from its fields as JSON carried them (lists
    where the config holds tuples): the parent's, keys and hosts included."""
    from puffergpt.server.state import ServerConfig

    return ServerConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def worker_main() -> None:
    """A worker: its WorkerSpec on stdin; the store opened beside the parent's, the app served
    on a free loopback port, written as {"port": P} on stdout; until SIGTERM or the parent goes."""
    from puffergpt.model import checkpoints
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.session import Run
    from puffergpt.search import manifest
    from puffergpt.search.scheduler import Scheduler
    from puffergpt.server.app import create_app, run, server
    from puffergpt.stores import open_store

    spec = WorkerSpec(**json.loads(sys.stdin.readline()))
    _watch_parent(os.getppid())
    config = worker_config(spec.config)
    store = open_store(spec.backend, Path(spec.data_dir) if spec.data_dir else None, **spec.store_options)
    try:
        engine = manifest.open_engine(store, spec.model, scheduler=Scheduler(spec.max_running),  # checked by the parent
                                     text_ttl_s=spec.text_ttl_s, output_search=spec.output_search)
        notebook = None
        if spec.notebook is not None:
            from puffergpt import notebook as nb

            notebook = nb.Notebook(Path(spec.notebook))
        app = create_app(engine, config, reference=lambda: Run(NumpyWeights(checkpoints.load(spec.model))),
                         notebook=notebook)
        engine.ready_texts(spec.max_running)
        engine.hold_reserve()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        print(json.dumps({"port": sock.getsockname()[1]}), flush=True)
        run(server(app, "127.0.0.1", 0), sock)
    finally:
        store.close()
