"""``puffergpt mcp`` on the wire: raw lines sent to its stdin, as a broken or hostile client
would send them (issue 31). Every malformed message gets JSON-RPC's error (-32700 parse
error, -32600 invalid request, -32602 invalid params) with the request's id, or null
where it does not read, and the server goes on answering. The SDK alone answered none
of them, and a lone surrogate in a tool's argument left the client waiting forever.

The server runs with ``--server`` at an address nothing listens on: no model is loaded,
and nothing here reaches a tool's backend."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading

import pytest

from puffergpt.mcp.stdio import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, screen

WAIT_S = 120  # a guard against a server that never answers, not a timing claim


class Wire:
    """``puffergpt mcp`` as a subprocess, spoken to a line at a time."""

    def __init__(self, *args: str):
        cmd = [sys.executable, "-m", "puffergpt.cli", "mcp", *args]
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.answers.put(line)
        self.answers.put(None)

    def send(self, raw: bytes | dict) -> None:
        self.p.stdin.write((json.dumps(raw).encode() if isinstance(raw, dict) else raw) + b"\n")
        self.p.stdin.flush()

    def receive(self) -> dict:
        try:
            line = self.answers.get(timeout=WAIT_S)
        except queue.Empty:
            pytest.fail(f"no answer in {WAIT_S} s: the server dropped the message")
        assert line is not None, f"the server closed stdout: {self.p.stderr.read().decode()[-2000:]}"
        return json.loads(line)

    def close(self) -> str:
        self.p.stdin.close()
        self.p.wait(60)
        return self.p.stderr.read().decode()


@pytest.fixture(scope="module")
def wire():
    w = Wire("--server", "http://127.0.0.1:9")  # the discard port: nothing answers there
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    w.send({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": hello})
    assert w.receive()["result"]["serverInfo"]["name"] == "puffergpt"
    w.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    yield w
    err = w.close()
    assert "Traceback" not in err, err[-3000:]


DEEP = b"[" * 100_000 + b"]" * 100_000
SURROGATE_CALL = (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"inspect",'
                  b'"arguments":{"text_id":"\\ud800","position":1}}}')

CASES = [  # (name, the line, code, id, words the message holds)
    ("not json", b"not json", PARSE_ERROR, None, "not JSON"),
    ("empty object", b"{}", INVALID_REQUEST, None, '"jsonrpc": "2.0" is missing'),
    ("batch", b'[{"jsonrpc":"2.0","id":5,"method":"ping"}]', INVALID_REQUEST, None, "no batches"),
    ("empty batch", b"[]", INVALID_REQUEST, None, "no batches"),
    ("jsonrpc 1.0", b'{"jsonrpc":"1.0","id":6,"method":"ping"}', INVALID_REQUEST, 6, "must be \"2.0\""),
    ("deep nesting", DEEP, PARSE_ERROR, None, "nests too deeply"),
    ("deep params", b'{"jsonrpc":"2.0","id":"d","method":"ping","params":{"a":' + b"[" * 300 + b"]" * 300 + b"}}",
     INVALID_REQUEST, "d", "recursion limit"),
    ("lone surrogate", SURROGATE_CALL, INVALID_PARAMS, 7, "params.arguments.text_id holds a lone surrogate"),
    ("surrogate id", b'{"jsonrpc":"2.0","id":"\\udc00","method":"ping"}', INVALID_REQUEST, None, '"id" must be'),
    ("not utf-8", b'{"jsonrpc":"2.0","id":8,"method":"p\xffing"}', PARSE_ERROR, None, "not UTF-8"),
    ("a number", b"42", INVALID_REQUEST, None, "one JSON object"),
    ("id true", b'{"jsonrpc":"2.0","id":true,"method":"ping"}', INVALID_REQUEST, None, '"id" must be'),
    ("params a list", b'{"jsonrpc":"2.0","id":9,"method":"ping","params":[1]}', INVALID_REQUEST, 9,
     '"params" must be an object'),
    ("method a number", b'{"jsonrpc":"2.0","id":10,"method":3}', INVALID_REQUEST, 10, '"method" must be text'),
]


@pytest.mark.parametrize(("name", "line", "code", "rid", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_malformed_line_is_answered_and_the_server_goes_on(wire, name, line, code, rid, words):
    wire.send(line)
    wire.send({"jsonrpc": "2.0", "id": f"after {name}", "method": "ping"})
    got = wire.receive()  # first: had the line been dropped, this would be the ping's answer
    assert got.get("error", {}).get("code") == code and got["id"] == rid, got
    assert words in got["error"]["message"], got
    assert wire.receive() == {"jsonrpc": "2.0", "id": f"after {name}", "result": {}}


def test_a_tool_call_still_works_after_the_malformed_lines(wire):
    """A real tool call after them: the backend answers (here: the server it talks to is down)."""
    for case in CASES:
        wire.send(case[1])
        assert "error" in wire.receive()
    wire.send({"jsonrpc": "2.0", "id": 11, "method": "tools/call",
               "params": {"name": "inspect", "arguments": {"text_id": "0123456789ab", "position": 1}}})
    got = wire.receive()
    assert got["id"] == 11 and got["result"]["isError"], got
    assert "could not reach puffergpt serve" in got["result"]["content"][0]["text"], got


def test_the_screen_hands_good_lines_on_unchanged():
    """What passes the screen reaches the SDK as it came: requests, notifications,
    responses (a response's id may be null), a blank line is no message."""
    for line in (b'{"jsonrpc":"2.0","id":1,"method":"ping"}', b'{"jsonrpc":"2.0","method":"notifications/initialized"}',
                 b'{"jsonrpc":"2.0","id":"x","result":{}}',
                 b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"m"}}',
                 '{"jsonrpc":"2.0","id":2,"method":"ping","params":{"t":"\U0001f9e0 \\ud83e\\udde0"}}'.encode()):
        assert screen(line) == (line.decode(), None), line
    assert screen(b"   ") == (None, None)
