"""How an error becomes a response, in one place: a ``TextError`` is the request's fault
(400; 409 while the text generates), a text this server does not hold a 404 with the code
``text_not_found`` (the page reopens it), a ``StoreError`` or an unreadable reference
checkpoint the server's (503), a request the server ended (``streaming.Ended``: its limit,
its shutdown) says why. On the OpenAI-compatible paths (``/v1`` and vLLM's tokenizer
routes: ``openai_shaped``) every error has OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``), elsewhere ``{"detail": ...}``;
``refuse`` writes the same answers for the middlewares, before any route."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from puffergpt.checkpoints import CheckpointError
from puffergpt.server.openai_bodies import OpenAIError
from puffergpt.server.streaming import Ended
from puffergpt.stores.base import StoreError
from puffergpt.text import TextBusy, TextError, TextNotFound

OPENAI_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")  # vLLM's, beside /v1: OpenAI's error shape too


def openai_shaped(path: str) -> bool:
    """Whether errors on ``path`` take OpenAI's shape: /v1 and the tokenizer routes."""
    return path == "/v1" or path.startswith("/v1/") or path in OPENAI_PATHS


def body(path: str, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
         code: str | None = None) -> dict:
    if openai_shaped(path):
        return OpenAIError(status, message, param, code, kind).body()
    return {"detail": message}


def refusal(request: Request, status: int, message: str, kind: str = "invalid_request_error",
            code: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(body(request.url.path, status, message, kind, code=code), status_code=status,
                        headers=headers)


async def refuse(scope, send, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None) -> None:
    """The answer of a middleware that refuses a request before any route (ASGI)."""
    content = body(scope["path"], status, message, param=param, code=code)
    await JSONResponse(content, status_code=status, headers=headers)(scope, None, send)


async def openai_error(_, e: OpenAIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def text_error(request: Request, e: TextError) -> JSONResponse:
    return refusal(request, 409 if isinstance(e, TextBusy) else 400, str(e))


async def text_not_found(_, e: TextNotFound) -> JSONResponse:
    # the code tells a page to reopen the text from its ids on whichever server answers
    return JSONResponse({"detail": str(e), "code": "text_not_found"}, status_code=404)


async def store_error(request: Request, e: StoreError) -> JSONResponse:
    return refusal(request, 503, f"the store failed: {e}", kind="server_error")


async def checkpoint_error(request: Request, e: CheckpointError) -> JSONResponse:
    return refusal(request, 503, f"the reference checkpoint could not be read: {e}", kind="server_error")


async def ended(request: Request, e: Ended) -> JSONResponse:
    return refusal(request, e.ending.status, e.ending.message, e.ending.kind, e.ending.code)


async def http_error(request: Request, e: HTTPException) -> JSONResponse:
    # Starlette's own (404, 405, ...) and the routes': OpenAI's shape where the path takes it
    if not isinstance(e.detail, str):
        return JSONResponse({"detail": e.detail}, status_code=e.status_code, headers=e.headers)
    kind = "server_error" if e.status_code >= 500 else "invalid_request_error"
    return refusal(request, e.status_code, e.detail, kind, headers=e.headers)


async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
    # FastAPI's own handler echoes the input back, and NaN or Infinity can't be JSON: say where and what only
    errs = [{"loc": list(map(str, err.get("loc", ()))), "msg": str(err.get("msg", "")),
             "type": str(err.get("type", ""))} for err in e.errors()]
    if openai_shaped(request.url.path):  # the /v1 routes parse their own bodies: a parameter in the path or query
        first = errs[0] if errs else {"loc": [], "msg": "invalid"}
        return refusal(request, 400, f"{'.'.join(first['loc']) or 'the request'}: {first['msg']}")
    return JSONResponse({"detail": errs}, status_code=422)


async def not_unicode(request: Request, e: UnicodeEncodeError) -> JSONResponse:
    # a backstop: the body parser (bodies.parse_json) refuses lone surrogates first
    return refusal(request, 400, f"a string in the request is not valid Unicode ({e.reason} at position {e.start}): "
                                 "send text without lone surrogates")


HANDLERS = {OpenAIError: openai_error, TextError: text_error, TextNotFound: text_not_found, StoreError: store_error,
            CheckpointError: checkpoint_error, Ended: ended, HTTPException: http_error,
            RequestValidationError: invalid, UnicodeEncodeError: not_unicode}


def add_handlers(app: FastAPI) -> None:
    for kind, handler in HANDLERS.items():
        app.add_exception_handler(kind, handler)
