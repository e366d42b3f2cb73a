"""`make run` from a fresh tree, offline: the demo model serves, saying why; MODEL=gpt2 fails fast.

The tree is fresh (no .venv, no stamps, no cache, no data: HOME and the XDG dirs are in
tmp) and holds this working tree's Makefile and pyproject.toml. Its VENV is a folder of
links to the interpreter running the tests, with the serve stamp made, so `make run` runs
its real recipe without installing (the tests run offline); the install lines themselves
are checked with `make -n`. The hub is forced out of reach (HF_ENDPOINT on a closed port)
even on a machine that has a network.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the test environment's bin: python and puffergpt
SERVING_ONLY_NOT = ("torch", "transformers", "playwright", "pgserver", "pytest")


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tree(tmp_path) -> Path:
    t = tmp_path / "tree"
    t.mkdir()
    for f in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / f, t / f)
    return t


@pytest.fixture
def offline_env(tmp_path) -> dict[str, str]:
    """A new user's environment: empty home, cache and data; the hub refuses connections."""
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "XDG_", "PUFFERGPT_")) and k not in ("MODEL", "HOST", "PORT")}
    return env | {
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local/share"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}",
    }


def dry_run(tree: Path, *args: str, env: dict | None = None) -> list[str]:
    p = subprocess.run(["make", "-n", "-C", str(tree), "--no-print-directory", *args],
                       capture_output=True, text=True, env=env, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_make_run_installs_only_what_serving_needs(tree, tmp_path):
    venv = tmp_path / "new-venv"
    lines = dry_run(tree, "run", f"VENV={venv}")
    assert lines[0].endswith(f"-m venv {venv}")
    installs = [line for line in lines if " install " in line and "--upgrade pip" not in line]
    assert installs == [f"{venv}/bin/pip install -q -e ."], lines  # the base dependencies, no extra
    assert lines[-1] == f"{venv}/bin/puffergpt serve --host 127.0.0.1 --port 8000"  # no --model: the fallback
    # ... and the base dependencies are what serving needs, none of the test extra's heavy parts.
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert not [d for d in deps if d.lower().startswith(SERVING_ONLY_NOT)], deps
    # make test still installs the test extra, under its own stamp.
    test_lines = dry_run(tree, "test", f"VENV={venv}")
    assert f"{venv}/bin/pip install -q -e '.[test]'" in test_lines
    assert f"touch {venv}/.installed-test" in test_lines and f"touch {venv}/.installed-serve" not in test_lines


def test_make_run_model_is_explicit(tree, tmp_path):
    venv = tmp_path / "new-venv"
    assert dry_run(tree, "run", f"VENV={venv}", "MODEL=gpt2", "PORT=8001")[-1] == \
        f"{venv}/bin/puffergpt serve --model 'gpt2' --host 127.0.0.1 --port 8001"
    # A MODEL (or HOST) exported for something else does not change what `make run` serves.
    env = os.environ | {"MODEL": "llama", "HOST": "0.0.0.0"}
    assert (
        dry_run(tree, "run", f"VENV={venv}", env=env)[-1] == f"{venv}/bin/puffergpt serve --host 127.0.0.1 --port 8000"
    )


@pytest.fixture
def linked_venv(tmp_path, tree) -> Path:
    """A VENV whose python and puffergpt are the test environment's, with the serve stamp made."""
    exe = BIN / "puffergpt"
    assert exe.exists(), f"{exe} is missing: run `make install` (pip install -e '.[test]') first"
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    for name in ("python", "puffergpt"):
        (venv / "bin" / name).symlink_to(BIN / name)
    (venv / ".installed-serve").touch()  # newer than the tree's pyproject.toml: nothing to install
    return venv


def start_make_run(tree: Path, venv: Path, env: dict, *args: str) -> subprocess.Popen:
    # Its own process group, so that stopping it stops make, the shell and the server.
    return subprocess.Popen(
        ["make", "-C", str(tree), "--no-print-directory", "run", f"VENV={venv}", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


def stop(p: subprocess.Popen) -> str:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    return p.communicate(timeout=15)[0]


def get(url: str) -> tuple[int, bytes] | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def test_make_run_offline_serves_the_demo_model_and_says_why(tree, linked_venv, offline_env):
    port = free_port()
    t0 = time.monotonic()
    p = start_make_run(tree, linked_venv, offline_env, f"PORT={port}")
    try:
        page = None
        while page is None and p.poll() is None and time.monotonic() - t0 < 90:
            page = get(f"http://127.0.0.1:{port}/")
            time.sleep(0.3)
        up_s = time.monotonic() - t0
        assert page is not None, f"make run did not serve the page (exit {p.poll()}):\n{stop(p)}"
        status, body = page
        assert status == 200 and b"<html" in body.lower()
        info = json.loads(get(f"http://127.0.0.1:{port}/api/info")[1])
    finally:
        out = stop(p)
    assert info["model"] == "demo", info
    note = info.get("fallback")  # why GPT-2 small is not served, and how to get it
    assert isinstance(note, str) and "\n" not in note, info
    assert note.startswith("GPT-2 small could not be downloaded (") and "refused the connection" in note
    assert "run again with a network" in note and "--model PATH" in note
    assert note in out, out  # the terminal says it too, in one line
    assert up_s < 60, f"the page took {up_s:.0f} s to come up"
    assert (Path(offline_env["XDG_DATA_HOME"]) / "puffergpt").is_dir()  # the user's data dir, in tmp


def test_make_run_model_gpt2_offline_fails_fast(tree, linked_venv, offline_env):
    t0 = time.monotonic()
    p = start_make_run(tree, linked_venv, offline_env, "MODEL=gpt2", f"PORT={free_port()}")
    try:
        p.wait(60)
    finally:
        out = stop(p)
    elapsed = time.monotonic() - t0
    assert p.returncode != 0, out
    assert "Error: could not download openai-community/gpt2" in out and "refused the connection" in out
    assert "--model demo" in out and "--model PATH" in out
    assert "Traceback" not in out
    assert elapsed < 20, f"{elapsed:.0f} s"  # huggingface_hub's own retries took ~23 s
