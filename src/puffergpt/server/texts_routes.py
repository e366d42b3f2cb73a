"""The playground's texts: open one, show it, edit it, generate (server-sent events),
stop, close, and look inside (a position's attention and lens, the key namespace).
Each route parses, calls the text (which keeps its own rules: no edit while it
generates, token ids, the context), and renders (``render.py``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from fastapi import APIRouter

from puffergpt import inspector, output_search, tokenizer, views
from puffergpt.sampling import Sampling
from puffergpt.server import responses
from puffergpt.server.bodies import AppendBody, BranchBody, CreateBody, PositionBody, SamplingBodyInspect
from puffergpt.server.render import inspect_json, request_json, sse, step_json, text_json
from puffergpt.server.state import ConfigDep, GenerationsDep, TextDep, TextsDep
from puffergpt.server.streaming import stream
from puffergpt.stores.base import StoreError
from puffergpt.text import Text, TextError, check_generation

router = APIRouter(prefix="/api/texts")


@router.post("", status_code=201, response_model=responses.TextView)
def create(body: CreateBody, texts: TextsDep) -> dict:
    """A new text; with ``reopen``, the one another server held (``Texts.reopen``): one prefill
    and one top-k search, counted in ``reopened``."""
    ids = tokenizer.encode(body.prompt) if body.prompt is not None else body.prompt_ids  # ids: checked by the text
    if body.reopen is None:
        return text_json(texts.create(ids))
    t0 = time.perf_counter()
    generated = {g.position: g.temperature for g in body.reopen.generated}
    text, requests = texts.reopen(ids, body.reopen.length, generated)
    with text.lock:
        return text_json(text) | {"reopened": {
            "read": text.read_upto, "requests": len(requests), "round_trips": sum(r.round_trips for r in requests),
            "ms": round((time.perf_counter() - t0) * 1e3, 1)}}


@router.get("/{text_id}", response_model=responses.TextView)
def show(t: TextDep) -> dict:
    with t.lock:  # a generation in another thread adds steps between tokens
        return text_json(t)


@router.delete("/{text_id}", response_model=responses.Closed)
def close(text_id: str, texts: TextsDep) -> dict:
    texts.close(text_id)  # TextNotFound: a 404 (errors.py)
    return {"closed": text_id}


# --- edits: the text refuses them while it generates (409) ---

def edited(t: Text) -> dict:
    with t.lock:
        return text_json(t)


@router.post("/{text_id}/append", response_model=responses.TextView)
def append(body: AppendBody, t: TextDep) -> dict:
    t.append(tokenizer.encode(body.text))
    return edited(t)


@router.post("/{text_id}/step_back", response_model=responses.TextView)
def step_back(body: PositionBody, t: TextDep) -> dict:
    t.step_back(body.position)
    return edited(t)


@router.post("/{text_id}/step_forward", response_model=responses.TextView)
def step_forward(body: PositionBody, t: TextDep) -> dict:
    t.step_forward(body.position)
    return edited(t)


@router.post("/{text_id}/cut", response_model=responses.TextView)
def cut(body: PositionBody, t: TextDep) -> dict:
    t.cut(body.position)
    return edited(t)


@router.post("/{text_id}/branch", response_model=responses.TextView)
def branch(body: BranchBody, t: TextDep) -> dict:
    t.branch(body.position, token_id=body.token_id, rank=body.rank)
    return edited(t)


# --- generating ---

@router.post("/{text_id}/stop", response_model=responses.Stopping)
def stop(text_id: str, t: TextDep) -> dict:
    t.stop()
    return {"stopping": text_id}


def generation_events(t: Text, n: int, s: Sampling, inspect: int, stop: threading.Event) -> Iterator[str]:
    """A generation's events, in its worker thread: ``token`` each, then ``done`` or ``error``."""
    t0, count, requests = time.perf_counter(), 0, 0
    try:
        steps = (inspector.generate(t, n, s, inspect, should_stop=stop.is_set) if inspect else
                 t.generate(n, s, should_stop=stop.is_set))
        for step in steps:
            count, requests = count + 1, requests + len(step.requests)
            yield sse("token", step_json(step))
        with t.lock:
            done = text_json(t, full=False)  # each step came with its token: not again
        yield sse("done", {"tokens": count, "requests": requests, "ms": round((time.perf_counter() - t0) * 1e3, 1),
                           "stopped": stop.is_set(), "text": done})
    except (TextError, StoreError) as e:
        yield sse("error", {"detail": str(e)})


@router.post("/{text_id}/generate")
def generate(body: SamplingBodyInspect, t: TextDep, config: ConfigDep, generations: GenerationsDep):
    """Server-sent events: ``token`` for each new token, then ``done`` (or ``error``: also
    when the server ends it, past ``--max-request-seconds`` or at shutdown). With
    ``inspect``, each token also carries its attention and lens."""
    s = check_generation(t.config, Sampling(body.temperature, body.top_k, body.seed), t.length, body.max_tokens,
                         config.max_new_tokens)  # errors before the stream are plain 4xx
    if body.output_search is not None:
        output_search.choose(t, body.output_search)  # 400 naming the command where there is no index
    stop_event = t.begin()  # 409 if it is generating already
    inspect = body.lens_k if body.inspect else 0
    return stream(generations, lambda stop: generation_events(t, body.max_tokens, s, inspect, stop),
                  stop=stop_event, on_end=t.end, farewell=lambda why: sse("error", {"detail": why.message}),
                  limit_s=config.max_request_s)


# --- inside the transformer: each view is searches, counted ---

@router.get("/{text_id}/steps/{position}/inspect", response_model=responses.Inspection)
def inspect(position: int, t: TextDep, lens_k: int = 10) -> dict:
    """The view from the token at position - 1, whose output predicts ``position``:
    attention per layer and head over 0..position-1, and the logit lens."""
    got, requests, recomputed = inspector.inspect(t, position, lens_k)
    with t.lock:
        return inspect_json(got, t, position, requests, recomputed)


@router.get("/{text_id}/kv", response_model=responses.KV)
def kv(t: TextDep) -> dict:
    """The text's key namespace: which positions hold keys, and which read wrote them."""
    with t.lock, t.products.recording() as requests:
        d = views.kv(t)
    d["requests"] = [request_json(r) for r in requests]
    return d
