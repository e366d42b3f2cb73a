"""The front of ``serve --workers N``: one address for every learner, each request passed to
the worker that should answer it (``workers.py``), its answer passed back as it comes.

- ``POST /api/texts`` (open or reopen a text) goes to the worker holding the fewest texts; the
  front remembers which worker the new text is on, and every request for it
  (``/api/texts/{id}/...``) goes there. A text whose worker died (or one the front never saw)
  is answered ``404 text_not_found``, as any server answers a text it does not hold: the page
  reopens it from its token ids (docs/deploy.md);
- ``GET /api/status`` adds up every answering worker's, and says how many answered; so does
  ``GET /metrics`` (``probes.summed``: each sample added up), each worker given PROBE_S;
  ``GET /ready`` is ready when a worker is, answered at once from what the front knows
  (``watch.py``: a worker that stops answering is left out, then killed and started again),
  and ``GET /health`` is the front's own;
- anything else (``/v1``, the views, the notebook, the page's files) goes to the next
  answering worker in turn, and to another if that one can't be reached.

No wait on a worker is unbounded: a forwarded request's answer must keep coming (each piece
within the request's time limit, ``--max-request-seconds``, and a grace), a text opens within
OPEN_S. A stream cut by its worker's death ends with its documented last event (the page's
``error``; on /v1 an error and ``[DONE]``), and the front logs one line.

The front passes requests on as they came (method, path, headers with the client's Host and
Origin, body), so each worker's checks (the cross-site refusals, the hosts it trusts, its
bounds) judge the client's request itself; the front bounds a body's size and its arrival
(``body_limit.BoundedBody``) before it reads one. A client that goes away closes its
request to the worker, which ends the generation as it does for a client of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections import OrderedDict
from collections.abc import AsyncIterator

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from puffergpt.server.errors import error
from puffergpt.server.guards.body_limit import BoundedBody
from puffergpt.server.guards.connections import uvicorn_config
from puffergpt.server.processes.watch import Watch
from puffergpt.server.processes.workers import Pool
from puffergpt.server.state import ServerConfig
from puffergpt.server.streaming import Ending, sse
from puffergpt.texts.text import log

TEXT = re.compile(r"^/api/texts/([^/]+)")
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
       "transfer-encoding", "upgrade", "content-length"}  # per connection, never passed on
SUMMED = ("running", "queued", "max_running", "open_texts", "max_open_texts")
OPEN_S = 60.0  # opening a text: a prompt tokenized, its namespace taken
PROBE_S = 2.0  # a worker's /api/status or /metrics
UNLIMITED_S = 3600.0  # a forwarded answer's pieces, where the server sets no --max-request-seconds
GRACE_S = 30.0  # beyond a request's time limit: its worker's last events, a queue's wait
LOST = Ending(503, "the worker process serving this request stopped: open the text again from its token ids "
                   "(the page does) and ask again", "server_error", "worker_lost")


class Front:
    """Where each request goes: the texts' workers (``texts``: id -> (worker, its generation),
    the most recent ``keep``), and the next answering worker in turn for anything else."""

    def __init__(self, pool: Pool, max_request_s: float | None = None, keep: int = 4096):
        self.pool, self.keep = pool, keep
        self.texts: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.opening = [0] * pool.n  # texts being opened on each worker, not yet answered
        self._turn = itertools.count()
        read_s = max_request_s + GRACE_S if max_request_s else UNLIMITED_S
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(connect=5.0, read=read_s, write=60.0, pool=10.0),
                                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        self.watch = Watch(pool, self.client)

    def holder(self, text_id: str) -> int | None:
        """The worker that holds a text, None if the text is not known or its worker died since."""
        got = self.texts.get(text_id)
        if got is None or self.pool.generation[got[0]] != got[1] or self.pool.url(got[0]) is None:
            return None
        return got[0]

    def remember(self, text_id: str, worker: int) -> None:
        self.texts[text_id] = (worker, self.pool.generation[worker])
        self.texts.move_to_end(text_id)
        while len(self.texts) > self.keep:
            self.texts.popitem(last=False)

    def fewest_texts(self) -> list[int]:
        """The answering workers, the one holding (or opening) the fewest texts first; among
        equals, the next in turn, so that texts opened one after another spread out too."""
        held = list(self.opening)
        for i, gen in self.texts.values():
            held[i] += self.pool.generation[i] == gen
        return sorted(self.in_turn(), key=lambda i: held[i])

    def in_turn(self) -> list[int]:
        """The answering workers, starting at the next in turn."""
        alive = self.watch.answering()
        if not alive:
            return []
        k = next(self._turn) % len(alive)
        return alive[k:] + alive[:k]


def not_held(text_id: str) -> JSONResponse:
    """What a worker answers for a text it does not hold (``errors.text_not_found``)."""
    return error(404, f"no open text {text_id!r} on this server (it may have restarted): reopen it from its token ids",
                 code="text_not_found")


def unavailable(why: str) -> JSONResponse:
    return error(503, f"no worker could answer ({why}): try again in a moment")


def too_slow(e: httpx.TimeoutException) -> JSONResponse:
    return error(504, f"the worker did not answer in time ({type(e).__name__}): try again in a moment",
                 kind="server_error", code="worker_timeout")


def host_of(request: Request) -> dict:
    """The client's Host, passed on to a worker (which judges it); none sent, none passed."""
    host = request.headers.get("host")
    return {"host": host} if host else {}


async def send(front: Front, worker: int, request: Request, body: bytes, timeout=None) -> httpx.Response:
    base = front.pool.url(worker)
    if base is None:  # it died, or is starting again
        raise httpx.ConnectError(f"worker {worker} is not running")
    url = httpx.URL(base, path=request.url.path, query=request.url.query.encode())
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
    req = front.client.build_request(request.method, url, headers=headers, content=body,
                                     timeout=timeout or httpx.USE_CLIENT_DEFAULT)
    return await front.client.send(req, stream=True)


def passed_back(r: httpx.Response, path: str) -> StreamingResponse:
    """The worker's answer, streamed back as it comes; the request to the worker closed when
    the client's is (a generation ends when its learner goes)."""
    headers = {k: v for k, v in r.headers.items() if k.lower() not in HOP}
    events = r.headers.get("content-type", "").startswith("text/event-stream")
    return StreamingResponse(relayed(r, path, events), status_code=r.status_code, headers=headers,
                             background=BackgroundTask(r.aclose))


async def relayed(r: httpx.Response, path: str, events: bool) -> AsyncIterator[bytes]:
    """The worker's bytes; server-sent events passed on whole (a piece of one held until its
    end), so that a stream its worker's death cuts ends with a whole last event of its own."""
    held = b""
    try:
        async for piece in r.aiter_raw():
            if not events:
                yield piece
                continue
            held += piece
            if (cut := held.rfind(b"\n\n") + 2) >= 2:
                yield held[:cut]
                held = held[cut:]
    except httpx.HTTPError as e:  # the worker died, or stopped answering, mid-answer
        log.warning("the worker answering %s stopped mid-answer (%s): %s", path, type(e).__name__,
                    "its stream ended with an error event" if events else "the answer was cut")
        if events:
            yield last_words(path).encode()
        return
    if held:
        yield held


def last_words(path: str) -> str:
    """A cut stream's documented last events: on /v1 an error and ``[DONE]``, else ``error``."""
    if path.startswith("/v1/"):
        from puffergpt.server.openai.render import farewell

        return farewell(LOST)
    return sse("error", {"detail": LOST.message, "code": LOST.code})


async def forward(request: Request) -> Response:
    front: Front = request.app.state.front
    path, body = request.url.path, await request.body()
    if (m := TEXT.match(path)) is not None:
        return await to_holder(front, request, body, m.group(1), m.group(0))
    if request.method == "POST" and path.rstrip("/") == "/api/texts":
        return await opened(front, request, body)
    for worker in front.in_turn()[:2]:  # one more try on another worker if the first can't be reached
        try:
            return passed_back(await send(front, worker, request, body), path)
        except (httpx.ConnectError, httpx.ConnectTimeout):  # nothing was sent: another may answer
            continue
        except httpx.TimeoutException as e:
            return too_slow(e)
        except httpx.TransportError:
            return unavailable("the worker stopped while answering")
    return unavailable("no worker is running" if not front.pool.alive() else "the workers could not be reached")


async def to_holder(front: Front, request: Request, body: bytes, text_id: str, text_path: str) -> Response:
    """A request for a text, to the worker that holds it."""
    worker = front.holder(text_id)
    if worker is None:
        return not_held(text_id)
    try:
        r = await send(front, worker, request, body)
    except httpx.TimeoutException as e:
        return too_slow(e)
    except httpx.TransportError:  # it died just now: its texts are gone with it
        return not_held(text_id)
    if request.method == "DELETE" and request.url.path.rstrip("/") == text_path and r.status_code < 300:
        front.texts.pop(text_id, None)  # closed: it no longer counts against its worker
    return passed_back(r, request.url.path)


async def opened(front: Front, request: Request, body: bytes) -> Response:
    """Open (or reopen) a text on the worker holding the fewest, and remember where it is."""
    for worker in front.fewest_texts()[:2]:
        front.opening[worker] += 1  # counted at once: texts opened together go to different workers
        try:
            r = await send(front, worker, request, body, timeout=OPEN_S)
            content = await r.aread()
            await r.aclose()
        except httpx.TransportError:  # a worker that can't open it now: the next may
            continue
        finally:
            front.opening[worker] -= 1
        if r.status_code == 201:
            front.remember(r.json()["id"], worker)
        headers = {k: v for k, v in r.headers.items() if k.lower() not in HOP}
        return Response(content, status_code=r.status_code, headers=headers)
    return unavailable("the workers could not be reached")


async def each_worker(request: Request, path: str) -> list[httpx.Response]:
    """GET ``path`` of every answering worker, with the client's Host, within PROBE_S: the
    answers of those that gave one."""
    front: Front = request.app.state.front

    async def one(i: int) -> httpx.Response | None:
        with contextlib.suppress(httpx.HTTPError, TypeError):
            return await front.client.get(f"{front.pool.url(i)}{path}", headers=host_of(request), timeout=PROBE_S)
        return None

    return [r for r in await asyncio.gather(*(one(i) for i in front.watch.answering())) if r is not None]


async def status(request: Request) -> Response:
    """Every answering worker's /api/status added up; ``workers``: how many answered."""
    got = []
    for r in await each_worker(request, "/api/status"):
        with contextlib.suppress(ValueError):
            got += [r.json()] if r.status_code == 200 else []
    if not got:
        return unavailable("no worker answered")
    out = {k: sum(s[k] for s in got) for k in SUMMED}
    out["searches"] = {k: sum(s["searches"][k] for s in got) for k in got[0]["searches"]}
    out["workers"] = len(got)
    return JSONResponse(out)


async def metrics(request: Request) -> Response:
    """Every answering worker's /metrics added up (``probes.summed``)."""
    from prometheus_client import CONTENT_TYPE_LATEST

    from puffergpt.server.processes.probes import summed

    got = [r.text for r in await each_worker(request, "/metrics") if r.status_code == 200]
    if not got:
        return unavailable("no worker answered")
    return Response(summed(got), media_type=CONTENT_TYPE_LATEST)


async def ready(request: Request) -> Response:
    """Ready when a worker is: ``workers`` ready of ``of``; else why not. Answered at once from
    the workers' last answers (``watch.py``), never waiting on one."""
    front: Front = request.app.state.front
    n, why = front.watch.ready()
    if n:
        return JSONResponse({"status": "ready", "workers": n, "of": front.pool.n})
    return JSONResponse({"status": "unavailable", "reason": why}, status_code=503)


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def create_front(pool: Pool, config: ServerConfig) -> Starlette:
    """The front's app over a started pool of workers, bounded as a worker is (``config``: the
    workers'); its watch runs while it serves."""
    front = Front(pool, config.max_request_s)

    @contextlib.asynccontextmanager
    async def watching(app):
        task = asyncio.create_task(front.watch.run())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    app = Starlette(routes=[Route("/api/status", status, methods=["GET"]), Route("/metrics", metrics, methods=["GET"]),
                            Route("/ready", ready, methods=["GET"]), Route("/health", health, methods=["GET"]),
                            Route("/{path:path}", forward, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE",
                                                                      "OPTIONS"])], lifespan=watching)
    app.state.front, app.state.config = front, config
    app.add_middleware(BoundedBody, read_timeout_s=config.read_timeout_s, total_s=config.body_timeout_s,
                       parse=False)  # the workers parse it
    return app


def front_server(app: Starlette, pool: Pool, host: str, port: int):
    """A uvicorn server for the front whose shutdown first asks every worker to end (each ends
    its open requests with their final word, which the front passes on), then waits for them."""
    import uvicorn

    from puffergpt.server.app import GRACE_S

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            pool.terminate()
            await super().shutdown(sockets)
            await app.state.front.client.aclose()

    config = app.state.config
    return Server(uvicorn_config(app, host, port, config.header_timeout_s, config.max_connections,
                                 timeout_graceful_shutdown=GRACE_S + 1))
