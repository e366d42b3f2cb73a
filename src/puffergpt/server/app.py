"""The HTTP server over one loaded model: ``create_app`` builds what the routes share
(``state.Served``: the engine, the open texts, the running generations) and includes a
router per resource. Thin: each route parses, calls the application layer, and renders.

- ``texts_routes.py``: the playground's texts (open, edit, generate, stop, inspect, kv);
- ``views_routes.py``: the embedding views (analogy, neighbours, map) and contexts;
- ``playground/patching.py``: activation patching (server-sent events) and the lessons;
- ``model_routes.py``: the model's description (/api/info) and Compare;
- ``openai.py``: the OpenAI-compatible /v1 routes (bodies in ``openai_bodies.py``);
- ``tokenize_routes.py``: /tokenize, /detokenize and /tokenizer_info, as vLLM has them;
- ``notebook.py``: the notebook of insights, when the server has one;
- ``static_routes.py``: the page, its files and the API's docs;
- ``probes.py``: /health, /ready and /metrics, for balancers and Prometheus;
- ``openapi_doc.py``: ``/openapi.json`` with an absolute server, whole or by tags (an action's);
- ``errors.py``: how errors become responses; ``body_limit.py``: the bound on a body;
  ``cross_site.py``: only this server's page and the origins it allows drive it;
  ``auth.py``: who may (``serve --api-key``, ``--public-read-only``);
- ``streaming.py``: generations in worker threads, streamed or whole, and how they end.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware

from puffergpt import __version__
from puffergpt.model import tokenizer
from puffergpt.model.session import Run
from puffergpt.search import sweeper
from puffergpt.search.engine import Engine
from puffergpt.server import errors, openapi_doc
from puffergpt.server.guards.auth import Auth
from puffergpt.server.guards.body_limit import MAX_BODY, BoundedBody
from puffergpt.server.guards.cross_site import CrossSite
from puffergpt.server.guards.hosts import TrustedHosts
from puffergpt.server.openai import routes as openai
from puffergpt.server.openai import tokenize as tokenize_routes
from puffergpt.server.openapi_doc import add_document
from puffergpt.server.playground import model as model_routes
from puffergpt.server.playground import patching as patching_routes
from puffergpt.server.playground import static as static_routes
from puffergpt.server.playground import texts as texts_routes
from puffergpt.server.playground import views as views_routes
from puffergpt.server.processes import probes
from puffergpt.server.state import Served, ServerConfig
from puffergpt.server.streaming import SHUTDOWN, Generations
from puffergpt.texts.registry import Texts
from puffergpt.texts.text import log

__all__ = ["MAX_BODY", "ServerConfig", "create_app", "run", "server"]

GRACE_S = 2  # on shutdown, a response still open after this is cancelled (each is ended at once: only a
# client that stopped reading keeps one open)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI):
    """Idle texts swept while the server runs, and the key namespaces of any server's texts
    unused past their TTL (``sweeper.py``); on shutdown every generation stopped and every
    text closed (closing a text drops its namespace of keys)."""
    served: Served = app.state.served

    async def sweep():  # idle texts go, with their namespaces, even when no one opens another
        while True:
            await asyncio.sleep(min(60.0, served.config.idle_s))
            try:
                await asyncio.to_thread(served.texts.expire)
            except Exception as e:  # the sweep goes on
                log.warning("sweeping idle texts failed: %s", e)

    keys = sweeper.Sweeper(served.engine.store, served.engine.text_ttl_s, served.engine.clock)
    tasks = [asyncio.create_task(sweep()), asyncio.create_task(sweeper.sweeping(keys))]  # any server's texts
    yield
    for task in tasks:
        task.cancel()
    served.generations.stop_all()  # each ends within a token and closes what it holds
    served.texts.close_all()
    if served.engine.reserve is not None:
        served.engine.reserve.close()


def create_app(engine: Engine, config: ServerConfig | None = None, reference: Callable[[], Run] | None = None,
               notebook=None) -> FastAPI:
    """The app over one loaded model. ``reference`` returns a numpy Run for Compare;
    ``notebook`` (a ``notebook.Notebook``) adds the insight routes."""
    config = config or ServerConfig()
    tokenizer.get_encoding()  # its tables built now (~0.5 s), not in the first learner's request
    served = Served(engine, config, Texts(engine.open, max_open=config.max_open_texts, idle_s=config.idle_s),
                    Generations(), reference)
    app = FastAPI(title="puffergpt", description="GPT-2 where every matrix multiply is a vector search.",
                  version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,  # ours: local assets
                  openapi_url=None, openapi_tags=openapi_doc.TAGS)  # ours: an absolute server (openapi_doc.py)
    add_document(app, config.public_url, bool(config.api_keys))
    app.state.served = served
    app.state.texts, app.state.generations = served.texts, served.generations  # for tests and shutdown
    app.state.metrics = probes.Metrics(engine, served.texts)
    add_middleware(app, config)
    errors.add_handlers(app)
    routers = [static_routes.router, probes.router, model_routes.router, texts_routes.router,
               views_routes.router, patching_routes.router, tokenize_routes.router, openai.router]
    if notebook is not None:
        from puffergpt import notebook as nb
        from puffergpt.server.playground.notebook import notebook_router

        routers.append(notebook_router(notebook, nb.candidates_from_runs(engine.open), model=engine.model,
                                       data_at=nb.data_from_runs(engine.open)))
    for router in routers:
        app.include_router(router)
    app.state.routes = [r for router in routers for r in router.routes]  # what a refusal is counted under
    return app


def add_middleware(app: FastAPI, config: ServerConfig) -> None:
    """Before any route, outermost first: the count of answers (``probes.py``), the Host (no
    DNS rebinding onto a local server: ``hosts.py``), CORS for the ``--cors-origin`` origins
    only (a refusal below still carries its headers, so a page there reads why), no request
    forged by another site and no body but JSON (``cross_site.py``), the API key
    (``auth.py``), then the body's bound."""
    app.add_middleware(BoundedBody, read_timeout_s=config.read_timeout_s, total_s=config.body_timeout_s)
    app.add_middleware(Auth, keys=config.api_keys, read_only=config.public_read_only)
    app.add_middleware(CrossSite, allowed=config.cors_origins)
    if config.cors_origins:  # none: every preflight unanswered, a page elsewhere sends only what CrossSite refuses
        # "*" headers: Content-Type and Authorization (a key, serve --api-key) among them
        app.add_middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                           allow_methods=["GET", "POST", "DELETE"], allow_headers=["*"], max_age=600)
    if config.trusted_hosts:  # a page elsewhere can't drive this API by DNS rebinding (hosts.py)
        app.add_middleware(TrustedHosts, names=config.trusted_hosts)
    # every answer counted, refusals too: under the route they were refused from
    app.add_middleware(probes.Counted, metrics=app.state.metrics, routes=lambda: app.state.routes)


def server(app: FastAPI, host: str, port: int):
    """A uvicorn server for the app whose shutdown first ends every running generation
    (uvicorn alone would wait for them all to finish): each stream's last event says the
    server is shutting down (an ``error``; on /v1 an error and ``[DONE]``), each whole
    answer is a 503 saying so, and each worker ends within a token and closes its text.
    A response still open after GRACE_S (a client that stopped reading) is cancelled."""
    import uvicorn

    from puffergpt.server.guards.connections import uvicorn_config

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.state.generations.end_all(SHUTDOWN)
            await super().shutdown(sockets)

    config = app.state.served.config
    return Server(uvicorn_config(app, host, port, config.header_timeout_s, config.max_connections,
                                 timeout_graceful_shutdown=GRACE_S))


class ServerDidNotStart(RuntimeError):
    pass


@contextlib.contextmanager
def serving(app: FastAPI, host: str = "127.0.0.1", start_s: float = 60.0) -> Iterator[str]:
    """The app served by ``server`` in a thread on a free port of ``host`` (the bench's own
    server, the tests'): its base URL; stopped at the end, running generations first, as
    ``puffergpt serve`` stops. ServerDidNotStart if it did not start within ``start_s``."""
    srv = server(app, host, 0)
    thread = threading.Thread(target=srv.run, name="puffergpt-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_s
    while not srv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            srv.should_exit = True
            raise ServerDidNotStart(f"the server did not start on {host}")
        time.sleep(0.02)
    port = srv.servers[0].sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    try:
        yield f"http://{shown}:{port}"
    finally:
        srv.should_exit = True
        thread.join(30)
        if thread.is_alive():  # a daemon thread: it goes with the process
            log.warning("the server in a thread did not stop within 30 s")


def run(srv, sock: socket.socket | None = None) -> None:
    """Serve until stopped (``srv`` a uvicorn server: ``server``'s, or the front's; ``sock`` a
    socket bound already, a worker's). uvicorn shuts down gracefully on SIGINT and SIGTERM, then
    raises the signal again; a SIGTERM then ends the process as SystemExit (143), not where it
    stands, so the caller's cleanup runs as it does after Ctrl-C (workers stopped, the store closed)."""
    def terminate(signum, frame):
        raise SystemExit(128 + signum)

    main = threading.current_thread() is threading.main_thread()  # only there can a handler be set
    old = signal.signal(signal.SIGTERM, terminate) if main else None
    try:
        srv.run(sockets=[sock] if sock is not None else None)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)
