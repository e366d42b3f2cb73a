"""The bound on a request body, before any route: at most MAX_BODY bytes, arriving
without long pauses and within a total deadline, and JSON Python holds as sent
(``bodies.parse_json``)."""

from __future__ import annotations

import asyncio
import time

from puffergpt import settings
from puffergpt.server.bodies import BodyError, parse_json
from puffergpt.server.errors import refuse

MAX_BODY = 64 * 1024  # bytes of a request body


class BoundedBody:
    """Refuse a request body over MAX_BODY bytes, counted as it arrives (chunked bodies
    too), and one that is not JSON Python holds as sent (``bodies.parse_json``: the one
    parser, for every route): the body is read here, bounded, checked, and handed on
    whole. Refusals on /v1 and the tokenizer routes are in OpenAI's error shape. ``parse``
    False: bounded only, handed on as it came (the front of ``serve --workers``, whose workers
    judge it)."""

    def __init__(self, app, read_timeout_s: float = settings.default("read_timeout_s"),
                 total_s: float = settings.default("body_timeout_s"), parse: bool = True):
        self.app = app
        self.read_timeout_s, self.total_s = read_timeout_s, total_s
        self.parse = parse

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        n = dict(scope["headers"]).get(b"content-length")
        if n is not None and (not n.isdigit() or int(n) > MAX_BODY):
            return await refuse(scope, send, 413, f"request body over {MAX_BODY} bytes")
        body, more = b"", True
        deadline = time.monotonic() + self.total_s
        while more:
            try:  # a client that declares more than it sends, or sends it a byte at a time, must not hold on
                message = await asyncio.wait_for(receive(), min(self.read_timeout_s, deadline - time.monotonic()))
            except TimeoutError:
                return await refuse(scope, send, 408, self.too_slow(deadline), headers={"Connection": "close"})
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY:
                return await refuse(scope, send, 413, f"request body over {MAX_BODY} bytes")
        if body and self.parse:
            try:  # the routes parse it again (the standard json, which then holds it as sent)
                parse_json(body)
            except BodyError as e:
                return await refuse(scope, send, 400, e.message, e.param)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: disconnects, for streaming responses

        await self.app(scope, replay, send)

    def too_slow(self, deadline: float) -> str:
        if time.monotonic() >= deadline:
            return f"the request body did not arrive within {self.total_s:g} s"
        return f"the request body stopped arriving for {self.read_timeout_s:g} s"
