"""The HTTP server: the playground's API, an OpenAI-compatible completions endpoint,
and the static page. Thin: it parses, calls a text or the engine, and renders."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import json
import math
import threading
import time
import uuid
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.background import BackgroundTask
from starlette.middleware.trustedhost import TrustedHostMiddleware
from pydantic import BaseModel, ConfigDict, Field

from puffergpt import costs, loading, tokenizer
from puffergpt.engine import Engine, requests_per_token
from puffergpt.sampling import Sampling
from puffergpt.stores.base import StoreError
from puffergpt.checkpoints import CheckpointError
from puffergpt.text import Step, Text, TextBusy, TextError, Texts, log

MAX_BODY = 64 * 1024  # bytes of a request body
MAX_PROMPT_CHARS = 16 * 1024
MAX_NEW_TOKENS = 512
STATIC = Path(str(resources.files("puffergpt") / "static"))
# The pages load nothing from elsewhere and run no inline script.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


@dataclass(frozen=True)
class ServerConfig:
    max_open_texts: int = 32
    idle_s: float = 1800.0
    max_new_tokens: int = MAX_NEW_TOKENS
    trusted_hosts: tuple[str, ...] | None = None  # Host headers accepted; None accepts any


class BoundedBody:
    """Refuse a request body over MAX_BODY bytes, counted as it arrives (chunked bodies
    too): the body is read here, bounded, and handed on whole."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        n = dict(scope["headers"]).get(b"content-length")
        if n is not None and (not n.isdigit() or int(n) > MAX_BODY):
            return await self._refuse(scope, send)
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY:
                return await self._refuse(scope, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: disconnects, for streaming responses

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope, send):
        await JSONResponse({"detail": f"request body over {MAX_BODY} bytes"}, status_code=413)(scope, None, send)


# --- request bodies: strict types, bounded values ---

class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SamplingBody(Strict):
    max_tokens: int = Field(32, ge=0, le=MAX_NEW_TOKENS)
    temperature: float = Field(1.0, ge=0, le=100)
    top_k: int = Field(40, ge=1, le=tokenizer.VOCAB_SIZE)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)


class CreateBody(Strict):
    prompt: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS)


class AppendBody(Strict):
    text: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS)


class PositionBody(Strict):
    position: int


class BranchBody(Strict):
    position: int
    rank: int | None = None
    token_id: int | None = None


class CompareBody(Strict):
    prompt: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS)
    top_k: int = Field(40, ge=1, le=tokenizer.VOCAB_SIZE)


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # OpenAI clients send fields we don't use
    model: str | None = None
    prompt: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS)
    max_tokens: int = Field(16, ge=0, le=MAX_NEW_TOKENS)
    temperature: float = Field(1.0, ge=0, le=100)
    top_k: int = Field(40, ge=1, le=tokenizer.VOCAB_SIZE)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    logprobs: int | None = Field(None, ge=0, le=40)
    stream: bool = False


# --- rendering ---

def request_json(r) -> dict:
    d = r.to_json()
    d["cost_usd"] = r.cost_usd()
    return d


def step_json(step: Step, full: bool = True) -> dict:
    d = {"position": step.position, "token_id": step.token_id, "text": step.text, "phase": step.phase,
         "read": step.read, "ms": round(step.ms, 3), "temperature": step.temperature,
         "requests": len(step.requests), "cost_usd": sum(r.cost_usd() for r in step.requests)}
    if full:
        d["candidates"] = [{"rank": i, **c} for i, c in enumerate(step.candidates())]
        d["probs_t1"] = [c["prob"] for c in step.candidates(1.0)]
        d["request_log"] = [request_json(r) for r in step.requests]
    return d


def text_json(t: Text, full: bool = True) -> dict:
    return {"id": t.id, "length": t.length, "known": len(t.tokens), "read_upto": t.read_upto,
            "tokens": [{"position": i, "token_id": tok, "text": tokenizer.token_text(tok), "generated": i in t.steps,
                        "prob": _chosen_prob(t.steps.get(i))} for i, tok in enumerate(t.tokens)],
            "steps": {str(p): step_json(s, full) for p, s in sorted(t.steps.items())}}


def _chosen_prob(step: Step | None) -> float | None:
    if step is None:
        return None
    probs = dict(zip(map(int, step.ids), (c["prob"] for c in step.candidates())))
    return probs.get(step.token_id, 0.0)


def sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


# --- the app ---

def create_app(engine: Engine, config: ServerConfig = ServerConfig(), reference: Callable | None = None) -> FastAPI:
    """The app over one loaded model. ``reference`` returns a numpy Products for Compare."""
    texts = Texts(engine.open, max_open=config.max_open_texts, idle_s=config.idle_s)
    stops: dict[str, threading.Event] = {}
    comparing = threading.Lock()

    @contextlib.asynccontextmanager
    async def lifespan(_):
        async def sweep():  # idle texts go, with their namespaces, even when no one opens another
            while True:
                await asyncio.sleep(min(60.0, config.idle_s))
                try:
                    await asyncio.to_thread(texts.expire)
                except Exception as e:  # the sweep goes on
                    log.warning("sweeping idle texts failed: %s", e)

        task = asyncio.create_task(sweep())
        yield
        task.cancel()
        texts.close_all()  # closing a text drops its namespace of keys

    app = FastAPI(title="puffergpt", description="GPT-2 where every matrix multiply is a vector search.",
                  version="0.1.0", lifespan=lifespan)
    app.state.texts = texts

    app.add_middleware(BoundedBody)
    if config.trusted_hosts:  # a page elsewhere can't drive this API by DNS rebinding
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(config.trusted_hosts))

    @app.exception_handler(TextError)
    async def text_error(_, e):
        return JSONResponse({"detail": str(e)}, status_code=409 if isinstance(e, TextBusy) else 400)

    @app.exception_handler(CheckpointError)
    async def checkpoint_error(_, e):
        return JSONResponse({"detail": f"the reference checkpoint could not be read: {e}"}, status_code=503)

    @app.exception_handler(StoreError)
    async def store_error(_, e):
        return JSONResponse({"detail": f"the store failed: {e}"}, status_code=503)

    def get(text_id: str) -> Text:
        try:
            return texts.get(text_id)
        except KeyError as e:
            raise HTTPException(404, str(e.args[0])) from None

    def sampling(body) -> Sampling:
        return Sampling(body.temperature, body.top_k, body.seed)

    @app.get("/", include_in_schema=False)
    def index():
        return FileResponse(STATIC / "index.html", headers=PAGE_HEADERS)

    @app.get("/how", include_in_schema=False)
    def how():
        return FileResponse(STATIC / "how.html", headers=PAGE_HEADERS)

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        path = (STATIC / name).resolve()
        if path.parent != STATIC.resolve() or not path.is_file():
            raise HTTPException(404, "no such file")
        return FileResponse(path, headers=PAGE_HEADERS)

    @app.get("/api/info")
    def info() -> dict:
        m, c = engine.manifest, engine.config
        nbytes = loading.stored_bytes(m)
        return {"model": engine.model, "backend": engine.store.name, "metric": m["metric"],
                "config": m["config"], "documents": m["documents"], "namespaces": m["namespaces"],
                "megabytes": round(nbytes / 1e6, 1), "requests_per_token": requests_per_token(c),
                "storage_usd_per_month": costs.storage_cost_per_month(nbytes), "rates": costs.rates(),
                "max_new_tokens": config.max_new_tokens, "max_open_texts": config.max_open_texts}

    @app.post("/api/texts", status_code=201)
    def create(body: CreateBody) -> dict:
        return text_json(texts.create(tokenizer.encode(body.prompt)))

    @app.get("/api/texts/{text_id}")
    def show(text_id: str) -> dict:
        t = get(text_id)
        with t.lock:  # a generation in another thread adds steps between tokens
            return text_json(t)

    @app.delete("/api/texts/{text_id}")
    def close(text_id: str) -> dict:
        try:
            texts.close(text_id)
        except KeyError as e:
            raise HTTPException(404, str(e.args[0])) from None
        stops.pop(text_id, None)
        return {"closed": text_id}

    def edit(text_id: str, op: Callable[[Text], None]) -> dict:
        t = get(text_id)
        with t.lock:
            if t.generating:
                raise TextBusy("this text is generating: stop it before you edit it")
            op(t)
            return text_json(t)

    @app.post("/api/texts/{text_id}/append")
    def append(text_id: str, body: AppendBody) -> dict:
        return edit(text_id, lambda t: t.append(tokenizer.encode(body.text)))

    @app.post("/api/texts/{text_id}/step_back")
    def step_back(text_id: str, body: PositionBody) -> dict:
        return edit(text_id, lambda t: t.step_back(body.position))

    @app.post("/api/texts/{text_id}/step_forward")
    def step_forward(text_id: str, body: PositionBody) -> dict:
        return edit(text_id, lambda t: t.step_forward(body.position))

    @app.post("/api/texts/{text_id}/cut")
    def cut(text_id: str, body: PositionBody) -> dict:
        return edit(text_id, lambda t: t.cut(body.position))

    @app.post("/api/texts/{text_id}/branch")
    def branch(text_id: str, body: BranchBody) -> dict:
        return edit(text_id, lambda t: t.branch(body.position, token_id=body.token_id, rank=body.rank))

    @app.post("/api/texts/{text_id}/stop")
    def stop(text_id: str) -> dict:
        get(text_id)
        stops.setdefault(text_id, threading.Event()).set()
        return {"stopping": text_id}

    def check_generate(t: Text, body) -> Sampling:
        s = sampling(body)
        s.check(t.config.n_vocab)
        if t.length + body.max_tokens > t.config.n_ctx:
            raise TextError(f"{t.length + body.max_tokens} tokens would not fit the model's context of {t.config.n_ctx} tokens")
        return s

    @app.post("/api/texts/{text_id}/generate")
    def generate(text_id: str, body: SamplingBody):
        """Server-sent events: ``token`` for each new token, then ``done`` (or ``error``)."""
        t = get(text_id)
        s = check_generate(t, body)  # errors before the stream starts are plain 4xx
        t.begin()  # 409 if it is generating already
        stop_event = stops.setdefault(text_id, threading.Event())
        stop_event.clear()

        def events() -> Iterator[str]:
            t0, n, requests = time.perf_counter(), 0, 0
            try:
                for step in t.generate(body.max_tokens, s, should_stop=stop_event.is_set):
                    n, requests = n + 1, requests + len(step.requests)
                    yield sse("token", step_json(step))
                with t.lock:
                    done = text_json(t)
                yield sse("done", {"tokens": n, "requests": requests, "ms": round((time.perf_counter() - t0) * 1e3, 1),
                                   "stopped": stop_event.is_set(), "text": done})
            except (TextError, StoreError) as e:
                yield sse("error", {"detail": str(e)})
            finally:
                t.end()

        # end() also as a background task: a stream the client drops before it starts never runs its finally.
        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                                 background=BackgroundTask(t.end))

    @app.post("/api/compare")
    def compare(body: CompareBody) -> dict:
        """The prompt through the engine and through the numpy reference: top-k side by side."""
        if reference is None:
            raise HTTPException(501, "this server was started without a reference checkpoint")
        if not comparing.acquire(blocking=False):  # each comparison reads the checkpoint: one at a time
            raise HTTPException(503, "a comparison is running: try again when it ends")
        try:
            return run_compare(body)
        finally:
            comparing.release()

    def run_compare(body: CompareBody) -> dict:
        ids = tokenizer.encode(body.prompt)
        if len(ids) > engine.config.n_ctx:
            raise TextError(f"the prompt has {len(ids)} tokens, the context is {engine.config.n_ctx}")
        rows = {}
        for name, products in (("search", engine.open()), ("reference", reference())):
            t = Text(products)
            try:
                t.append(ids)
                step = next(t.generate(1, Sampling(1.0, body.top_k)))
                rows[name] = {"ids": [int(i) for i in step.ids], "logits": [float(v) for v in step.logits],
                              "requests": len(step.requests), "ms": round(step.ms, 1)}
            finally:
                t.close()
        ref = dict(zip(rows["reference"]["ids"], rows["reference"]["logits"]))
        table = [{"rank": i, "token_id": tid, "text": tokenizer.token_text(tid), "search": lg, "reference": ref.get(tid)}
                 for i, (tid, lg) in enumerate(zip(rows["search"]["ids"], rows["search"]["logits"]))]
        diffs = [abs(r["search"] - r["reference"]) for r in table if r["reference"] is not None]
        return {"prompt_tokens": len(ids), "rows": table, "same_ids": rows["search"]["ids"] == rows["reference"]["ids"],
                "max_abs_diff": max(diffs) if diffs else None,
                "search": {k: v for k, v in rows["search"].items() if k in ("requests", "ms")},
                "reference": {k: v for k, v in rows["reference"].items() if k in ("requests", "ms")}}

    # --- OpenAI-compatible completions ---
    @app.post("/v1/completions")
    def completions(body: CompletionBody):
        ids = tokenizer.encode(body.prompt)
        t = texts.create(ids)
        try:
            s = check_generate(t, body)
        except TextError:
            texts.close(t.id)
            raise
        cid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span tokens

        def choice(step: Step) -> dict:
            lp = None
            if body.logprobs is not None:
                probs = {c["token_id"]: c["prob"] for c in step.candidates(1.0)}  # the model's own distribution
                top = sorted(probs.items(), key=lambda kv: -kv[1])[: body.logprobs]
                lp = {"tokens": [step.text], "token_logprobs": [_log(probs.get(step.token_id, 0.0))],
                      "top_logprobs": [{tokenizer.token_text(i): _log(p) for i, p in top}]}
            return {"text": utf8.decode(tokenizer.token_bytes(step.token_id)), "index": 0, "logprobs": lp, "finish_reason": None}

        def run() -> Iterator[tuple[Step, dict]]:
            try:
                for step in t.generate(body.max_tokens, s):
                    yield step, choice(step)
            finally:
                texts.close(t.id)

        def finish(steps: list[Step]) -> str:
            return "stop" if steps and steps[-1].token_id == tokenizer.EOT else "length"

        if body.stream:
            def events() -> Iterator[str]:
                steps = []
                for step, ch in run():
                    steps.append(step)
                    yield f"data: {json.dumps({'id': cid, 'object': 'text_completion', 'created': created, 'model': engine.model, 'choices': [ch]})}\n\n"
                last = {"text": utf8.decode(b"", final=True), "index": 0, "logprobs": None, "finish_reason": finish(steps)}
                yield f"data: {json.dumps({'id': cid, 'object': 'text_completion', 'created': created, 'model': engine.model, 'choices': [last]})}\n\n"
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")

        out = list(run())
        steps = [st for st, _ in out]
        lp = None
        if body.logprobs is not None:
            lp = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            offset = len(body.prompt)
            for st, ch in out:
                for k in ("tokens", "token_logprobs", "top_logprobs"):
                    lp[k] += ch["logprobs"][k]
                lp["text_offset"].append(offset)
                offset += len(st.text)
        text = tokenizer.decode([st.token_id for st in steps])
        return {"id": cid, "object": "text_completion", "created": created, "model": engine.model,
                "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish(steps)}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(steps), "total_tokens": len(ids) + len(steps)}}

    return app


def _log(p: float) -> float:
    return math.log(p) if p > 0 else -1e9  # JSON has no -inf
