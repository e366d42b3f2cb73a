"""How an error becomes a response, in one place: a ``TextError`` is the request's fault
(400; 409 while the text generates), a text this server does not hold a 404 with the code
``text_not_found`` (the page reopens it), as is a text whose keys expired (``KeysExpired``: a
503 ``text_expired`` on ``/v1``, whose request a retry runs again), a ``StoreError`` or an unreadable reference
checkpoint the server's (503), a request the server ended (``streaming.Ended``: its limit,
its shutdown) says why. Every error, on every path, has one shape, OpenAI's, which the
OpenAPI document declares as ``ErrorBody``: ``{"error": {"message", "type", "param",
"code"}}``. Only the status of a field that breaks its type or bound differs: 400 on the
OpenAI-compatible paths (``/v1`` and vLLM's tokenizer routes: ``openai_shaped``), as OpenAI
answers, and 422 on ``/api``. ``refuse`` writes the same answers for the middlewares,
before any route."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from puffergpt.model.checkpoints import CheckpointError
from puffergpt.model.session import KeysExpired
from puffergpt.server.openai.protocol import OpenAIError
from puffergpt.server.streaming import Ended
from puffergpt.stores.base import NoSpace, StoreError
from puffergpt.texts.text import TextBusy, TextError, TextNotFound

OPENAI_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")  # vLLM's, beside /v1: a bad field is a 400 there too


def openai_shaped(path: str) -> bool:
    """Whether ``path`` answers as OpenAI's API does (a bad field a 400): /v1 and the tokenizer routes."""
    return path == "/v1" or path.startswith("/v1/") or path in OPENAI_PATHS


def body(status: int, message: str, kind: str | None = None, param: str | None = None,
         code: str | None = None) -> dict:
    """An error's JSON (``ErrorBody``); ``kind`` by the status unless given."""
    kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
    return OpenAIError(status, message, param, code, kind).body()


def error(status: int, message: str, kind: str | None = None, param: str | None = None, code: str | None = None,
          headers: dict | None = None) -> JSONResponse:
    return JSONResponse(body(status, message, kind, param, code), status_code=status, headers=headers)


def refusal(request: Request, status: int, message: str, kind: str | None = None,
            code: str | None = None, headers: dict | None = None) -> JSONResponse:
    """A handler's answer to ``request``: the same shape whatever its path."""
    return error(status, message, kind, code=code, headers=headers)


async def refuse(scope, send, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None) -> None:
    """The answer of a middleware that refuses a request before any route (ASGI)."""
    await error(status, message, param=param, code=code, headers=headers)(scope, None, send)


async def openai_error(_, e: OpenAIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def text_error(request: Request, e: TextError) -> JSONResponse:
    return refusal(request, 409 if isinstance(e, TextBusy) else 400, str(e))


async def text_not_found(_, e: TextNotFound) -> JSONResponse:
    # the code tells a page to reopen the text from its ids on whichever server answers
    return error(404, str(e), code="text_not_found")


async def keys_expired(request: Request, e: KeysExpired) -> JSONResponse:
    if openai_shaped(request.url.path):  # the request's own text: asking again opens another
        return error(503, str(e), code="text_expired")
    return error(404, str(e), code="text_not_found")


async def store_error(request: Request, e: StoreError) -> JSONResponse:
    if isinstance(e, NoSpace):  # 507: the learner's texts are as they were; a retry after room is made works
        return refusal(request, 507, str(e), kind="server_error", code="insufficient_storage")
    return refusal(request, 503, f"the store failed: {e}", kind="server_error")


async def checkpoint_error(request: Request, e: CheckpointError) -> JSONResponse:
    return refusal(request, 503, f"the reference checkpoint could not be read: {e}", kind="server_error")


async def ended(request: Request, e: Ended) -> JSONResponse:
    return refusal(request, e.ending.status, e.ending.message, e.ending.kind, e.ending.code)


async def http_error(request: Request, e: HTTPException) -> JSONResponse:
    # Starlette's own (404, 405, ...) and the routes'
    message = e.detail if isinstance(e.detail, str) else str(e.detail)
    return refusal(request, e.status_code, message, headers=e.headers)


async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
    # FastAPI's own handler echoes the input back, and NaN or Infinity can't be JSON: say where and what
    # only, every field at fault ("param": the first), in the one shape
    said, first = [], None
    for err in e.errors():
        loc = [str(x) for x in err.get("loc", ()) if x not in ("body", "query", "path")]
        first = first or (loc[0] if loc else None)
        said.append(f"{'.'.join(loc) or 'the request'}: {err.get('msg', 'invalid')}")
    status = 400 if openai_shaped(request.url.path) else 422  # the /v1 routes parse their own bodies
    return error(status, "; ".join(said) or "the request is invalid", param=first)


async def not_unicode(request: Request, e: UnicodeEncodeError) -> JSONResponse:
    # a backstop: the body parser (bodies.parse_json) refuses lone surrogates first
    return refusal(request, 400, f"a string in the request is not valid Unicode ({e.reason} at position {e.start}): "
                                 "send text without lone surrogates")


HANDLERS = {OpenAIError: openai_error, TextError: text_error, TextNotFound: text_not_found, StoreError: store_error,
            KeysExpired: keys_expired,
            CheckpointError: checkpoint_error, Ended: ended, HTTPException: http_error,
            RequestValidationError: invalid, UnicodeEncodeError: not_unicode}


def add_handlers(app: FastAPI) -> None:
    for kind, handler in HANDLERS.items():
        app.add_exception_handler(kind, handler)
