"""Shutdown with requests open (issue 31, item 7): a real ``puffergpt serve`` on the demo
model gets SIGTERM while a playground generation and a /v1 completion stream and a /v1
completion is computed whole. Each ends with its final word: the page's stream an
``error`` event saying the server is shutting down, the /v1 stream an error and then
``[DONE]``, the whole completion a 503 in OpenAI's shape; the process exits (143) well
within a loose bound, with no traceback in its log."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

PROMPT = "The quick brown fox"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(data, port: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PUFFERGPT_DATA"}
    p = subprocess.Popen([sys.executable, "-m", "puffergpt.cli", "serve", "--model", "demo", "--data", str(data),
                          "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180  # the first start loads the demo model into the store
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/info", timeout=2).read()
            return p
        except OSError:
            assert p.poll() is None, p.communicate()
            assert time.monotonic() < deadline, "serve did not come up"
            time.sleep(0.5)


def send(port: int, path: str, body: dict) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    raw = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode() + raw)
    return s


def read_until(s: socket.socket, marker: bytes, data: bytes = b"") -> bytes:
    while marker not in data:
        chunk = s.recv(65536)
        assert chunk, f"the stream ended before {marker!r}: {data[-300:]!r}"
        data += chunk
    return data


def read_all(s: socket.socket, data: bytes) -> bytes:
    with s:
        while chunk := s.recv(65536):
            data += chunk
    return data


def last_events(data: bytes) -> list[tuple[str | None, str]]:
    """(event, data) of a server-sent stream's events (its chunked framing left in place:
    each event's lines are whole)."""
    out, event = [], None
    for line in data.decode().splitlines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            out.append((event, line[6:]))
            event = None
    return out


def test_sigterm_with_requests_open_ends_each_with_its_final_word(tmp_path):
    port = free_port()
    serve = start_serve(tmp_path / "data", port)
    try:
        tid = json.loads(urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{port}/api/texts", data=json.dumps({"prompt": PROMPT}).encode(),
            headers={"content-type": "application/json"}), timeout=30).read())["id"]
        # Greedy: the demo model writes 200 tokens after PROMPT with no <|endoftext|> (checked against
        # the numpy reference), so both streams are still running when the signal comes.
        page = send(port, f"/api/texts/{tid}/generate", {"max_tokens": 200, "temperature": 0})
        v1 = send(port, "/v1/completions", {"prompt": PROMPT, "max_tokens": 200, "stream": True, "temperature": 0})
        whole = send(port, "/v1/completions", {"prompt": [[5] * 100] * 32, "max_tokens": 0, "echo": True,
                                               "logprobs": 1})  # 3,200 searches over the vocabulary: many seconds
        got_page = read_until(page, b"event: token")
        got_v1 = read_until(v1, b"data: {")
        t0 = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        got_page, got_v1, got_whole = read_all(page, got_page), read_all(v1, got_v1), read_all(whole, b"")
        answered = time.monotonic() - t0
        out, err = serve.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
    kind, data = last_events(got_page)[-1]
    assert kind == "error" and "shutting down" in json.loads(data)["detail"], got_page[-400:]
    evs = [d for _, d in last_events(got_v1)]
    assert evs[-1] == "[DONE]" and "shutting down" in json.loads(evs[-2])["error"]["message"], evs[-3:]
    assert got_whole.startswith(b"HTTP/1.1 503"), got_whole[:300]
    assert json.loads(got_whole.partition(b"\r\n\r\n")[2])["error"]["code"] == "server_shutting_down"
    assert serve.returncode == 143, (serve.returncode, err[-2000:])
    for word in ("Traceback", "CancelledError", "Exception in ASGI application", "Cancel "):
        assert word not in err, err[-3000:]
    assert took < 10, took  # loose: the docs say 2 s (GRACE_S); what it took is printed
    print(f"SIGTERM with two streams and a whole completion open: each answered within {answered:.2f} s, "
          f"the process exited in {took:.2f} s")


def test_the_streams_above_cannot_end_before_the_signal(demo):
    """What the shutdown test relies on: greedy, the demo model writes 200 tokens after PROMPT
    without <|endoftext|> (at temperature 1 it may end within two), so a stream it reads is
    still open when SIGTERM comes."""
    from puffergpt.app import completion
    from puffergpt.model import tokenizer
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.sampling import Sampling
    from puffergpt.model.session import Run

    got = [s.token_id for s in completion.complete(lambda: Run(NumpyWeights(demo)), tokenizer.encode(PROMPT), 200,
                                                   Sampling(0.0))]
    assert len(got) == 200 and tokenizer.EOT not in got
