"""docs/deploy.md holds (issue 32, items 2 and 3): its HAProxy configuration is one HAProxy
accepts, with the directives the real test runs (tests/cluster.py); a second server on one
data directory is refused with a message that names the way to share; the bench's learners
keep a balancer's cookie, as a browser does."""

from __future__ import annotations

import json
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from click.testing import CliRunner

from cluster import haproxy_binary, haproxy_config
from helpers import held_by_another_process
from puffergpt.bench import clients as bc
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


class Balancer(BaseHTTPRequestHandler):
    """Answers JSON, sets a stickiness cookie on the first answer, records each request's Cookie."""

    seen: list = []

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        Balancer.seen.append(self.headers.get("Cookie"))
        self.send_response(200)
        if len(Balancer.seen) == 1:
            self.send_header("Set-Cookie", "puffergpt=s2; path=/")
            self.send_header("Set-Cookie", "other=x=y; HttpOnly")
        body = json.dumps({"ok": True}).encode()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_bench_learners_keep_a_balancers_cookie():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Balancer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        server = bc.Server.of(f"http://127.0.0.1:{httpd.server_address[1]}/")
        conn, jar = server.connect(10), {}
        for _ in range(3):
            assert bc.call(conn, server, "POST", "/api/texts", {"prompt": "x"}, jar) == {"ok": True}
        conn.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert Balancer.seen == [None, "puffergpt=s2; other=x=y", "puffergpt=s2; other=x=y"]
