"""Bounds on a connection, before any request reaches the app: uvicorn's HTTP/1.1 protocol
(h11) with what it does not bound itself.

- a request's line and headers arrive within ``header_timeout_s`` in all (uvicorn bounds only
  the wait between requests, ``timeout_keep_alive``, and a byte every few seconds would hold a
  connection for ever): else a 408, and the connection closed;
- they are at most MAX_HEAD bytes: else a 431 (h11 reports it; uvicorn would answer 400), read
  to its end for LINGER_S so that the client reads the answer and not a reset;
- at most ``max_connections`` open at once: one more is answered 503 and closed at once.

The body's bounds are ``body_limit.BoundedBody``'s. ``uvicorn_config`` is every server's:
one process's (``app.server``), a worker's and the front's (``front.front_server``).
"""

from __future__ import annotations

import asyncio
import json
from http import HTTPStatus

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEAD = 64 * 1024  # bytes of a request's line and headers
LINGER_S = 2.0  # a refused request read on (and dropped) for this long before its connection closes
KEEP_ALIVE_S = 5.0  # an idle connection between requests


class Guarded(H11Protocol):
    """uvicorn's h11 protocol, with a total deadline on the head, a 431 and a connection cap."""

    header_s: float = 10.0
    max_connections: int = 1024

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._hint: int | None = None
        self._refused = False
        next_event = self.conn.next_event

        def noted():  # h11's hint (431: head too long) kept for send_400_response
            try:
                return next_event()
            except h11.RemoteProtocolError as e:
                self._hint = e.error_status_hint
                raise

        self.conn.next_event = noted

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            return self._refuse(503, f"over {self.max_connections} connections are open (puffergpt serve "
                                     "--max-connections): try again in a moment", "too_many_connections")
        self._arm()

    def connection_lost(self, exc) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # read and dropped: the client finishes sending, then reads its answer
            return
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._disarm()  # the head arrived: the body's bounds are the app's

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's head, from now

    def send_400_response(self, msg: str) -> None:
        if self._hint == 431:
            return self._refuse(431, f"the request's line and headers are over {MAX_HEAD} bytes",
                                "headers_too_large")
        super().send_400_response(msg)

    def _arm(self) -> None:
        self._disarm()
        if self.conn.their_state is h11.IDLE:
            self._deadline = self.loop.call_later(self.header_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._refuse(408, f"the request's headers did not arrive within {self.header_s:g} s", "request_timeout")

    def _refuse(self, status: int, message: str, code: str) -> None:
        """Answer ``status`` (OpenAI's error shape, as the app's refusals) and close: at once,
        or after LINGER_S for a client still sending much (a 431), lest the close reset it."""
        self._disarm()
        self._refused = True
        body = json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                     "code": code}}).encode()
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
        self.transport.write(head.encode() + body)
        if status == 431:
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()  # after what was written


def uvicorn_config(app, host: str, port: int, header_s: float, max_connections: int, **kwargs) -> uvicorn.Config:
    """A uvicorn config whose connections are ``Guarded`` with these bounds."""
    protocol = type("Guarded", (Guarded,), {"header_s": header_s, "max_connections": max_connections})
    # uvicorn's own cap one above ours: ours answers first, and at once
    return uvicorn.Config(app, host=host, port=port, log_level="warning", http=protocol,
                          h11_max_incomplete_event_size=MAX_HEAD, limit_concurrency=max_connections + 1,
                          timeout_keep_alive=KEEP_ALIVE_S, **kwargs)
