"""A generation streamed to a client from a worker thread of its own.

The worker creates, drives and closes the generation's iterator (and so its text and
store resources) in one thread: nothing is ever left to the garbage collector, whose
finaliser would take the store's lock from whatever thread it happens to run in. The
response reads the worker's events through a bounded buffer; when the client goes away
(the ASGI ``http.disconnect``, on which Starlette cancels the stream) or the server shuts
down, the generation is cut: its stop event is set and the worker ends within one token,
sending nothing more. A user's Stop (the stop event alone, set by the endpoint) is not a
cut: the generation ends at its next token and its last events (``done``) still go out.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator

from starlette.background import BackgroundTask
from starlette.responses import StreamingResponse

log = logging.getLogger("puffergpt")

BUFFER = 8  # events a worker may run ahead of its client
_END = object()


class Generations:
    """The running generations of one app: shutdown stops them all and waits for them."""

    def __init__(self):
        self._running: dict[int, tuple[threading.Thread, Callable[[], None]]] = {}
        self._lock = threading.Lock()

    def add(self, worker: threading.Thread, cut: Callable[[], None]) -> None:
        with self._lock:
            self._running[id(worker)] = (worker, cut)

    def remove(self, worker: threading.Thread) -> None:
        with self._lock:
            self._running.pop(id(worker), None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._running)

    def stop_all(self, wait_s: float | None = 10.0) -> None:
        """Cut every generation, then wait (bounded; not at all for None) for each worker
        to close its text."""
        with self._lock:
            running = list(self._running.values())
        for _, cut in running:
            cut()
        for worker, _ in running if wait_s is not None else ():
            worker.join(wait_s)
            if worker.is_alive():
                log.warning("a generation did not end within %.0f s of shutdown", wait_s)


def stream(generations: Generations, produce: Callable[[threading.Event], Iterator[str]],
           stop: threading.Event | None = None, on_end: Callable[[], None] | None = None,
           headers: dict | None = None) -> StreamingResponse:
    """Run ``produce(stop)`` in a worker thread and stream what it yields.

    ``produce`` must check ``stop`` between tokens (``should_stop=stop.is_set``) and render
    its own errors as events. ``on_end`` runs in the worker after the iterator is closed
    (e.g. ``text.end``). Call this from the endpoint: the worker starts now, so a client
    that drops before the first byte still has its generation stopped (the background
    task) and ended (by the worker)."""
    stop = stop or threading.Event()
    cut = threading.Event()  # the client left or the server is going: send nothing more

    def cut_now() -> None:
        cut.set()
        stop.set()

    loop = asyncio.get_running_loop() if _in_loop() else _endpoint_loop()
    events: asyncio.Queue = asyncio.Queue()  # bounded by ``room``: the worker waits for it
    room = threading.Semaphore(BUFFER)

    def push(item) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, item)
        except RuntimeError:  # the loop has closed: no one reads any more
            cut_now()

    def work() -> None:
        try:
            it = produce(stop)
            try:
                for item in it:
                    while not room.acquire(timeout=0.1):  # the client reads slower than we write
                        if cut.is_set():
                            return
                    push(item)
                    if cut.is_set():
                        return  # a Stop alone runs on: the generator ends itself and says so (done)
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
        try:
            while (item := await events.get()) is not _END:
                room.release()
                yield item
        finally:  # the end, a disconnect (cancelled) or a failed send
            cut_now()

    worker = threading.Thread(target=work, name="puffergpt-generation", daemon=True)
    generations.add(worker, cut_now)
    worker.start()
    return StreamingResponse(body(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", **(headers or {})},
                             background=BackgroundTask(cut_now))


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
