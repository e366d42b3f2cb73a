"""`serve --workers N`: N worker processes behind one front (server/workers.py, server/front.py).

A real `puffergpt serve --workers 2` on the tiny model, met over HTTP as a page or a client
meets it: texts opened together land on different workers and keep to theirs, their tokens are
the numpy reference's, every route still answers through the front (the cross-site refusals of
the workers included), a worker killed with -9 costs only its own texts (text_not_found, then a
reopen) and is started again, and SIGTERM ends each open stream with its final word and leaves
no worker behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from puffergpt.model import tokenizer
from puffergpt.model.reference import Reference

PROMPTS = ["The quick brown fox", "A man", "One day", "The list"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(model, data, port: int, workers: int = 2) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PUFFERGPT_DATA"}
    proc = subprocess.Popen([sys.executable, "-m", "puffergpt.cli", "serve", "--model", str(model), "--data",
                             str(data), "--port", str(port), "--workers", str(workers), "--notebook",
                             str(data / "notebook")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 180
    while True:
        try:
            if json.loads(call(port, "GET", "/api/status")[1])["workers"] == workers:
                return proc
        except (OSError, KeyError, ValueError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"serve --workers {workers} did not come up: {proc.communicate()}")
        time.sleep(0.3)


def call(port: int, method: str, path: str, body=None, headers: dict | None = None) -> tuple[int, bytes]:
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    h = {"content-type": "application/json", **(headers or {})}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def events(raw: bytes) -> list[tuple[str, dict | str]]:
    out, event = [], None
    for line in raw.decode().splitlines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            out.append((event, json.loads(line[6:])))
    return out


def opened(port: int, prompt: str) -> str:
    status, body = call(port, "POST", "/api/texts", {"prompt": prompt})
    assert status == 201, body
    return json.loads(body)["id"]


def generated(port: int, text_id: str, n: int) -> list[int]:
    status, raw = call(port, "POST", f"/api/texts/{text_id}/generate", {"max_tokens": n, "temperature": 0})
    assert status == 200, raw
    evs = events(raw)
    assert evs[-1][0] == "done", evs[-1]
    return [d["token_id"] for e, d in evs if e == "token"]


def children(pid: int) -> list[str]:
    return subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()


@pytest.fixture(scope="module")
def served(tiny_dir, tmp_path_factory):
    port = free_port()
    proc = start_serve(tiny_dir, tmp_path_factory.mktemp("workers") / "data", port)
    yield port, proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def test_texts_together_are_spread_over_the_workers_and_equal_numpy(served, tiny):
    """Four learners at once through the front: each text's tokens are the numpy reference's,
    and the workers share the texts (a worker's own /api/status counts its texts; the front's
    adds them up)."""
    port, proc = served
    ids = [opened(port, p) for p in PROMPTS]
    got: dict[str, list[int]] = {}
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, generated(port, i, 6))) for i in ids]
    [t.start() for t in threads]
    [t.join(120) for t in threads]
    for prompt, i in zip(PROMPTS, ids, strict=True):
        assert got[i] == Reference(tiny).greedy(tokenizer.encode(prompt), 6)[: len(got[i])], prompt
    status = json.loads(call(port, "GET", "/api/status")[1])
    assert status["workers"] == 2 and status["open_texts"] == 4, status
    per_worker = [json.loads(urllib.request.urlopen(f"{u}/api/status", timeout=10).read())["open_texts"]
                  for u in worker_urls(proc)]
    assert sorted(per_worker) == [2, 2], per_worker  # spread, not all on one
    for i in ids:  # every route of a text reaches the worker that holds it
        status, body = call(port, "GET", f"/api/texts/{i}/steps/2/inspect")
        assert status == 200 and len(json.loads(body)["attention"]) == tiny.config.n_layer, body[:200]
        assert call(port, "DELETE", f"/api/texts/{i}")[0] == 200


def worker_urls(proc: subprocess.Popen) -> list[str]:
    """Where each worker listens, read from the sockets its process holds."""
    urls = []
    for pid in children(proc.pid):
        out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
        ports = [line.split()[3].rsplit(":", 1)[1] for line in out.splitlines() if f"pid={pid}," in line]
        urls += [f"http://127.0.0.1:{p}" for p in ports]
    return urls


def test_every_other_route_answers_through_the_front(served):
    """The page, /v1 and the notebook answer through the front; a worker's cross-site checks
    still refuse what another site can send (the front passes Origin and Host on as they came)."""
    port, _ = served
    assert call(port, "GET", "/")[0] == 200
    status, body = call(port, "POST", "/v1/completions", {"prompt": "hello", "max_tokens": 2, "temperature": 0})
    assert status == 200 and len(json.loads(body)["choices"]) == 1, body
    assert call(port, "POST", "/v1/completions", b'{"prompt": "hi"}', {"content-type": "text/plain"})[0] == 415
    status, body = call(port, "POST", "/api/texts", {"prompt": "hi"}, {"origin": "http://evil.example"})
    assert status == 403 and b"evil.example" in body, body
    status, body = call(port, "GET", "/api/texts/0123456789ab")
    assert status == 404 and json.loads(body)["error"]["code"] == "text_not_found"


def test_probes_and_metrics_add_up_through_the_front(served):
    """/health is the front's, /ready is ready when a worker is, /metrics adds up the workers'
    (each request lands on one of them: the sums move by exactly one request's figures)."""
    from prometheus_client.parser import text_string_to_metric_families

    from test_probes import samples, value

    port, _ = served
    assert json.loads(call(port, "GET", "/health")[1]) == {"status": "ok"}
    status, body = call(port, "GET", "/ready")
    assert status == 200 and json.loads(body) == {"status": "ready", "workers": 2, "of": 2}, body
    status, raw = call(port, "GET", "/metrics")
    assert status == 200, raw
    before = samples(raw.decode())
    assert value(before, "puffergpt_workers") == 2
    done = []
    for _ in range(2):  # the front sends them to the workers in turn
        status, body = call(port, "POST", "/v1/completions", {"prompt": "hello", "max_tokens": 3, "temperature": 0})
        assert status == 200, body
        done.append(json.loads(body)["usage"]["completion_tokens"])
    after = samples(call(port, "GET", "/metrics")[1].decode())
    route = {"method": "POST", "route": "/v1/completions", "status": "200"}
    assert value(after, "puffergpt_http_requests_total", **route) - value(before, "puffergpt_http_requests_total",
                                                                          **route) == 2
    def total(got, name):  # over every label set (the model's name among them)
        return sum(v for (n, _), v in got.items() if n == name)

    assert total(after, "puffergpt_tokens_generated_total") - total(before, "puffergpt_tokens_generated_total") \
        == sum(done)
    assert total(after, "puffergpt_generation_tokens_total") - total(before, "puffergpt_generation_tokens_total") \
        == sum(done)
    assert total(after, "puffergpt_time_to_first_token_seconds_count") - total(
        before, "puffergpt_time_to_first_token_seconds_count") == 2
    assert any(dict(labels).get("model") for n, labels in after if n == "puffergpt_model_info")
    search = {"op": "search", "outcome": "ok"}
    moved = value(after, "puffergpt_store_requests_total", **search) - value(before, "puffergpt_store_requests_total",
                                                                             **search)
    assert moved > 0 and moved == value(after, "puffergpt_store_request_seconds_count", op="search") - value(
        before, "puffergpt_store_request_seconds_count", op="search")
    assert not any(name.endswith("_created") for name, _ in after)  # start times are not added up
    families = list(text_string_to_metric_families(call(port, "GET", "/metrics")[1].decode()))
    assert [f.name for f in families if not f.samples] == []  # no family of headers alone
    # the Grafana dashboard in docs/ plots only metrics that exist here (the front's, the workers' summed)
    dashboard = json.loads((Path(__file__).parents[1] / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["query"]["query"])
    named = {m for e in exprs for m in re.findall(r"puffergpt_[a-z_]+", e)}
    exist = {s.name for f in families for s in f.samples}
    assert len(named) >= 10 and named <= exist, named - exist


def test_a_killed_worker_costs_only_its_texts_and_starts_again(tiny_dir, tiny, tmp_path):
    """kill -9 a worker: its text answers text_not_found and is reopened from its ids on the
    other worker with the same tokens as numpy; the other worker's text never noticed; the
    pool starts the dead worker again. Then SIGTERM: an open stream ends with its final error
    event, serve exits 143, and no worker is left."""
    port = free_port()
    proc = start_serve(tiny_dir, tmp_path / "data", port)
    try:
        a, b = opened(port, PROMPTS[0]), opened(port, PROMPTS[1])
        first = generated(port, a, 3)
        pids = children(proc.pid)
        victim = holder(port, proc, a)
        os.kill(victim, signal.SIGKILL)
        status, body = call(port, "POST", f"/api/texts/{a}/generate", {"max_tokens": 3, "temperature": 0})
        assert status == 404 and json.loads(body)["error"]["code"] == "text_not_found", body
        ids = tokenizer.encode(PROMPTS[0]) + first
        status, body = call(port, "POST", "/api/texts", {"prompt_ids": ids})
        again = json.loads(body)["id"]
        more = generated(port, again, 3)
        assert first + more == Reference(tiny).greedy(tokenizer.encode(PROMPTS[0]), 6)
        assert len(generated(port, b, 2)) == 2  # the other worker's text is untouched
        deadline = time.monotonic() + 60
        while json.loads(call(port, "GET", "/api/status")[1])["workers"] != 2:
            assert time.monotonic() < deadline, "the dead worker was not started again"
            time.sleep(0.5)
        assert len(set(children(proc.pid)) - set(pids)) == 1  # one new worker process
        shutdown_ends_streams(port, proc, b)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def holder(port: int, proc: subprocess.Popen, text_id: str) -> int:
    """The pid of the worker holding a text: the one whose own server knows it."""
    for pid in children(proc.pid):
        for url in worker_urls_of(int(pid)):
            try:
                urllib.request.urlopen(f"{url}/api/texts/{text_id}", timeout=10).read()
                return int(pid)
            except urllib.error.HTTPError:
                continue
    raise AssertionError(f"no worker holds {text_id}")


def worker_urls_of(pid: int) -> list[str]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    return [f"http://127.0.0.1:{line.split()[3].rsplit(':', 1)[1]}" for line in out.splitlines()
            if f"pid={pid}," in line]


def shutdown_ends_streams(port: int, proc: subprocess.Popen, text_id: str) -> None:
    pids = children(proc.pid)
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    body = json.dumps({"max_tokens": 100, "temperature": 0}).encode()  # the tiny model's context is 128
    s.sendall(f"POST /api/texts/{text_id}/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 200"), got[:300]
    while b"event: token" not in got:
        got += s.recv(65536)
    proc.send_signal(signal.SIGTERM)
    while chunk := s.recv(65536):
        got += chunk
    s.close()
    _, err = proc.communicate(timeout=60)
    last = [line for line in got.decode(errors="replace").splitlines() if line.startswith("event: ")][-1]
    assert last == "event: error", got[-400:]
    assert proc.returncode == 143, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    left = [p for p in pids if os.path.exists(f"/proc/{p}") and "zombie" not in open(f"/proc/{p}/status").read()]
    assert left == [], f"workers outlived serve: {left}"


def test_workers_refuse_a_store_one_process_opens(tmp_path):
    """Where the weights are on Qdrant Edge (a CPU without AVX2, or a directory made so), one
    process opens them at a time: `serve --workers 2` says so and how to serve instead."""
    from puffergpt.stores.base import StoreError
    from puffergpt.stores.embedded import EmbeddedStore

    store = EmbeddedStore(tmp_path / "data", fallback=True)
    try:
        with pytest.raises(StoreError, match="--workers 1"):
            store.worker_options()
    finally:
        store.close()


def test_a_stopped_worker_is_left_out_then_started_again(tiny_dir, tmp_path):
    """kill -STOP a worker mid-stream: the front's /ready, /metrics and /api/status answer within
    3 s, a new text opens on the other worker and generates; the stopped worker is killed and
    started again (watch.STALL_S), its stream ends with its last event (``error``, code
    worker_lost) and its text answers text_not_found; no traceback is logged."""
    from puffergpt.server.processes.watch import STALL_S

    port = free_port()
    proc = start_serve(tiny_dir, tmp_path / "data", port)
    try:
        a = opened(port, PROMPTS[0])
        victim = holder(port, proc, a)
        other = [u for p in children(proc.pid) if int(p) != victim for u in worker_urls_of(int(p))]
        s, got = stream_until_a_token(port, a)
        os.kill(victim, signal.SIGSTOP)
        for path in ("/ready", "/metrics", "/api/status"):
            t0 = time.monotonic()
            status, _ = call(port, "GET", path)
            assert status == 200 and time.monotonic() - t0 < 3, (path, status, time.monotonic() - t0)
        deadline = time.monotonic() + 5
        while json.loads(call(port, "GET", "/ready")[1]).get("workers") != 1:
            assert time.monotonic() < deadline, "the stopped worker is still counted ready"
            time.sleep(0.2)
        b = opened(port, PROMPTS[1])
        urllib.request.urlopen(f"{other[0]}/api/texts/{b}", timeout=10).read()  # on the other worker
        assert len(generated(port, b, 3)) == 3
        s.settimeout(STALL_S + 30)
        while chunk := s.recv(65536):
            got += chunk
        last = [ln for ln in got.decode(errors="replace").splitlines() if ln.startswith(("event: ", "data: "))][-2:]
        assert last[0] == "event: error" and json.loads(last[1][6:])["code"] == "worker_lost", got[-400:]
        status, body = call(port, "POST", f"/api/texts/{a}/generate", {"max_tokens": 2, "temperature": 0})
        assert status == 404 and json.loads(body)["error"]["code"] == "text_not_found", body
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "has not answered" in err, err[-3000:]


def stream_until_a_token(port: int, text_id: str) -> tuple[socket.socket, bytes]:
    """A generation of ``text_id`` streamed over a raw socket, read until its first token."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    body = json.dumps({"max_tokens": 120, "temperature": 0}).encode()
    s.sendall(f"POST /api/texts/{text_id}/generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
              f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while b"event: token" not in got:
        got += s.recv(65536)
    return s, got


def test_the_front_answers_a_request_without_host(served):
    """HTTP/1.0 with no Host header: the front's probes answer (the workers' checks judge a Host
    only where one is sent)."""
    port, _ = served
    for path in ("/ready", "/health", "/metrics", "/api/status"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
            got = b""
            while chunk := s.recv(65536):
                got += chunk
        assert got.startswith(b"HTTP/1.1 200"), (path, got[:300])
