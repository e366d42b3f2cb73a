"""Every server setting is defined once (``puffergpt.settings``), and what is built from that
table agrees with it: serve's options (what a command line without them gives), ServerConfig's
fields and defaults, the workers' spec, and the defaults the scheduler and the sweeper keep.
Nothing here lists the settings by hand: each check walks the table."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from puffergpt import settings
from puffergpt.cli.options import checked
from puffergpt.cli.serving import serve
from puffergpt.search import scheduler, sweeper
from puffergpt.server import bodies
from puffergpt.server.processes.workers import WorkerSpec
from puffergpt.server.state import ServerConfig

SRC = Path(__file__).resolve().parents[1] / "src" / "puffergpt"
# The same flag with another meaning: bench --output-search TEXT_FILE measures the search, it doesn't set
# it; mcp --server URL --api-key KEY is the key a client sends, not the keys a server requires.
OWN_MEANING = {("cli/benchmark.py", "--output-search"), ("cli/options.py", "--api-key")}


def serve_defaults(monkeypatch) -> dict:
    """What serve receives for each of its parameters when the command line gives none."""
    for s in settings.SERVER:
        if s.env:
            monkeypatch.delenv(s.env, raising=False)
    with serve.make_context("serve", []) as ctx:
        return dict(ctx.params)


def test_each_setting_has_one_name_one_flag_one_variable():
    for attr in ("name", "flag", "env"):
        values = [getattr(s, attr) for s in settings.SERVER if getattr(s, attr)]
        assert len(values) == len(set(values)), f"a setting's {attr} is used twice: {values}"
    assert all(s.help for s in settings.SERVER), "a setting without help"
    assert all(set(s.to) <= {"config", "worker"} for s in settings.SERVER)
    assert all(s.flag or s.to for s in settings.SERVER), "a setting neither a flag nor anyone's field"


def test_serve_takes_each_flagged_setting_with_the_tables_default(monkeypatch):
    got = serve_defaults(monkeypatch)
    flagged = [s for s in settings.SERVER if s.flag]
    options = {p.name: p for p in serve.params}
    for s in flagged:
        assert options[s.name].opts == [s.flag], s.name
        assert got[s.name] == checked(s, s.default), f"serve {s.flag} defaults to {got[s.name]!r}, not {s.default!r}"
    # and nothing else but --model and the backends' own flags (pgvector's --dsn)
    assert set(options) - {s.name for s in flagged} == {"model"} | {s.name for s in serve.store_params}


def test_idle_minutes_is_idle_s_in_minutes(monkeypatch):
    assert serve_defaults(monkeypatch)["idle_s"] == 1800.0
    with serve.make_context("serve", ["--idle-minutes", "2"]) as ctx:
        assert ctx.params["idle_s"] == 120.0


def test_server_config_is_the_settings_that_go_to_config():
    config = {f.name: f for f in dataclasses.fields(ServerConfig)}
    table = {s.name: s for s in settings.going("config")}
    assert set(config) == set(table)
    for name, s in table.items():
        assert config[name].default == s.default, name
        assert config[name].repr is not s.secret, f"{name}: a secret in ServerConfig's repr"
    assert ServerConfig().max_open_texts == settings.default("max_open_texts")
    assert "KEY-" not in repr(ServerConfig(api_keys=("KEY-0123456789",)))


def test_the_workers_spec_carries_the_settings_that_go_to_worker():
    spec = {f.name: f for f in dataclasses.fields(WorkerSpec)}
    for s in settings.going("worker"):
        assert spec[s.name].default == s.default, s.name
    here = {"model", "data_dir", "store_options", "config", "notebook"}  # what serve works out for its workers
    assert set(spec) == here | {s.name for s in settings.going("worker")}


def test_the_layers_take_their_defaults_from_the_table():
    assert scheduler.MAX_RUNNING == settings.default("max_running")
    assert sweeper.DEFAULT_TTL_S == settings.default("text_ttl_s")
    assert bodies.MAX_NEW_TOKENS == settings.default("max_new_tokens")


def test_no_module_declares_a_settings_flag_again():
    """A setting's flag is declared by the table alone: no click.option("--max-texts", ...) elsewhere."""
    for path in SRC.rglob("*.py"):
        where, text = str(path.relative_to(SRC)), path.read_text()
        for s in settings.SERVER:
            again = s.flag and re.search(rf"click\.option\(\s*[\"']{re.escape(s.flag)}[\"']", text)
            assert not again or (where, s.flag) in OWN_MEANING, f"{where} declares {s.flag} again: option({s.name!r})"
