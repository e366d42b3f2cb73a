"""The model served: what it is and costs (``/api/info``, which the page reads first),
and Compare (``/api/compare``): the engine's next-token candidates beside the numpy
reference's."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException

from puffergpt.app import completion
from puffergpt.model import info as model_info
from puffergpt.model import tokenizer
from puffergpt.search import costs, manifest
from puffergpt.search.engine import requests_per_token, round_trips_per_token
from puffergpt.server.bodies import CompareBody
from puffergpt.server.playground import responses
from puffergpt.server.playground.responses import BODY, errors
from puffergpt.server.state import ServedDep

router = APIRouter(prefix="/api", tags=["model"])


@router.get("/info", response_model=responses.Info, operation_id="getInfo", summary="The model served and its costs")
def info(served: ServedDep) -> dict:
    """The model served, what it holds in the store and costs, and the server's limits: what
    the page reads first."""
    engine, config = served.engine, served.config
    m, c = engine.manifest, engine.config
    nbytes = manifest.stored_bytes(m)
    name = model_info.model_name(engine.model)  # a local checkpoint by its directory's name, as /v1 shows it
    return {"model": name, "backend": engine.store.name, "metric": m["metric"],
            "config": m["config"], "documents": m["documents"], "namespaces": m["namespaces"],
            "megabytes": round(nbytes / 1e6, 1), "requests_per_token": requests_per_token(c),
            "round_trips_per_token": round_trips_per_token(c),
            "storage_usd_per_month": costs.storage_cost_per_month(nbytes), "rates": costs.rates(),
            "max_new_tokens": config.max_new_tokens, "max_open_texts": config.max_open_texts,
            "about": model_info.about(name, c), "starters": model_info.starters(engine.model),
            "embedding_words": model_info.embedding_words(engine.model),
            "context_starters": model_info.context_starters(engine.model),
            "fallback": config.fallback,
            "auth": {"api_key": bool(config.api_keys), "public_read_only": config.public_read_only}}


@router.get("/status", response_model=responses.Status, operation_id="getStatus", summary="How busy the server is")
def status(served: ServedDep) -> dict:
    """How busy the server is: texts generating and waiting their turn, texts open, and how
    many of the texts' searches went to the store shared with another text's."""
    return {**served.engine.status(), "open_texts": len(served.texts),
            "max_open_texts": served.config.max_open_texts}


@router.post("/compare", response_model=responses.Compare, operation_id="compareWithReference",
             summary="The engine's candidates beside the numpy reference's",
             responses=errors(*BODY, 501, 503, why={503: "a comparison is running (try again when it ends), "
                                                      "or the store failed"}))
def compare(body: CompareBody, served: ServedDep) -> dict:
    """The prompt through the engine and through the numpy reference: top-k side by side."""
    if served.reference is None:
        raise HTTPException(501, "this server was started without a reference checkpoint")
    if not served.comparing.acquire(blocking=False):  # each comparison reads the checkpoint: one at a time
        raise HTTPException(503, "a comparison is running: try again when it ends")
    try:
        return completion.compare(served.engine.open, served.reference, tokenizer.encode(body.prompt), body.top_k)
    finally:
        served.comparing.release()
