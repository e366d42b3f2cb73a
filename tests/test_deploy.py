"""docs/deploy.md holds (issue 32, items 2 and 3): its HAProxy configuration is one HAProxy
accepts, with the directives the real test runs (tests/cluster.py); a second server on one
data directory is refused with a message that names the way to share."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from click.testing import CliRunner

from cluster import haproxy_binary, haproxy_config
from helpers import held_by_another_process
from puffergpt.cli import main

DEPLOY = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"


def block(lang: str) -> str:
    got = re.findall(rf"```{lang}\n(.*?)```", DEPLOY.read_text(), re.S)
    assert len(got) == 1, f"docs/deploy.md has {len(got)} {lang} blocks"
    return got[0]


def test_the_documented_haproxy_configuration_is_valid_and_the_tested_one(tmp_path):
    doc = block("haproxy")
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(doc)
    r = subprocess.run([haproxy_binary(), "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    words = lambda text: {" ".join(line.split()) for line in text.splitlines()}  # noqa: E731
    tested = {w for w in words(haproxy_config(1, {"s1": 2})) if not re.match(r"(bind|server|global|maxconn)\b", w)}
    assert tested <= words(doc), f"the test runs directives the doc lacks: {sorted(tested - words(doc))}"


def test_the_documented_nginx_configuration_keeps_the_stream_and_the_key():
    doc = block("nginx")
    for directive in ("hash $puffergpt_key consistent;", "proxy_buffering off;", "proxy_next_upstream error timeout;",
                      'add_header Set-Cookie "puffergpt=$puffergpt_key'):
        assert directive in doc, directive


def test_a_second_server_on_one_data_directory_names_the_way_to_share(tmp_path):
    data = tmp_path / "data"
    with held_by_another_process("embedded", data) as pid:
        r = CliRunner().invoke(main, ["serve", "--model", "demo", "--data", str(data), "--port", "0"])
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    for words in (f"in use by another puffergpt process (pid {pid})", "--backend pgvector --dsn",
                  "--backend turbopuffer", "docs/deploy.md"):
        assert words in r.output, (words, r.output)
