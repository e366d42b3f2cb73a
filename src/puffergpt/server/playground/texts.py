"""The playground's texts: open one, show it, edit it, generate (server-sent events),
stop, close, and look inside (a position's attention and lens, the key namespace).
Each route parses, calls the text (which keeps its own rules: no edit while it
generates, token ids, the context), and renders (``app/protocol.py``'s JSON)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from puffergpt.app.protocol import (
    ablation_json,
    inspect_json,
    probabilities_json,
    step_json,
    text_json,
    view_json,
    writes_json,
)
from puffergpt.lens import inspector, output_search, views
from puffergpt.model import tokenizer
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import KeysExpired
from puffergpt.server.bodies import (
    AblateBody,
    AppendBody,
    BranchBody,
    CreateBody,
    PositionBody,
    SamplingBodyInspect,
    WritesBody,
)
from puffergpt.server.playground import responses
from puffergpt.server.playground.responses import BODY, errors
from puffergpt.server.processes import probes
from puffergpt.server.state import ConfigDep, GenerationsDep, TextDep, TextsDep
from puffergpt.server.streaming import sse, stream
from puffergpt.stores.base import StoreError
from puffergpt.texts import probabilities
from puffergpt.texts.text import Text, TextError, check_generation

router = APIRouter(prefix="/api/texts", tags=["texts"])
EDIT = errors(*BODY, 404, 409)  # an edit: its body, the text, not while it generates


@router.post("", status_code=201, response_model=responses.TextView, operation_id="createText",
             summary="Open a text from a prompt", responses=errors(*BODY, 503))
def create(body: CreateBody, texts: TextsDep) -> dict:
    """A new text; with ``reopen``, the one another server held (``Texts.reopen``): one prefill
    and one top-k search, counted in ``reopened``."""
    ids = tokenizer.encode(body.prompt) if body.prompt is not None else body.prompt_ids  # ids: checked by the text
    if body.reopen is None:
        return text_json(texts.create(ids))
    t0 = time.perf_counter()
    generated = {g.position: g.sampling() for g in body.reopen.generated}
    text, requests = texts.reopen(ids, body.reopen.length, generated)
    with text.lock:
        return text_json(text) | {"reopened": {
            "read": text.read_upto, "requests": len(requests), "round_trips": sum(r.round_trips for r in requests),
            "ms": round((time.perf_counter() - t0) * 1e3, 1)}}


@router.get("/{text_id}", response_model=responses.TextView, operation_id="getText", summary="Show a text",
            responses=errors(404))
def show(t: TextDep) -> dict:
    """The text's tokens, how far the model has read, and each generated position's step."""
    with t.lock:  # a generation in another thread adds steps between tokens
        return text_json(t)


@router.delete("/{text_id}", response_model=responses.Closed, operation_id="closeText", summary="Close a text",
               responses=errors(403, 404))
def close(text_id: str, texts: TextsDep) -> dict:
    """Close the text: its key namespace is dropped."""
    texts.close(text_id)  # TextNotFound: a 404 (errors.py)
    return {"closed": text_id}


# --- edits: the text refuses them while it generates (409) ---

def edited(t: Text) -> dict:
    with t.lock:
        return text_json(t)


@router.post("/{text_id}/append", response_model=responses.TextView, operation_id="appendToText",
             summary="Append text to a text", responses=EDIT)
def append(body: AppendBody, t: TextDep) -> dict:
    """The text's tokens of ``text`` added at its end (read by the next generation)."""
    t.append(tokenizer.encode(body.text))
    return edited(t)


@router.post("/{text_id}/step_back", response_model=responses.TextView, operation_id="stepBack",
             summary="Step back to a position", responses=EDIT)
def step_back(body: PositionBody, t: TextDep) -> dict:
    """Back to ``position``: the tokens after it are kept, to step forward again."""
    t.step_back(body.position)
    return edited(t)


@router.post("/{text_id}/step_forward", response_model=responses.TextView, operation_id="stepForward",
             summary="Step forward again to a position", responses=EDIT)
def step_forward(body: PositionBody, t: TextDep) -> dict:
    """Forward again to ``position``, over tokens kept by a step back."""
    t.step_forward(body.position)
    return edited(t)


@router.post("/{text_id}/cut", response_model=responses.TextView, operation_id="cutText",
             summary="Cut a text at a position", responses=EDIT)
def cut(body: PositionBody, t: TextDep) -> dict:
    """The tokens from ``position`` on dropped."""
    t.cut(body.position)
    return edited(t)


@router.post("/{text_id}/branch", response_model=responses.TextView, operation_id="branchText",
             summary="Choose another candidate at a position", responses=EDIT)
def branch(body: BranchBody, t: TextDep) -> dict:
    """At ``position``, another of its candidates (by ``token_id`` or ``rank``); the tokens after it go."""
    t.branch(body.position, token_id=body.token_id, rank=body.rank)
    return edited(t)


# --- generating ---

@router.post("/{text_id}/stop", response_model=responses.Stopping, operation_id="stopGeneration",
             summary="Stop a text's generation", responses=errors(403, 404))
def stop(text_id: str, t: TextDep) -> dict:
    """Ask the text's generation to stop: it ends within a token."""
    t.stop()
    return {"stopping": text_id}


def generation_events(t: Text, n: int, s: Sampling, inspect: int, stop: threading.Event,
                      clock: probes.Clock) -> Iterator[str]:
    """A generation's events, in its worker thread: ``token`` each, then ``done`` or ``error``;
    each token timed and counted on ``clock`` (/metrics)."""
    t0, count, requests = time.perf_counter(), 0, 0
    try:
        steps = (inspector.generate(t, n, s, inspect, should_stop=stop.is_set) if inspect else
                 t.generate(n, s, should_stop=stop.is_set))
        for step in steps:
            if step.phase == "prefill":
                clock.prompt(step.read)
            clock.tick()
            count, requests = count + 1, requests + len(step.requests)
            yield sse("token", step_json(step))
        with t.lock:
            done = text_json(t, full=False)  # each step came with its token: not again
        yield sse("done", {"tokens": count, "requests": requests, "ms": round((time.perf_counter() - t0) * 1e3, 1),
                           "stopped": stop.is_set(), "text": done})
    except KeysExpired as e:  # gone on every server alike: the page reopens the text and carries on
        yield sse("error", {"detail": str(e), "code": "text_not_found"})
    except (TextError, StoreError) as e:
        yield sse("error", {"detail": str(e)})


@router.post("/{text_id}/generate", operation_id="generateText", summary="Generate tokens (server-sent events)",
             response_class=StreamingResponse, responses={200: responses.event_stream(
                 "event: token (a step as JSON) for each new token, then event: done, or event: error with its detail"),
                 **EDIT})
def generate(body: SamplingBodyInspect, t: TextDep, config: ConfigDep, generations: GenerationsDep,
             request: Request):
    """Server-sent events: ``token`` for each new token, then ``done`` (or ``error``: also
    when the server ends it, past ``--max-request-seconds`` or at shutdown). With
    ``inspect``, each token also carries its attention and lens."""
    s = check_generation(t.config, body.sampling(), t.length, body.max_tokens,
                         config.max_new_tokens)  # errors before the stream are plain 4xx
    if body.output_search is not None:
        output_search.choose(t, body.output_search)  # 400 naming the command where there is no index
    stop_event = t.begin()  # 409 if it is generating already
    inspect = body.lens_k if body.inspect else 0
    clock = request.app.state.metrics.clock(request.scope["route"].path)
    return stream(generations, lambda stop: generation_events(t, body.max_tokens, s, inspect, stop, clock),
                  stop=stop_event, on_end=t.end, farewell=lambda why: sse("error", {"detail": why.message}),
                  limit_s=config.max_request_s)


# --- inside the transformer: each view is searches, counted ---

@router.get("/{text_id}/steps/{position}/inspect", response_model=responses.Inspection, operation_id="inspectPosition",
            summary="Look inside the model at a position", responses=errors(400, 404, 422, 503))
def inspect(position: int, t: TextDep, lens_k: int = 10, versus: int | None = None, pushing: bool = False) -> dict:
    """The view from the token at position - 1: attention per head, the logit lens, what each
    part adds to the token's logit and to its lead over ``versus`` (default: the runner-up), the
    MLP's most active neurons, and with ``pushing`` those pushing the token most."""
    got, requests, recomputed = inspector.inspect(t, position, lens_k, versus=versus, pushing=pushing)
    with t.lock:
        return inspect_json(got, t, position, requests, recomputed)


@router.post("/{text_id}/steps/{position}/ablate", response_model=responses.Ablated, operation_id="ablateStep",
             summary="Run a step again with parts of the model switched off", responses=errors(400, 404, 409, 422, 503))
def ablate(position: int, body: AblateBody, t: TextDep, texts: TextsDep) -> dict:
    """The step at ``position`` run again with ``parts`` switched off at every position (a
    prefill of the tokens before it, in a run of its own: the text is left as it was): the
    k best candidates before and after, and whether the model's top choice changed."""
    return ablation_json(inspector.ablate(t, position, body.parts, texts.open_run, body.k, body.mode))


@router.post("/{text_id}/steps/{position}/probabilities", response_model=responses.Probabilities,
             operation_id="stepProbabilities", summary="A step's candidates' probabilities over the whole vocabulary",
             responses=errors(*BODY, 404, 503))
def step_probabilities(position: int, t: TextDep) -> dict:
    """Each candidate of the step at ``position`` with its probability over all n_vocab tokens (the model's own:
    one search over every token vector, once a step, marked extra) beside the sampler's over the top k."""
    requests = probabilities.normalise(t, position)
    with t.lock:
        return probabilities_json(t.steps[position], t.config.n_vocab, requests)


@router.post("/{text_id}/steps/{position}/writes", response_model=responses.Writes, operation_id="headWrites",
             summary="What a head writes from each position it attends to", responses=errors(*BODY, 404, 409, 503))
def head_writes(position: int, body: WritesBody, t: TextDep) -> dict:
    """What head ``head`` ("L.H") writes at the token at position - 1, a piece a source position: its weight,
    its effect on the logit of the token at ``position`` (the attribution's reading: the pieces sum to the head's
    part) and the tokens it pushes most (a top-k search over the token vectors)."""
    got, requests = inspector.head_writes(t, position, body.head)
    with t.lock:
        return writes_json(got, t.tokens, requests)


@router.get("/{text_id}/kv", response_model=responses.KV, operation_id="getKeys", summary="A text's key namespace",
            responses=errors(404, 503))
def kv(t: TextDep) -> dict:
    """The text's key namespace: which positions hold keys, and which read wrote them."""
    with t.lock, t.session.recording() as requests:
        d = views.kv(t)
    return view_json(d, requests)
