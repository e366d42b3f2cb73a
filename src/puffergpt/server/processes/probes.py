"""What a load balancer, an orchestrator and Prometheus ask a server:

- ``GET /health``: liveness, the process answers: 200 ``{"status": "ok"}``;
- ``GET /ready``: readiness: the store answers a search of one row of the model
  (``Engine.probe``) and still holds the manifest this server opened, complete and current
  (``manifest.read_manifest``; ``serve`` checked the documents against it when it started):
  200 ``{"status": "ready"}``, else 503 ``{"status": "unavailable", "reason": ...}``. Always
  within about READY_S, however busy the process (``Ready``): one probe at a time, on a thread
  of its own (never the pool the generations' work queues on); one slower than that leaves
  the answer to the last probe, if it was within RECENT_S (a balancer's check under load);
- ``GET /metrics``: Prometheus' text format, from the maintained ``prometheus_client``, in a
  registry of the app's own: HTTP requests answered (method, route, status: a refusal before
  routing, a 401 or 403, under the route it was refused from), tokens the generations wrote,
  the prompt tokens they read and the generated tokens by route, the time to a generation's
  first token and between its tokens (histograms, by route), requests to the store (op,
  outcome) and their seconds (a histogram), texts running, queued and open, the texts'
  searches asked and merged, the texts whose keys' lease renewals are failing
  (``sweeper.Keeper``); the served model in a ``model`` label on the generation's figures
  and ``puffergpt_model_info``. No ``*_created`` samples (a start time each, which a dashboard
  never plots: ``disable_created_metrics``). Behind ``serve --workers N`` the front adds the
  workers' up (``front.py``). ``docs/grafana-dashboard.json`` plots them.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel
from starlette.routing import Match

from puffergpt.model.info import model_name
from puffergpt.search import manifest
from puffergpt.search.engine import Engine
from puffergpt.server.state import ServedDep
from puffergpt.texts.registry import Texts

READY_S = 1.0  # /ready waits this long for a probe of the store: a balancer's check (2 s, say) must not time out
RECENT_S = 10.0  # past READY_S, a probe that said ready this recently still does: the store is busy, not down
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# a first token reads the whole prompt (a prefill) and may wait its turn; the next ones cost a decode each
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)
disable_created_metrics()  # process-wide: no family's *_created sample, here or in a worker

router = APIRouter(tags=["probes"])


class EngineCollector:
    """The engine's figures, read when Prometheus scrapes."""

    def __init__(self, engine: Engine, texts: Texts):
        self.engine, self.texts = engine, texts
        self.model = model_name(engine.model)

    def collect(self):
        s = self.engine.status()
        info = GaugeMetricFamily("puffergpt_model_info", "the model this server serves (always 1)", labels=["model"])
        info.add_metric([self.model], 1)
        yield info
        tokens = CounterMetricFamily("puffergpt_tokens_generated", "tokens the generations wrote (the page, /v1)",
                                     labels=["model"])
        tokens.add_metric([self.model], self.engine.scheduler.tokens)
        yield tokens
        yield GaugeMetricFamily("puffergpt_texts_running", "texts generating now", value=s["running"])
        yield GaugeMetricFamily("puffergpt_texts_queued", "texts waiting their turn to generate", value=s["queued"])
        yield GaugeMetricFamily("puffergpt_texts_open", "texts open on this server", value=len(self.texts))
        yield GaugeMetricFamily("puffergpt_text_leases_failing", "texts held now whose keys' last lease renewal "
                                "failed (retried; the text expires if it keeps failing)",
                                value=self.engine.keeper.failing())
        yield CounterMetricFamily("puffergpt_text_searches", "searches the texts asked (several may share one "
                                                             "store request)", value=s["searches"]["asks"])
        yield CounterMetricFamily("puffergpt_text_searches_merged", "searches answered by a store request shared "
                                                                    "with another text", value=s["searches"]["merged"])


class Metrics:
    """One app's metrics, in a registry of its own (one process may build many apps)."""

    def __init__(self, engine: Engine, texts: Texts):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("puffergpt_http_requests", "HTTP requests answered", ["method", "route", "status"],
                                registry=r)
        self.store_requests = Counter("puffergpt_store_requests", "requests to the store (search, fetch, upsert, "
                                                                  "...)", ["op", "outcome"], registry=r)
        self.store_seconds = Histogram("puffergpt_store_request_seconds", "seconds a request to the store took",
                                       ["op"], buckets=STORE_BUCKETS, registry=r)
        self.model = model_name(engine.model)
        by = ["model", "route"]
        self.first_token = Histogram("puffergpt_time_to_first_token_seconds", "seconds from a generation's start "
                                     "(its prompt unread, its turn not yet come) to its first token", by,
                                     buckets=FIRST_TOKEN_BUCKETS, registry=r)
        self.between_tokens = Histogram("puffergpt_time_between_tokens_seconds", "seconds between a generation's "
                                        "consecutive tokens", by, buckets=TOKEN_BUCKETS, registry=r)
        self.prompt_tokens = Counter("puffergpt_prompt_tokens", "prompt tokens the generations read", by, registry=r)
        self.generation_tokens = Counter("puffergpt_generation_tokens", "tokens the generations wrote", by,
                                         registry=r)
        r.register(EngineCollector(engine, texts))
        engine.store.watch(self.stored)  # held weakly: this app's metrics, while it lives

    def stored(self, op: str, seconds: float, ok: bool) -> None:
        self.store_requests.labels(op, "ok" if ok else "error").inc()
        self.store_seconds.labels(op).observe(seconds)

    def text(self) -> bytes:
        return generate_latest(self.registry)

    def clock(self, route: str) -> Clock:
        return Clock(self, route)


class Clock:
    """One generation's tokens timed and counted, from its start (now): ``prompt(n)`` when it
    reads n prompt tokens, ``tick()`` as each token is written."""

    def __init__(self, metrics: Metrics, route: str):
        self.metrics, self.labels = metrics, (metrics.model, route)
        self.last: float | None = None
        self.start = time.perf_counter()

    def prompt(self, n: int) -> None:
        self.metrics.prompt_tokens.labels(*self.labels).inc(n)

    def step(self, step) -> None:
        """A step of a generation (``completion.complete``'s ``on_step``): a written token ticks; an echoed
        prompt token (phase "prompt", scored, not written) does not."""
        if step.phase != "prompt":
            self.tick()

    def tick(self) -> None:
        now = time.perf_counter()
        m = self.metrics
        (m.first_token if self.last is None else m.between_tokens).labels(*self.labels).observe(
            now - (self.start if self.last is None else self.last))
        m.generation_tokens.labels(*self.labels).inc()
        self.last = now


class Counted:
    """Count each request once its answer starts, by method, route (the path's template:
    bounded, never the path itself) and status. Outermost: refusals count too."""

    def __init__(self, app, metrics: Metrics, routes: Callable[[], list] = list):
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counted(message):
            if message["type"] == "http.response.start":
                route = getattr(scope.get("route"), "path", None) or self.route_of(scope)
                self.metrics.requests.labels(scope["method"], route, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counted)

    def route_of(self, scope) -> str:
        """The route a request refused before routing (a 401, a 403, a 400 for its Host) was for,
        matched as the router would match it; "unrouted" where none would take it."""
        for wanted in (Match.FULL, Match.PARTIAL):  # as the router: a full match first, then one of another method
            for route in self.routes():
                if hasattr(route, "matches") and route.matches(scope)[0] == wanted:
                    return getattr(route, "path", None) or "unrouted"
        return "unrouted"


@router.get("/health", operation_id="health", summary="Liveness: the process answers")
def health() -> dict:
    """Liveness: the process answers."""
    return {"status": "ok"}


def readiness(engine: Engine) -> str | None:
    """Why the server can't serve now, or None."""
    try:
        stored = manifest.read_manifest(engine.store, engine.key, engine.model)
        if stored.get("matrices") != engine.manifest.get("matrices"):
            return "the store holds another load of the model than this server opened: restart the server"
        engine.probe()
    except Exception as e:  # a probe reports any failure as not ready, with the reason
        return f"the store did not answer: {e}"[:500]
    return None


class Readiness(BaseModel):
    """A readiness probe's answer: "ready", or "unavailable" and why (not an error: a status)."""

    status: str
    reason: str | None = None


READY_RESPONSES = {200: {"model": Readiness, "description": '`{"status": "ready"}`'},
                   503: {"model": Readiness, "description": '`{"status": "unavailable", "reason": "..."}`: the store '
                                                             'failed, or no longer holds the model served'}}


class Ready:
    """An app's readiness probes: one at a time, each on a thread of its own; callers meanwhile
    share it. ``answer``: why not ready (None: ready), within READY_S."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._lock = threading.Lock()
        self._probe: Future | None = None
        self.last: tuple[float, str | None] | None = None  # (monotonic time, why) of the last probe done

    def _started(self) -> Future:
        with self._lock:
            if self._probe is None or self._probe.done():
                self._probe = f = Future()
                threading.Thread(target=self._run, args=(f,), name="puffergpt-ready", daemon=True).start()
            return self._probe

    def _run(self, f: Future) -> None:
        why = "the readiness probe failed"
        try:
            why = readiness(self.engine)
        finally:
            self.last = (time.monotonic(), why)
            f.set_result(why)

    async def answer(self) -> str | None:
        probe = asyncio.wrap_future(self._started())
        done, _ = await asyncio.wait({probe}, timeout=READY_S)  # never cancels the probe: the next call shares it
        if done:
            return probe.result()
        if self.last is not None and self.last[1] is None and time.monotonic() - self.last[0] < RECENT_S:
            return None  # busy, not down: it answered a moment ago
        return f"the store did not answer within {READY_S:g} s"


@router.get("/ready", operation_id="ready", summary="Readiness: the store answers a one-row search",
            responses=READY_RESPONSES)
async def ready(served: ServedDep, request: Request) -> JSONResponse:
    """Readiness: the store answers a one-row search, and holds the manifest served."""
    state = request.app.state
    if getattr(state, "readiness", None) is None:
        state.readiness = Ready(served.engine)
    why = await state.readiness.answer()
    if why is not None:
        return JSONResponse({"status": "unavailable", "reason": why}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics", operation_id="metrics", summary="Prometheus metrics (text format)",
            response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}})
def metrics(request: Request) -> Response:
    """Prometheus' text format."""
    return Response(request.app.state.metrics.text(), media_type=CONTENT_TYPE_LATEST)


class Summed:
    """The workers' metrics (``serve --workers N``), each sample added up over the workers
    (counters, histograms' buckets and sums, the texts' gauges alike), and how many answered.
    The ``_created`` samples (a start time each) are left out: a sum of them means nothing."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def collect(self):
        families: dict[str, Metric] = {}
        totals: dict[tuple, float] = {}
        for text in self.texts:
            for f in text_string_to_metric_families(text):
                families.setdefault(f.name, Metric(f.name, f.documentation, f.type))
                for sample in f.samples:
                    if not sample.name.endswith("_created"):
                        key = (f.name, sample.name, tuple(sorted(sample.labels.items())))
                        totals[key] = totals.get(key, 0.0) + sample.value
        for (family, name, labels), value in totals.items():
            families[family].add_sample(name, dict(labels), value)
        yield from (f for f in families.values() if f.samples)  # no family of headers alone
        yield GaugeMetricFamily("puffergpt_workers", "worker processes whose metrics are added up here",
                                value=len(self.texts))


def summed(texts: list[str]) -> bytes:
    """The Prometheus text of several workers' ``/metrics`` texts added up."""
    r = CollectorRegistry()
    r.register(Summed(texts))
    return generate_latest(r)
