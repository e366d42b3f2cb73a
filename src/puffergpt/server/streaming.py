"""Generations run for a client in worker threads of their own, streamed or answered whole,
and how the server ends them.

The worker creates, drives and closes the generation's iterator (and so its text and
store resources) in one thread: nothing is ever left to the garbage collector, whose
finaliser would take the store's lock from whatever thread it happens to run in. A
streamed response reads the worker's events through a bounded buffer (``stream``); a
whole one awaits the worker's result (``finished``).

Each is ended by whoever comes first, and the worker stops within one token:
- the client going away (the ASGI ``http.disconnect``): a cut, nothing more is sent;
- the request's time limit (``serve --max-request-seconds``) or the server's shutdown: an
  ``Ending``: a stream's last events say why (its ``farewell``: the page's ``error``
  event; on /v1 an error and ``[DONE]``), a whole answer is ``Ended`` (an error naming it);
- a user's Stop (the stop event alone, set by the endpoint), which is no cut: the
  generation ends at its next token and its last events (``done``) still go out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

log = logging.getLogger("puffergpt")

BUFFER = 8  # events a worker may run ahead of its client
_END = object()
T = TypeVar("T")


@dataclass(frozen=True)
class Ending:
    """Why the server ended a request before its end: the status it answers (a stream's
    went out already: its last event carries it), and what to do, in OpenAI's terms too."""

    status: int
    message: str
    kind: str = "invalid_request_error"
    code: str | None = None


SHUTDOWN = Ending(503, "the server is shutting down: this request was stopped; send it again when the server is back",
                  "server_error", "server_shutting_down")
GONE = Ending(499, "the client went away")  # no one reads it


def sse(event: str, data: dict) -> str:
    """One server-sent event: its name and its JSON."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


def over_limit(limit_s: float) -> Ending:
    return Ending(400, f"the request ran past this server's limit of {limit_s:g} s of work "
                       "(puffergpt serve --max-request-seconds): ask for fewer tokens or prompts a request",
                  code="request_too_long")


class Ended(Exception):
    """A whole answer's request ended by the server (``finished``): errors.py renders it."""

    def __init__(self, ending: Ending):
        super().__init__(ending.message)
        self.ending = ending


class Generations:
    """The running generations of one app, each with how to end it (``end(why)``; None:
    a cut): shutdown ends them all with a reason, then waits for their workers."""

    def __init__(self):
        self._running: dict[int, tuple[threading.Thread, Callable[[Ending | None], None]]] = {}
        self._lock = threading.Lock()

    def add(self, worker: threading.Thread, end: Callable[[Ending | None], None]) -> None:
        with self._lock:
            self._running[id(worker)] = (worker, end)

    def remove(self, worker: threading.Thread) -> None:
        with self._lock:
            self._running.pop(id(worker), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._running)

    def end_all(self, why: Ending | None = None) -> None:
        """End every generation now: each stream's last events, each whole answer, say ``why``."""
        with self._lock:
            running = list(self._running.values())
        for _, end in running:
            end(why)

    def stop_all(self, wait_s: float | None = 10.0) -> None:
        """Cut every generation, then wait (bounded; not at all for None) for each worker
        to close its text."""
        with self._lock:
            running = list(self._running.values())
        for _, end in running:
            end(None)
        for worker, _ in running if wait_s is not None else ():
            worker.join(wait_s)
            if worker.is_alive():
                log.warning("a generation did not end within %.0f s of shutdown", wait_s)


def stream(generations: Generations, produce: Callable[[threading.Event], Iterator[str]],
           stop: threading.Event | None = None, on_end: Callable[[], None] | None = None,
           headers: dict | None = None, farewell: Callable[[Ending], str] | None = None,
           limit_s: float | None = None) -> StreamingResponse:
    """Run ``produce(stop)`` in a worker thread and stream what it yields.

    ``produce`` must check ``stop`` between tokens (``should_stop=stop.is_set``) and render
    its own errors as events. ``on_end`` runs in the worker after the iterator is closed
    (e.g. ``text.end``). ``farewell(why)``: the last events of a stream the server ends
    (``limit_s`` after it starts, or at shutdown). Call this from the endpoint: the worker
    starts now, so a client that drops before the first byte still has its generation
    stopped (the background task) and ended (by the worker)."""
    stop = stop or threading.Event()
    cut = threading.Event()  # the client left or the server ended it: the worker sends nothing more
    loop = asyncio.get_running_loop() if _in_loop() else _endpoint_loop()
    events: asyncio.Queue = asyncio.Queue()  # bounded by ``room``: the worker waits for it
    room = threading.Semaphore(BUFFER)

    def push(item) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, item)
        except RuntimeError:  # the loop has closed: no one reads any more
            end()

    def end(why: Ending | None = None) -> None:
        if why is not None and farewell is not None and not cut.is_set():
            push(farewell(why))  # after what the worker sent already, and the stream's end
            push(_END)
        cut.set()
        stop.set()

    def work() -> None:
        try:
            it = produce(stop)
            try:
                for item in it:
                    while not room.acquire(timeout=0.1):  # the client reads slower than we write
                        if cut.is_set():
                            return
                    if cut.is_set():
                        return  # a Stop alone runs on: the generator ends itself and says so (done)
                    push(item)
            finally:
                it.close()  # here, in the thread that ran it
        except Exception:  # produce renders the errors it expects; anything else is logged
            log.exception("a streamed generation failed")
        finally:
            try:
                if on_end is not None:
                    on_end()
            finally:
                generations.remove(worker)
                push(_END)

    async def body():
        timer = asyncio.get_running_loop().call_later(limit_s, end, over_limit(limit_s)) if limit_s else None
        try:
            while (item := await events.get()) is not _END:
                room.release()
                yield item
        finally:  # the end, a disconnect (cancelled) or a failed send
            if timer is not None:
                timer.cancel()
            end()

    worker = threading.Thread(target=work, name="puffergpt-generation", daemon=True)
    generations.add(worker, end)
    worker.start()
    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", **(headers or {})},
                             background=BackgroundTask(end))


async def finished(generations: Generations, work: Callable[[threading.Event], T], limit_s: float | None = None,
                   receive: Callable | None = None) -> T:
    """``work(stop)``'s result, run in a worker thread of its own that must check ``stop``
    between tokens. Ended (raised at once; the worker stops within a token and closes what
    it holds) when the server shuts down, after ``limit_s``, or when the client goes
    (``receive``: the request's ASGI receive, its body read already)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    stop = threading.Event()

    def settle(result=None, error: BaseException | None = None) -> None:  # in the loop
        if not done.done():
            done.set_exception(error) if error is not None else done.set_result(result)

    def later(*args) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed: no one waits any more
            loop.call_soon_threadsafe(settle, *args)

    def end(why: Ending | None = None) -> None:
        stop.set()
        later(None, Ended(why or GONE))

    def run() -> None:
        try:
            later(work(stop))
        except Exception as e:  # the route's handlers render it (TextError, StoreError, OpenAIError)
            later(None, e)
        finally:
            generations.remove(worker)

    worker = threading.Thread(target=run, name="puffergpt-completion", daemon=True)
    generations.add(worker, end)
    worker.start()
    timer = loop.call_later(limit_s, end, over_limit(limit_s)) if limit_s else None
    watch = asyncio.ensure_future(_gone(receive, end)) if receive is not None else None
    try:
        return await done
    finally:
        stop.set()  # the result is in, or no one will take it
        if timer is not None:
            timer.cancel()
        if watch is not None:
            watch.cancel()


async def _gone(receive: Callable, end: Callable[[], None]) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    end()


def _in_loop() -> bool:
    try:
        asyncio.get_running_loop()
        return True
    except RuntimeError:
        return False


def _endpoint_loop() -> asyncio.AbstractEventLoop:
    """The server's event loop, from a sync endpoint (which FastAPI runs in a worker thread)."""
    from anyio.from_thread import run_sync

    return run_sync(asyncio.get_running_loop)
