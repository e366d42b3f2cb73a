"""The front of ``serve --workers N``: one address for every learner, each request passed to
the worker that should answer it (``workers.py``), its answer passed back as it comes.

- ``POST /api/texts`` (open or reopen a text) goes to the worker holding the fewest texts; the
  front remembers which worker the new text is on, and every request for it
  (``/api/texts/{id}/...``) goes there. A text whose worker died (or one the front never saw)
  is answered ``404 text_not_found``, as any server answers a text it does not hold: the page
  reopens it from its token ids (docs/deploy.md);
- ``GET /api/status`` adds up every worker's, and says how many workers answer; so does
  ``GET /metrics`` (``probes.summed``: each sample added up); ``GET /ready`` is ready when a
  worker is, and ``GET /health`` is the front's own;
- anything else (``/v1``, the views, the notebook, the page's files) goes to the next worker
  in turn, and to another if that one can't be reached.

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

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from puffergpt import settings
from puffergpt.server.errors import error
from puffergpt.server.guards.body_limit import BoundedBody
from puffergpt.server.processes.workers import Pool

TEXT = re.compile(r"^/api/texts/([^/]+)")
HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
       "transfer-encoding", "upgrade", "content-length"}  # per connection, never passed on
SUMMED = ("running", "queued", "max_running", "open_texts", "max_open_texts")
TIMEOUT = httpx.Timeout(connect=5.0, read=None, write=60.0, pool=None)  # a stream may wait its turn long


class Front:
    """Where each request goes: the texts' workers (``texts``: id -> (worker, its generation),
    the most recent ``keep``), and the next worker in turn for anything else."""

    def __init__(self, pool: Pool, keep: int = 4096):
        self.pool, self.keep = pool, keep
        self.texts: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.opening = [0] * pool.n  # texts being opened on each worker, not yet answered
        self._turn = itertools.count()
        self.client = httpx.AsyncClient(timeout=TIMEOUT, limits=httpx.Limits(max_connections=None,
                                                                            max_keepalive_connections=256))

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
        """The live workers, the one holding (or opening) the fewest texts first; among equals,
        the next in turn, so that texts opened one after another spread out too."""
        held = list(self.opening)
        for i, gen in self.texts.values():
            held[i] += self.pool.generation[i] == gen
        return sorted(self.in_turn(), key=lambda i: held[i])

    def in_turn(self) -> list[int]:
        """The live workers, starting at the next in turn."""
        alive = self.pool.alive()
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


async def send(front: Front, worker: int, request: Request, body: bytes) -> httpx.Response:
    base = front.pool.url(worker)
    if base is None:  # it died, or is starting again
        raise httpx.ConnectError(f"worker {worker} is not running")
    url = httpx.URL(base, path=request.url.path, query=request.url.query.encode())
    headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP]
    req = front.client.build_request(request.method, url, headers=headers, content=body)
    return await front.client.send(req, stream=True)


def passed_back(r: httpx.Response) -> StreamingResponse:
    """The worker's answer, streamed back as it comes; the request to the worker closed when
    the client's is (a generation ends when its learner goes)."""
    headers = {k: v for k, v in r.headers.items() if k.lower() not in HOP}
    return StreamingResponse(r.aiter_raw(), status_code=r.status_code, headers=headers,
                             background=BackgroundTask(r.aclose))


async def forward(request: Request) -> Response:
    front: Front = request.app.state.front
    path, body = request.url.path, await request.body()
    if (m := TEXT.match(path)) is not None:
        worker = front.holder(m.group(1))
        if worker is None:
            return not_held(m.group(1))
        try:
            r = await send(front, worker, request, body)
        except httpx.TransportError:  # it died just now: its texts are gone with it
            return not_held(m.group(1))
        if request.method == "DELETE" and path.rstrip("/") == m.group(0) and r.status_code < 300:
            front.texts.pop(m.group(1), None)  # closed: it no longer counts against its worker
        return passed_back(r)
    if request.method == "POST" and path.rstrip("/") == "/api/texts":
        return await opened(front, request, body)
    for worker in front.in_turn()[:2]:  # one more try on another worker if the first can't be reached
        try:
            return passed_back(await send(front, worker, request, body))
        except httpx.TransportError:
            continue
    return unavailable("no worker is running" if not front.pool.alive() else "the workers could not be reached")


async def opened(front: Front, request: Request, body: bytes) -> Response:
    """Open (or reopen) a text on the worker holding the fewest, and remember where it is."""
    for worker in front.fewest_texts()[:2]:
        front.opening[worker] += 1  # counted at once: texts opened together go to different workers
        try:
            r = await send(front, worker, request, body)
            content = await r.aread()
            await r.aclose()
        except httpx.TransportError:
            continue
        finally:
            front.opening[worker] -= 1
        if r.status_code == 201:
            front.remember(r.json()["id"], worker)
        headers = {k: v for k, v in r.headers.items() if k.lower() not in HOP}
        return Response(content, status_code=r.status_code, headers=headers)
    return unavailable("the workers could not be reached")


async def status(request: Request) -> Response:
    """Every worker's /api/status added up; ``workers``: how many answered."""
    front: Front = request.app.state.front

    async def one(i: int) -> dict | None:
        try:
            r = await front.client.get(f"{front.pool.url(i)}/api/status", headers={"host": request.headers["host"]})
            return r.json() if r.status_code == 200 else None
        except (httpx.TransportError, ValueError):
            return None

    got = [s for s in await asyncio.gather(*(one(i) for i in front.pool.alive())) if s is not None]
    if not got:
        return unavailable("no worker answered")
    out = {k: sum(s[k] for s in got) for k in SUMMED}
    out["searches"] = {k: sum(s["searches"][k] for s in got) for k in got[0]["searches"]}
    out["workers"] = len(got)
    return JSONResponse(out)


async def each_worker(request: Request, path: str) -> list[httpx.Response | None]:
    """GET ``path`` of every live worker, with the client's Host; None where one did not answer."""
    front: Front = request.app.state.front

    async def one(i: int) -> httpx.Response | None:
        try:
            return await front.client.get(f"{front.pool.url(i)}{path}", headers={"host": request.headers["host"]})
        except httpx.TransportError:
            return None

    return list(await asyncio.gather(*(one(i) for i in front.pool.alive())))


async def metrics(request: Request) -> Response:
    """Every worker's /metrics added up (``probes.summed``)."""
    from prometheus_client import CONTENT_TYPE_LATEST

    from puffergpt.server.processes.probes import summed

    got = [r.text for r in await each_worker(request, "/metrics") if r is not None and r.status_code == 200]
    if not got:
        return unavailable("no worker answered")
    return Response(summed(got), media_type=CONTENT_TYPE_LATEST)


async def ready(request: Request) -> Response:
    """Ready when a worker is: ``workers`` ready of ``of``; else the first worker's reason."""
    got = await each_worker(request, "/ready")
    n = sum(r is not None and r.status_code == 200 for r in got)
    if n:
        return JSONResponse({"status": "ready", "workers": n, "of": request.app.state.front.pool.n})
    why = "no worker answered"
    for r in got:
        if r is not None and r.status_code == 503:
            with contextlib.suppress(ValueError, AttributeError):
                why = str(r.json()["reason"])
                break
    return JSONResponse({"status": "unavailable", "reason": why}, status_code=503)


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def create_front(pool: Pool, read_timeout_s: float = settings.default("read_timeout_s")) -> Starlette:
    """The front's app over a started pool of workers."""
    app = Starlette(routes=[Route("/api/status", status, methods=["GET"]), Route("/metrics", metrics, methods=["GET"]),
                            Route("/ready", ready, methods=["GET"]), Route("/health", health, methods=["GET"]),
                            Route("/{path:path}", forward, methods=["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE",
                                                                      "OPTIONS"])])
    app.state.front = Front(pool)
    app.add_middleware(BoundedBody, read_timeout_s=read_timeout_s, parse=False)  # the workers parse it
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

    return Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                 timeout_graceful_shutdown=GRACE_S + 1))
