"""A connection's bounds, on a real uvicorn server (guards/connections.py, guards/body_limit.py):
headers sent a byte at a time are cut at their total deadline with a 408, a 1 MB header line
is a 431 the client reads (not a reset), a body sent slowly is cut at its total deadline, and
past ``max_connections`` one more connection is answered 503 at once."""

from __future__ import annotations

import json
import socket
import time

import pytest

from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from test_reliability import Running


@pytest.fixture
def served(loaded, tiny):
    store, key = loaded(tiny)
    engine = open_engine(store, tiny.name, key)
    config = ServerConfig(read_timeout_s=1.0, body_timeout_s=2.0, header_timeout_s=1.5, max_connections=8)
    with Running(create_app(engine, config)) as r:
        yield r


def read_all(s: socket.socket) -> bytes:
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


def trickled(s: socket.socket, data: bytes, every_s: float, until_s: float) -> None:
    """Send ``data`` a byte every ``every_s`` until the server closes or ``until_s`` passes."""
    t0 = time.monotonic()
    for b in data:
        try:
            s.sendall(bytes([b]))
        except OSError:  # closed by the server: what the test wants
            return
        if time.monotonic() - t0 > until_s:
            return
        time.sleep(every_s)


def test_headers_sent_slowly_are_cut_at_their_deadline(served):
    """A byte every 0.3 s, each within any per-read timeout: the 408 comes at the total deadline
    (1.5 s here), and the connection closes."""
    s = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    t0 = time.monotonic()
    trickled(s, b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 100, 0.3, 6)
    data = read_all(s)
    took = time.monotonic() - t0
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"did not arrive within 1.5 s" in data and took < 5, took
    assert served.request("GET", "/api/info")[0] == 200  # the server is fine


def test_a_body_sent_slowly_is_cut_at_its_total_deadline(served):
    """Each piece within the read timeout (1 s), the whole not within 2 s: 408 naming it."""
    s = served.send("POST", "/api/texts", raw=b"", headers={"Content-Length": "200"})
    t0 = time.monotonic()
    trickled(s, b'{"prompt": "' + b"a" * 150 + b'"}', 0.3, 8)
    data = read_all(s)
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"did not arrive within 2 s" in data and time.monotonic() - t0 < 5


def test_a_megabyte_header_line_is_431(served):
    s = socket.create_connection(("127.0.0.1", served.port), timeout=10)
    s.sendall(b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
    data = read_all(s)
    assert data.startswith(b"HTTP/1.1 431"), data[:200]
    body = json.loads(data.partition(b"\r\n\r\n")[2])
    assert body["error"]["code"] == "headers_too_large" and "65536 bytes" in body["error"]["message"]


def test_connections_past_the_cap_are_503(served):
    held = [socket.create_connection(("127.0.0.1", served.port), timeout=10) for _ in range(8)]
    try:
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", served.port), timeout=10)
        data = read_all(extra)
        assert data.startswith(b"HTTP/1.1 503") and b"--max-connections" in data, data[:300]
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    assert served.request("GET", "/api/info")[0] == 200
