"""Backends as plugins (docs/backends.md#a-backend-in-a-package-of-its-own): a package of its
own names its backend in the entry-point group ``puffergpt.backends``; installed (here with pip,
offline, into a directory of its own), ``--backend`` chooses it in a real process, its setting
is a flag and a variable, and a name nobody installed is refused, listing those that are."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from puffergpt import stores
from puffergpt.settings import Setting

SRC = Path(__file__).resolve().parents[1] / "src"

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "puffergpt-mine"
version = "0.1.0"
dependencies = ["puffergpt"]

[project.entry-points."puffergpt.backends"]
mine = "puffergpt_mine:MineStore"

[tool.setuptools]
py-modules = ["puffergpt_mine"]
"""

MODULE = '''\
"""The embedded store under another name, with a setting of its own: a plugin's backend."""
import sys

from puffergpt.settings import Setting
from puffergpt.stores.embedded import EmbeddedStore


class MineStore(EmbeddedStore):
    name = "mine"
    settings = (Setting("greeting", "what it says when it opens", flag="--mine-greeting", env="MINE_GREETING"),)

    def __init__(self, data_dir, greeting=None):
        print(f"mine opened, greeting {greeting!r}", file=sys.stderr)
        super().__init__(data_dir)
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The plugin package, installed by pip (no network, no build isolation) into a directory."""
    root = tmp_path_factory.mktemp("plugin")
    pkg = root / "puffergpt-mine"
    pkg.mkdir()
    (pkg / "pyproject.toml").write_text(PYPROJECT)
    (pkg / "puffergpt_mine.py").write_text(MODULE)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
                        "--quiet", "--target", str(root / "site"), str(pkg)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return root / "site"


def cli(site: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("PUFFERGPT_DATA", "MINE_GREETING", "PYTHONPATH")}
    return subprocess.run([sys.executable, "-m", "puffergpt.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**clean, "PYTHONPATH": f"{site}{os.pathsep}{SRC}", **env})


def test_an_installed_plugin_is_listed_with_its_setting(site):
    r = cli(site, "backends")
    assert r.returncode == 0, r.stderr
    assert "mine  puffergpt_mine:MineStore" in r.stdout, r.stdout
    assert "greeting: --mine-greeting or $MINE_GREETING" in r.stdout, r.stdout
    for shipped in ("embedded", "pgvector", "turbopuffer"):  # beside it, as before
        assert f"{shipped}  puffergpt.stores." in r.stdout, r.stdout
    assert "--mine-greeting" in cli(site, "load", "--help").stdout


def test_backend_chooses_the_plugin_and_its_setting_reaches_it(site, tiny_dir, tmp_path):
    data = tmp_path / "data"
    r = cli(site, "load", "--model", str(tiny_dir), "--backend", "mine", "--data", str(data), "--mine-greeting", "hi")
    assert r.returncode == 0, r.stderr
    assert "mine opened, greeting 'hi'" in r.stderr and "ready" in r.stdout, (r.stdout, r.stderr)
    # from its variable, and the model it holds generates
    r = cli(site, "generate", "Hello", "--model", str(tiny_dir), "--backend", "mine", "--data", str(data), "-n", "2",
            "--temperature", "0", MINE_GREETING="from the environment")
    assert r.returncode == 0, r.stderr
    assert "mine opened, greeting 'from the environment'" in r.stderr, r.stderr
    assert r.stdout.startswith("Hello"), r.stdout


def test_an_unknown_backend_lists_the_installed_ones(site):
    r = cli(site, "load", "--model", "demo", "--backend", "nope")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    message = " ".join(r.stderr.split())
    assert "unknown backend 'nope': the installed backends are embedded, pgvector, turbopuffer, mine" in message


def test_without_the_plugin_its_name_is_unknown_here():
    """The plugin lives only on the subprocesses' path: this process neither sees nor needs it."""
    assert "mine" not in stores.backends()
    with pytest.raises(stores.StoreError, match="the installed backends are embedded, pgvector, turbopuffer"):
        stores.open_store("mine")


def test_the_shipped_backends_are_entry_points_and_the_fallback_says_the_same():
    """pyproject.toml registers puffergpt's three as a plugin does; stores.SHIPPED, known when the
    installed metadata predates that table, names the same factories."""
    table = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]["entry-points"][stores.GROUP]
    assert table == stores.SHIPPED
    for name in table:
        assert callable(stores.factory(name)), name


def test_a_name_two_packages_claim_is_refused_naming_both(monkeypatch):
    theirs = EntryPoint(name="embedded", value="their_package:Store", group=stores.GROUP)
    monkeypatch.setattr(stores, "entry_points", lambda group: [theirs])
    with pytest.raises(stores.StoreError, match="two installed packages name a backend 'embedded'.*their_package"):
        stores.backends()


def test_a_registered_backend_is_listed_and_opened(tmp_path, monkeypatch):
    """``register`` adds a backend from code, beside the installed ones."""
    from puffergpt.stores.embedded import EmbeddedStore

    monkeypatch.setattr(stores, "_registered", {})
    stores.register("ours", EmbeddedStore)
    assert list(stores.backends())[-1] == "ours"
    s = stores.open_store("ours", tmp_path)
    try:
        assert isinstance(s, EmbeddedStore)
    finally:
        s.close()
    with pytest.raises(stores.StoreError, match="exists already"):
        stores.register("embedded", "somewhere:Else")


def probe_command():
    """A command that takes --backend, as every command that opens a store does."""
    from puffergpt.cli.options import BackendCommand, option

    @click.command(cls=BackendCommand)
    @option("backend")
    @option("data_dir")
    def probe(backend, data_dir, backend_settings):
        click.echo(f"{backend} {sorted(backend_settings)}")

    return probe


def test_a_backend_flag_a_command_has_already_is_refused_naming_the_backend(monkeypatch):
    from puffergpt.stores.embedded import EmbeddedStore

    class Clash(EmbeddedStore):
        settings = (Setting("where", "a directory of its own", flag="--data"),)

    monkeypatch.setattr(stores, "_registered", {})
    stores.register("clash", Clash)
    r = CliRunner().invoke(probe_command(), [])
    assert r.exit_code == 1 and "the backend 'clash' declares --data (where), which `probe` has already" in r.output


def test_a_backend_that_cant_be_read_is_left_out_saying_why(monkeypatch):
    monkeypatch.setattr(stores, "_registered", {})
    stores.register("broken", "no_such_module:Store")
    r = CliRunner().invoke(probe_command(), ["--dsn", "postgresql://x"])
    assert r.exit_code == 0, r.output
    assert "the backend 'broken' can't be read (No module named 'no_such_module')" in r.output
    assert "embedded ['dsn']" in r.output  # the others' options are still there
