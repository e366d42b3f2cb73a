"""How an error becomes a response, in one place: a ``TextError`` is the request's fault
(400; 409 while the text generates), a text this server does not hold a 404 with the code
``text_not_found`` (the page reopens it), a ``StoreError`` or an unreadable reference
checkpoint the server's (503). Under ``/v1`` every error has OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``), elsewhere ``{"detail": ...}``."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from puffergpt.checkpoints import CheckpointError
from puffergpt.server.openai_bodies import OpenAIError
from puffergpt.stores.base import StoreError
from puffergpt.text import TextBusy, TextError, TextNotFound


def is_v1(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def refusal(request: Request, status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    if is_v1(request.url.path):
        return JSONResponse(OpenAIError(status, message, kind=kind).body(), status_code=status)
    return JSONResponse({"detail": message}, status_code=status)


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


async def invalid(_, e: RequestValidationError) -> JSONResponse:
    # FastAPI's own handler echoes the input back, and NaN or Infinity can't be JSON: say where and what only
    return JSONResponse({"detail": [{"loc": list(map(str, err.get("loc", ()))), "msg": str(err.get("msg", "")),
                                     "type": str(err.get("type", ""))} for err in e.errors()]}, status_code=422)


async def not_unicode(_, e: UnicodeEncodeError) -> JSONResponse:
    # a backstop: the body parser (bodies.parse_json) refuses lone surrogates first
    return JSONResponse({"detail": f"a string in the request is not valid Unicode ({e.reason} at position {e.start}): "
                                   "send text without lone surrogates"}, status_code=400)


HANDLERS = {OpenAIError: openai_error, TextError: text_error, TextNotFound: text_not_found, StoreError: store_error,
            CheckpointError: checkpoint_error,
            RequestValidationError: invalid, UnicodeEncodeError: not_unicode}


def add_handlers(app: FastAPI) -> None:
    for kind, handler in HANDLERS.items():
        app.add_exception_handler(kind, handler)
