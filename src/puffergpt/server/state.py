"""What the routes share, and how they get it: the app's state, built once by
``create_app``, handed to each route by FastAPI's ``Depends`` (no closures)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Request

from puffergpt.model.session import Run
from puffergpt.search.engine import Engine
from puffergpt.server.bodies import MAX_NEW_TOKENS
from puffergpt.server.guards.auth import check_key
from puffergpt.server.guards.cross_site import check_origin
from puffergpt.server.openapi_doc import check_public_url
from puffergpt.server.streaming import Generations
from puffergpt.texts.registry import Texts
from puffergpt.texts.text import Text

MAX_REQUEST_S = 600.0  # a generation's seconds (serve --max-request-seconds): 512 GPT-2 tokens take ~1.5 min embedded
# Tokens a /v1 request computes (serve --max-request-tokens), summed over its choices: each prompt token
# read, each scored over the whole vocabulary (echo with logprobs), each new one. 8,192: 8 chat choices
# of a full context, or lm-eval's --batch_size 4 of whole-context log-likelihoods.
MAX_REQUEST_TOKENS = 8192


@dataclass(frozen=True)
class ServerConfig:
    max_open_texts: int = 32
    idle_s: float = 1800.0
    max_new_tokens: int = MAX_NEW_TOKENS  # a request's new tokens (the bodies' bound is the most it can be)
    trusted_hosts: tuple[str, ...] | None = None  # Host headers accepted; None accepts any
    fallback: str | None = None  # why the model is the demo one, when GPT-2 small could not be had
    read_timeout_s: float = 10.0  # a request body must keep arriving: each piece within this
    cors_origins: tuple[str, ...] = ()  # pages elsewhere allowed to drive the API (serve --cors-origin)
    max_request_s: float | None = MAX_REQUEST_S  # a generation's wall-clock bound; None: none
    max_request_tokens: int = MAX_REQUEST_TOKENS  # tokens a /v1 request computes, over its choices
    api_keys: tuple[str, ...] = field(default=(), repr=False)  # serve --api-key: who may write and use /v1 (auth.py)
    public_read_only: bool = False  # serve --public-read-only: anyone generates, no one writes the notebook
    public_url: str | None = None  # the URL clients reach (serve --public-url): the OpenAPI document's server

    def __post_init__(self):
        object.__setattr__(self, "cors_origins", tuple(check_origin(o) for o in self.cors_origins))
        object.__setattr__(self, "api_keys", tuple(check_key(k) for k in self.api_keys))
        if self.public_url is not None:
            object.__setattr__(self, "public_url", check_public_url(self.public_url))
        if self.max_request_s is not None and not self.max_request_s > 0:
            raise ValueError(f"max_request_s must be above 0 (or None), got {self.max_request_s}")
        if not 1 <= self.max_request_tokens <= 10**7:
            raise ValueError(f"max_request_tokens must be in 1..{10**7}, got {self.max_request_tokens}")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens must be in 1..{MAX_NEW_TOKENS}, got {self.max_new_tokens}")


@dataclass
class Served:
    """One app's model and what it holds open: ``app.state.served``."""

    engine: Engine
    config: ServerConfig
    texts: Texts
    generations: Generations  # each in a worker thread of its own (streaming.py)
    reference: Callable[[], Run] | None = None  # numpy runs for Compare
    # Each comparison reads the checkpoint: one at a time.
    comparing: threading.Lock = field(default_factory=threading.Lock)


def served(request: Request) -> Served:
    return request.app.state.served


def engine(request: Request) -> Engine:
    return request.app.state.served.engine


def config(request: Request) -> ServerConfig:
    return request.app.state.served.config


def texts(request: Request) -> Texts:
    return request.app.state.served.texts


def generations(request: Request) -> Generations:
    return request.app.state.served.generations


ServedDep = Annotated[Served, Depends(served)]
EngineDep = Annotated[Engine, Depends(engine)]
ConfigDep = Annotated[ServerConfig, Depends(config)]
TextsDep = Annotated[Texts, Depends(texts)]
GenerationsDep = Annotated[Generations, Depends(generations)]


def open_text(text_id: str, texts: TextsDep) -> Text:
    """The open text of the path's ``text_id``, or TextNotFound: a 404 whose code is
    ``text_not_found`` (``errors.py``)."""
    return texts.get(text_id)


TextDep = Annotated[Text, Depends(open_text)]
