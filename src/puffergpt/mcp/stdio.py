"""MCP over stdio with every malformed line answered: a screen in front of the SDK's transport.

The SDK (mcp 2.3.0) reads stdin a line a message and drops a line it cannot read without
a word (``not json``, ``{}``, a batch, ``"jsonrpc": "1.0"``, deep nesting, a lone
surrogate), so a client that sent one waits forever. Here each line is checked first, as
JSON-RPC 2.0 asks:

    not UTF-8, not JSON, nested too deep         -32700 Parse error, id null
    not one object (a batch), jsonrpc not "2.0",
    no method, an id neither text nor integer    -32600 Invalid Request, the id where it reads
    a lone surrogate (\\ud800) in params          -32602 Invalid params, with the id

and answered with that error; a line that passes is handed to the SDK unchanged (it
parses it again, exactly as before). The answers go out through the SDK's own writer, so
they never interleave with its messages on stdout.

The SDK is left as it is: its ``stdio_server`` takes our screened lines as its stdin and
keeps stdout; we point fd 0 at /dev/null while serving, as the SDK does when it reads
stdin itself, so no child process can read the protocol's bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any, BinaryIO

import anyio

PARSE_ERROR, INVALID_REQUEST, INVALID_PARAMS = -32700, -32600, -32602
SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads pairs \ud83d\ude00 into one character; a lone one stays
SHOWN_CHARS = 40  # of a bad value quoted in an answer


def shown(v: Any) -> str:
    """A value from the line, quoted for an answer: ASCII (a surrogate can't be written
    out as UTF-8), at most SHOWN_CHARS of it."""
    s = ascii(v)
    return s if len(s) <= SHOWN_CHARS else f"{s[:SHOWN_CHARS]}... ({len(str(v)):,} characters)"


def lone_surrogate(obj: Any) -> str | None:
    """Where the first text holding a lone surrogate is (``params.arguments.text_id``),
    or None. A walk with a stack: the message may nest as deep as json.loads reads."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if SURROGATE.search(v):
                return path or "the message"
        elif isinstance(v, dict):
            for k, x in v.items():
                p = f"{path}.{shown(k)[1:-1]}" if path else shown(k)[1:-1]
                if SURROGATE.search(k):
                    return f"a key of {path or 'the message'}"
                stack.append((x, p))
        elif isinstance(v, list):
            stack.extend((x, f"{path}[{i}]") for i, x in enumerate(v))
    return None


def request_id(msg: dict) -> int | str | None:
    """The message's id where it reads as one (text or an integer, not true or false)."""
    i = msg.get("id")
    if isinstance(i, bool) or not isinstance(i, (int, str)) or (isinstance(i, str) and SURROGATE.search(i)):
        return None
    return i


def shape_problem(msg: dict) -> str | None:
    """What keeps an object from being a JSON-RPC 2.0 message, in words; None if nothing."""
    if "jsonrpc" not in msg:
        return '"jsonrpc": "2.0" is missing' + (" (the object is empty)" if not msg else "")
    if msg["jsonrpc"] != "2.0":
        return f'"jsonrpc" must be "2.0", got {shown(msg["jsonrpc"])}'
    # a response's id may be null (an error about a request whose id did not read); a request's may not
    if "id" in msg and request_id(msg) is None and ("method" in msg or msg["id"] is not None):
        return f'"id" must be text or an integer, got {shown(msg["id"])}'
    if "method" in msg:
        if not isinstance(msg["method"], str):
            return f'"method" must be text, got {shown(msg["method"])}'
        if "params" in msg and not isinstance(msg["params"], dict) and msg["params"] is not None:
            return f'"params" must be an object, got {type(msg["params"]).__name__}'
        return None
    if "id" not in msg or not ("result" in msg or "error" in msg):
        return 'a request needs "method" and "id", a notification "method", a response "id" and "result" or "error"'
    return None


def screen(raw: bytes) -> tuple[str | None, tuple[int | str | None, int, str] | None]:
    """One line from the client: (the line to hand to the SDK, None), or (None, the
    answer: id, code, message), or (None, None) for a blank line (not a message)."""
    from mcp_types import jsonrpc_message_adapter

    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, (None, PARSE_ERROR, f"Parse error: the line is not UTF-8 (byte 0x{raw[e.start]:02x} "
                                         f"at offset {e.start}); JSON-RPC over stdio is UTF-8")
    if not line.strip():
        return None, None
    try:
        msg = json.loads(line)
    except RecursionError:
        return None, (None, PARSE_ERROR, "Parse error: the JSON nests too deeply to read")
    except ValueError as e:
        return None, (None, PARSE_ERROR, f"Parse error: not JSON ({e})")
    if isinstance(msg, list):
        return None, (None, INVALID_REQUEST, "Invalid Request: a batch (a JSON array); MCP has no batches: "
                                             "send each message as one JSON object on a line of its own")
    if not isinstance(msg, dict):
        return None, (None, INVALID_REQUEST, f"Invalid Request: a message is one JSON object, got {type(msg).__name__}")
    rid = request_id(msg)
    if problem := shape_problem(msg):
        return None, (rid, INVALID_REQUEST, f"Invalid Request: {problem}")
    if where := lone_surrogate(msg):
        code = INVALID_PARAMS if where.startswith("params") else INVALID_REQUEST
        return None, (rid, code, f"{'Invalid params' if code == INVALID_PARAMS else 'Invalid Request'}: {where} "
                                 "holds a lone surrogate (a \\ud800-\\udfff escape without its pair), "
                                 "which is not text: send valid Unicode")
    try:  # the SDK's own reading, so that nothing handed on is dropped there
        jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as e:
        first = e.errors()[0] if hasattr(e, "errors") and e.errors() else {"msg": str(e)}
        return None, (rid, INVALID_REQUEST, f"Invalid Request: {first['msg']}")
    return line, None


def answer(rid: int | str | None, code: int, message: str):
    """A JSON-RPC error message for the SDK's writer."""
    from mcp.shared.message import SessionMessage
    from mcp_types import ErrorData, JSONRPCError

    try:
        err = JSONRPCError(jsonrpc="2.0", id=rid, error=ErrorData(code=code, message=message))
    except ValueError:  # an id the SDK's types refuse (an integer past its range): null, as JSON-RPC allows
        err = JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=code, message=message))
    return SessionMessage(err)


class Screened:
    """stdin's lines for the SDK's reader, less the malformed ones, whose answers go to
    ``answers``; closes ``answers`` at the end of stdin."""

    def __init__(self, wire: BinaryIO, answers):
        self.wire, self.answers = wire, answers

    async def __aiter__(self) -> AsyncIterator[str]:
        async with self.answers:
            async for raw in anyio.wrap_file(self.wire):
                line, err = screen(raw)
                if err is not None:
                    await self.answers.send(answer(*err))
                elif line is not None:
                    yield line


@contextlib.contextmanager
def claimed_stdin() -> Iterator[BinaryIO]:
    """stdin for the protocol alone: a private duplicate to read, fd 0 pointed at
    /dev/null meanwhile (a child reads nothing of it), put back at the end. The duplicate
    is never closed: a reader thread may still be blocked on it."""
    try:
        wire = os.dup(0)
        null = os.open(os.devnull, os.O_RDONLY)
    except OSError:
        yield sys.stdin.buffer
        return
    os.dup2(null, 0)
    os.close(null)
    try:
        yield os.fdopen(wire, "rb", closefd=False)
    finally:
        os.dup2(wire, 0)


async def serve(server) -> None:
    """Run an ``MCPServer`` over stdio with the screen in front of it, until stdin ends."""
    from mcp.server.stdio import stdio_server

    answers_in, answers_out = anyio.create_memory_object_stream(0)
    with claimed_stdin() as wire:
        async with stdio_server(stdin=Screened(wire, answers_in)) as (read_stream, write_stream):
            async with anyio.create_task_group() as tg:
                tg.start_soon(forward, answers_out, write_stream.clone())
                # MCPServer.run_stdio_async does this over the SDK's own stdin (mcp 2.3.0 is pinned)
                low = server._lowlevel_server
                await low.run(read_stream, write_stream, low.create_initialization_options())


async def forward(answers, out) -> None:
    """The screen's answers onto the SDK's writer, until stdin ends."""
    async with answers, out:
        async for msg in answers:
            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                await out.send(msg)
