"""The HTTP server: the playground's API, an OpenAI-compatible completions endpoint,
and the static page. Thin: it parses, calls a text or the engine, and renders."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from fastapi import FastAPI, HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from starlette.middleware.trustedhost import TrustedHostMiddleware
from puffergpt import completion, costs, inside, loading, model_info, tokenizer, views
from puffergpt.checkpoints import CheckpointError
from puffergpt.engine import Engine, requests_per_token, round_trips_per_token
from puffergpt.sampling import Sampling
from puffergpt.server.openai import OpenAIError
from puffergpt.server.streaming import Generations, stream
from puffergpt.server.bodies import (MAX_NEW_TOKENS, AnalogyBody, AppendBody, BodyError, BranchBody, CompareBody, CreateBody,
                                     MapBody, NeighboursBody, PositionBody, SamplingBodyInspect, parse_json)
from puffergpt.stores.base import StoreError
from puffergpt.text import Step, Text, TextBusy, TextError, Texts, check_generation, log

MAX_BODY = 64 * 1024  # bytes of a request body
STATIC = Path(str(resources.files("puffergpt") / "static"))
# The pages load nothing from elsewhere and run no inline script.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
PAGE_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}
# Set by name: module scripts need a JavaScript type, and some hosts' mimetypes say text/plain.
MEDIA_TYPES = {".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css", ".html": "text/html",
               ".svg": "image/svg+xml", ".png": "image/png", ".json": "application/json"}
DOCS_ASSETS = "/docs-assets"  # Swagger UI and ReDoc, from the fastapi-offline package: no CDN


def docs_assets() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def docs_csp(html: str) -> str:
    """The CSP of a docs page: everything from 'self', and its one inline start-up script
    allowed by its hash. Swagger UI and ReDoc set styles as they render, so inline styles
    are allowed (styles run no code); ReDoc's search runs in a worker made from a blob."""
    import base64
    import hashlib
    import re

    hashes = " ".join(f"'sha256-{base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()}'"
                      for body in re.findall(r"<script>(.*?)</script>", html, re.S))
    return (f"default-src 'self'; script-src 'self' {hashes}; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            "connect-src 'self'; worker-src 'self' blob:; font-src 'self' data:; object-src 'none'; base-uri 'none'; "
            "frame-ancestors 'none'; form-action 'none'")


def file_in(folder: Path, name: str) -> Path:
    """The file ``name`` right in ``folder``, or a 404. The name is looked up among the
    folder's own entries before the filesystem sees it: a long or odd name (5,000
    characters, a NUL, '..') is only not found, never an OSError."""
    if len(name) > 255 or name not in {p.name for p in folder.iterdir()}:
        raise HTTPException(404, "no such file")
    path = folder / name
    if not path.is_file() or path.resolve().parent != folder.resolve():  # a link out of the folder
        raise HTTPException(404, "no such file")
    return path


@dataclass(frozen=True)
class ServerConfig:
    max_open_texts: int = 32
    idle_s: float = 1800.0
    max_new_tokens: int = MAX_NEW_TOKENS
    trusted_hosts: tuple[str, ...] | None = None  # Host headers accepted; None accepts any
    fallback: str | None = None  # why the model is the demo one, when GPT-2 small could not be had
    read_timeout_s: float = 10.0  # a request body must keep arriving: each piece within this


class BoundedBody:
    """Refuse a request body over MAX_BODY bytes, counted as it arrives (chunked bodies
    too), and one that is not JSON Python holds as sent (``bodies.parse_json``: the one
    parser, for every route): the body is read here, bounded, checked, and handed on
    whole. Refusals on /v1 are in OpenAI's error shape."""

    def __init__(self, app, read_timeout_s: float = 10.0):
        self.app = app
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        n = dict(scope["headers"]).get(b"content-length")
        if n is not None and (not n.isdigit() or int(n) > MAX_BODY):
            return await self._refuse(scope, send, 413, f"request body over {MAX_BODY} bytes")
        body, more = b"", True
        while more:
            try:  # a client that declares more than it sends must not hold the connection
                message = await asyncio.wait_for(receive(), self.read_timeout_s)
            except TimeoutError:
                return await self._refuse(scope, send, 408, f"the request body stopped arriving for {self.read_timeout_s:g} s",
                                          headers={"Connection": "close"})
            if message["type"] != "http.request":  # the client went away
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > MAX_BODY:
                return await self._refuse(scope, send, 413, f"request body over {MAX_BODY} bytes")
        if body:
            try:  # the routes parse it again (the standard json, which then holds it as sent)
                parse_json(body)
            except BodyError as e:
                return await self._refuse(scope, send, 400, e.message, e.param)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: disconnects, for streaming responses

        await self.app(scope, replay, send)

    @staticmethod
    async def _refuse(scope, send, status: int, message: str, param: str | None = None, headers: dict | None = None):
        v1 = scope["path"] == "/v1" or scope["path"].startswith("/v1/")
        content = OpenAIError(status, message, param).body() if v1 else {"detail": message}
        await JSONResponse(content, status_code=status, headers=headers)(scope, None, send)


GRACE_S = 2  # on shutdown, responses still streaming after this are cancelled


def server(app: FastAPI, host: str, port: int):
    """A uvicorn server for the app whose shutdown first stops every running generation
    (each ends within a token and closes its text; uvicorn alone would wait for them all
    to finish), then cancels any response still streaming after GRACE_S."""
    import uvicorn

    class Server(uvicorn.Server):
        async def shutdown(self, sockets=None):
            app.state.generations.stop_all(wait_s=None)
            await super().shutdown(sockets)

    return Server(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=GRACE_S))


def run(app: FastAPI, host: str, port: int) -> None:
    server(app, host, port).run()


# --- rendering ---

def request_json(r) -> dict:
    d = r.to_json()
    d["cost_usd"] = r.cost_usd()
    return d


token_json = views.token_dict  # a token as text, with bytes_hex for a byte piece


def part_label(part: dict) -> str:
    """A part of the attribution as the page names it: embed, L2 H5, L2 attn bias, L2 MLP, ln_f bias."""
    kind = part["kind"]
    if kind == "attn":
        return f"L{part['layer']} H{part['head']}"
    if kind == "attn_bias":
        return f"L{part['layer']} attn bias"
    if kind == "mlp":
        return f"L{part['layer']} MLP"
    return {"embed": "embed", "ln_f_bias": "ln_f bias"}[kind]


def explained_json(got: dict) -> dict:
    """The attribution (each part labelled) and the neurons, tokens as text."""
    a = got["attribution"]
    return {"attribution": {"token_id": a["token_id"], "token": token_json(a["token_id"]), "logit": a["logit"],
                            "parts": [{**part, "label": part_label(part)} for part in a["parts"]]},
            "neurons": [[{**n, "promotes": [{**t, "token": token_json(t["token_id"])} for t in n["promotes"]]}
                         for n in layer] for layer in got["neurons"]]}


def inspect_json(got: dict, text: Text, p: int, requests: list, recomputed: bool) -> dict:
    nxt = text.tokens[p] if p < len(text.tokens) and p < text.length else None
    lens = [{"layer": e["layer"], "top": [{**token_json(int(i)), "logit": float(v)} for i, v in zip(e["ids"], e["logits"])],
             "chosen_rank": None if nxt is None else inside.rank_of(e, nxt)} for e in got["lens"]]
    d = {"position": p, "query_position": p - 1, "predicts_token": None if nxt is None else token_json(nxt),
         "tokens": [{"position": i, **token_json(t)} for i, t in enumerate(text.tokens[:p])],
         "attention": np.round(got["weights"][:, :, :p], 6).tolist(), "scores": np.round(got["scores"][:, :, :p], 5).tolist(),
         "lens": lens, "lens_k": got["k"], "decided_layer": inside.decided_layer(got["lens"]),
         "final_top1": token_json(inside.final_top1(got["lens"])),
         "requests": [request_json(r) for r in requests], "recomputed": recomputed}
    if "attribution" in got:
        d |= explained_json(got)
    return d


def step_inspect_json(step: Step) -> dict:
    got = step.inspect
    return {"attention": np.round(got["weights"][:, :, :step.position], 6).tolist(),
            "lens": [{"layer": e["layer"], "top": [{**token_json(int(i)), "logit": float(v)} for i, v in zip(e["ids"], e["logits"])],
                      "chosen_rank": inside.rank_of(e, step.token_id)} for e in got["lens"]],
            "decided_layer": inside.decided_layer(got["lens"]), "final_top1": token_json(inside.final_top1(got["lens"]))}


def step_json(step: Step, full: bool = True) -> dict:
    d = {"position": step.position, **token_json(step.token_id), "phase": step.phase,
         "read": step.read, "ms": round(step.ms, 3), "temperature": step.temperature,
         "requests": len(step.requests), "cost_usd": sum(r.cost_usd() for r in step.requests),
         "round_trips": sum(r.round_trips for r in step.requests)}
    if full:
        d["candidates"] = [{"rank": i, **c} for i, c in enumerate(step.candidates())]
        d["probs_t1"] = [c["prob"] for c in step.candidates(1.0)]
        d["request_log"] = [request_json(r) for r in step.requests]
    if step.inspect is not None:
        d |= step_inspect_json(step)
    return d


def text_json(t: Text, full: bool = True) -> dict:
    return {"id": t.id, "length": t.length, "known": len(t.tokens), "read_upto": t.read_upto,
            "tokens": [{"position": i, **token_json(tok), "generated": i in t.steps,
                        "prob": _chosen_prob(t.steps.get(i))} for i, tok in enumerate(t.tokens)],
            "steps": {str(p): {k: v for k, v in step_json(s, full).items() if k not in ("attention", "lens")}
                      for p, s in sorted(t.steps.items())}}


def _chosen_prob(step: Step | None) -> float | None:
    if step is None:
        return None
    probs = dict(zip(map(int, step.ids), (c["prob"] for c in step.candidates())))
    return probs.get(step.token_id, 0.0)


def sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"


# --- the app ---

def create_app(engine: Engine, config: ServerConfig = ServerConfig(), reference: Callable | None = None,
               notebook=None) -> FastAPI:
    """The app over one loaded model. ``reference`` returns a numpy Products for Compare;
    ``notebook`` (a ``notebook.Notebook``) adds the insight routes."""
    texts = Texts(engine.open, max_open=config.max_open_texts, idle_s=config.idle_s)
    stops: dict[str, threading.Event] = {}
    generations = Generations()  # each in a worker thread of its own (streaming.py)
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
        generations.stop_all()  # each ends within a token and closes what it holds
        texts.close_all()  # closing a text drops its namespace of keys

    app = FastAPI(title="puffergpt", description="GPT-2 where every matrix multiply is a vector search.",
                  version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None)  # ours: local assets
    app.state.texts = texts
    app.state.generations = generations

    app.add_middleware(BoundedBody, read_timeout_s=config.read_timeout_s)
    if config.trusted_hosts:  # a page elsewhere can't drive this API by DNS rebinding
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(config.trusted_hosts))

    @app.exception_handler(RequestValidationError)
    async def invalid(_, e):
        # FastAPI's own handler echoes the input back, and NaN or Infinity can't be JSON: say where and what only
        return JSONResponse({"detail": [{"loc": list(map(str, err.get("loc", ()))), "msg": str(err.get("msg", "")),
                                         "type": str(err.get("type", ""))} for err in e.errors()]}, status_code=422)

    @app.exception_handler(UnicodeEncodeError)
    async def not_unicode(_, e):  # a backstop: the body parser (bodies.parse_json) refuses lone surrogates first
        return JSONResponse({"detail": f"a string in the request is not valid Unicode ({e.reason} at position {e.start}): "
                                       "send text without lone surrogates"}, status_code=400)

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
        path = file_in(STATIC, name)
        return FileResponse(path, headers=PAGE_HEADERS, media_type=MEDIA_TYPES.get(path.suffix))

    @app.get("/docs", include_in_schema=False)
    def docs():
        from fastapi.openapi.docs import get_swagger_ui_html

        page = get_swagger_ui_html(openapi_url=app.openapi_url, title="puffergpt - Swagger UI",
                                   swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                                   swagger_favicon_url=f"{DOCS_ASSETS}/favicon.png")
        return docs_page(page)

    @app.get("/redoc", include_in_schema=False)
    def redoc():
        from fastapi.openapi.docs import get_redoc_html

        page = get_redoc_html(openapi_url=app.openapi_url, title="puffergpt - ReDoc",
                              redoc_js_url=f"{DOCS_ASSETS}/redoc.standalone.js",
                              redoc_favicon_url=f"{DOCS_ASSETS}/favicon.png", with_google_fonts=False)
        return docs_page(page)

    def docs_page(page):
        html = page.body.decode()
        return HTMLResponse(html, headers={**PAGE_HEADERS, "Content-Security-Policy": docs_csp(html)})

    @app.get(DOCS_ASSETS + "/{name}", include_in_schema=False)
    def docs_asset(name: str):
        path = file_in(docs_assets(), name)
        return FileResponse(path, headers=PAGE_HEADERS, media_type=MEDIA_TYPES.get(path.suffix))

    @app.get("/api/info")
    def info() -> dict:
        m, c = engine.manifest, engine.config
        nbytes = loading.stored_bytes(m)
        name = model_info.model_name(engine.model)  # a local checkpoint by its directory's name, as /v1 shows it
        return {"model": name, "backend": engine.store.name, "metric": m["metric"],
                "config": m["config"], "documents": m["documents"], "namespaces": m["namespaces"],
                "megabytes": round(nbytes / 1e6, 1), "requests_per_token": requests_per_token(c),
                "round_trips_per_token": round_trips_per_token(c),
                "storage_usd_per_month": costs.storage_cost_per_month(nbytes), "rates": costs.rates(),
                "max_new_tokens": config.max_new_tokens, "max_open_texts": config.max_open_texts,
                "about": model_info.about(name, c), "starters": model_info.starters(engine.model),
                "embedding_words": model_info.embedding_words(engine.model),
                "fallback": config.fallback}

    @app.post("/api/texts", status_code=201)
    def create(body: CreateBody) -> dict:
        ids = tokenizer.encode(body.prompt) if body.prompt is not None else body.prompt_ids  # ids: checked by the text
        return text_json(texts.create(ids))

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

    @app.post("/api/texts/{text_id}/generate")
    def generate(text_id: str, body: SamplingBodyInspect):
        """Server-sent events: ``token`` for each new token, then ``done`` (or ``error``).
        With ``inspect``, each token also carries its attention and lens."""
        t = get(text_id)
        s = check_generation(t.config, sampling(body), t.length, body.max_tokens)  # errors before the stream are plain 4xx
        t.begin()  # 409 if it is generating already
        stop_event = stops.setdefault(text_id, threading.Event())
        stop_event.clear()

        def events(stop: threading.Event) -> Iterator[str]:  # runs in the generation's worker thread
            t0, n, requests = time.perf_counter(), 0, 0
            try:
                for step in t.generate(body.max_tokens, s, should_stop=stop.is_set,
                                       inspect=body.lens_k if body.inspect else 0):
                    n, requests = n + 1, requests + len(step.requests)
                    yield sse("token", step_json(step))
                with t.lock:
                    done = text_json(t)
                yield sse("done", {"tokens": n, "requests": requests, "ms": round((time.perf_counter() - t0) * 1e3, 1),
                                   "stopped": stop.is_set(), "text": done})
            except (TextError, StoreError) as e:
                yield sse("error", {"detail": str(e)})

        return stream(generations, events, stop=stop_event, on_end=t.end)

    @app.post("/api/compare")
    def compare(body: CompareBody) -> dict:
        """The prompt through the engine and through the numpy reference: top-k side by side."""
        if reference is None:
            raise HTTPException(501, "this server was started without a reference checkpoint")
        if not comparing.acquire(blocking=False):  # each comparison reads the checkpoint: one at a time
            raise HTTPException(503, "a comparison is running: try again when it ends")
        try:
            return completion.compare(engine.open, reference, tokenizer.encode(body.prompt), body.top_k,
                                      engine.config.n_ctx)
        finally:
            comparing.release()

    # --- inside the transformer: each view is searches, counted ---
    @app.get("/api/texts/{text_id}/steps/{position}/inspect")
    def inspect(text_id: str, position: int, lens_k: int = 10) -> dict:
        """The view from the token at position - 1, whose output predicts ``position``:
        attention per layer and head over 0..position-1, and the logit lens."""
        t = get(text_id)
        got, requests, recomputed = t.inspect(position, lens_k)
        with t.lock:
            return inspect_json(got, t, position, requests, recomputed)

    @app.get("/api/texts/{text_id}/kv")
    def kv(text_id: str) -> dict:
        t = get(text_id)
        with t.lock:
            if t.generating:
                raise TextBusy("this text is generating: look at its keys when it ends")
            log0 = len(t.products.log)
            d = views.kv(t)
            d["requests"] = [request_json(r) for r in t.products.log[log0:]]
            return d

    def view(run: Callable[[object], dict]) -> dict:
        """A view on its own products (a fetch and a search or two), closed after."""
        products = engine.views()  # no text: no namespace of keys to make and drop
        try:
            products.extra = True
            d = run(products)
            d["requests"] = [request_json(r) for r in products.log[1:]]  # after the layer-norm fetch of opening
            return d
        finally:
            products.close()

    @app.post("/api/analogy")
    def analogy(body: AnalogyBody) -> dict:
        """"a is to b as c is to ?": the tokens nearest by cosine to wte[b] - wte[a] + wte[c]."""
        return view(lambda p: views.analogy(p, body.a, body.b, body.c, body.k))

    @app.post("/api/neighbours")
    def neighbours(body: NeighboursBody) -> dict:
        return view(lambda p: views.neighbours(p, body.word, body.k))

    @app.post("/api/map")
    def embedding_map(body: MapBody) -> dict:
        """Some token vectors on a plane, and the path of a text's token through the layers."""
        residual = None
        if body.text_id is not None:
            t = get(body.text_id)
            if body.position is None:
                raise TextError("map: give the position whose path to draw with the text")
            got, _, _ = t.inspect(body.position, 5, explain=False)
            residual = got["residual"]
        return view(lambda p: views.embedding_map(p, list(body.words), residual))

    from puffergpt.server.openai import openai_router

    app.include_router(openai_router(engine, texts, config, generations=generations))  # shutdown stops theirs too
    if notebook is not None:
        from puffergpt import notebook as nb
        from puffergpt.server.notebook import notebook_router

        app.include_router(notebook_router(notebook, nb.candidates_from_products(engine.open), model=engine.model))
    return app
