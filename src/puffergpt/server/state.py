"""What the routes share, and how they get it: the app's state, built once by
``create_app``, handed to each route by FastAPI's ``Depends`` (no closures)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, make_dataclass
from typing import Annotated

from fastapi import Depends, Request

from puffergpt import settings
from puffergpt.app.protocol import MAX_NEW_TOKENS
from puffergpt.model.session import Run
from puffergpt.search.engine import Engine
from puffergpt.server.guards.auth import check_key
from puffergpt.server.guards.cross_site import check_origin
from puffergpt.server.openapi_doc import check_public_url
from puffergpt.server.streaming import Generations
from puffergpt.texts.registry import Texts
from puffergpt.texts.text import Text


def _checked(self) -> None:
    """ServerConfig's own checks, whoever builds it: keys, origins and the public URL normalised,
    the bounds kept (a test or a worker builds one beside the CLI's checks)."""
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


# A server's configuration: its fields are the settings that go to "config" in puffergpt.settings
# (each named, typed, defaulted and explained there once), so a new one is one entry there.
ServerConfig = make_dataclass("ServerConfig", settings.fields("config"), frozen=True,
                              namespace={"__post_init__": _checked, "__module__": __name__,
                                         "__doc__": "A server's configuration (puffergpt.settings, to 'config')."})


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
