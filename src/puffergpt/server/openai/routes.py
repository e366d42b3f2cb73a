"""OpenAI-compatible routes for the clients people already use: ``/v1/models``,
``/v1/completions`` and ``/v1/chat/completions``, over the one completion path
(``completion.complete``).

- Log-probabilities are exact: the model's log-softmax over the whole vocabulary at
  temperature 1, from one search over every wte row a token (``wte.all`` in the request
  log). Sampling with ``top_p``, or at a temperature above 0 without ``top_k``, draws
  from that whole distribution too; ``top_k`` (as llama.cpp and vLLM take it) samples
  from a top-k search instead, which returns k rows, not 50,257.
- One choice is driven in one place, ``completion.choice_pieces``: it reads the steps of
  ``completion.complete`` and yields the text a client may see (UTF-8 whole across tokens,
  stop strings held back while they may be starting, and never returned) with each
  token's offset and log-probabilities. Streamed or not, the routes only render it.
- GPT-2 is not a chat model: ``/v1/chat/completions`` writes the messages as a plain-text
  transcript (``openai_bodies.chat_prompt``) and lets the model continue the assistant's turn,
  stopping at the next turn's prefix.
- A request's work is counted before anything runs (``check_work``: tokens read, scored
  and written over its choices, at most ``--max-request-tokens``; and the seconds they would
  take at the engine's measured pace, at most ``--max-request-seconds``: a 400 naming both
  limits, up front, ``search/pace.py``); a completion still
  running after ``--max-request-seconds``, or at shutdown, is ended (``streaming.py``):
  an error, and ``[DONE]`` when streamed. Whole answers stop when the client goes, too.
- Every error on ``/v1`` has OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``
  (``errors.py``); the bodies and the error are ``openai_bodies.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ValidationError

from puffergpt.model import tokenizer
from puffergpt.model.info import model_name
from puffergpt.search.engine import Engine
from puffergpt.search.pace import Work
from puffergpt.server.bodies import BodyError, parse_json
from puffergpt.server.openai.protocol import (
    ERROR_RESPONSES,
    MAX_CHOICES,
    TURN_STOPS,
    ChatBody,
    ChatResponse,
    CommonBody,
    CompletionBody,
    CompletionResponse,
    ErrorBody,
    ModelCard,
    ModelList,
    OpenAIError,
    body_schema,
    chat_prompt,
    without_no_ops,
)
from puffergpt.server.openai.render import (
    Choices,
    Reply,
    chat_events,
    completion_events,
    streamed,
    whole_chat,
    whole_completion,
)
from puffergpt.server.state import ConfigDep, EngineDep, GenerationsDep, ServerConfig
from puffergpt.server.streaming import finished
from puffergpt.stores.base import NoIndex
from puffergpt.texts.text import TextError, check_generation, check_token_ids

# Each operation id is OpenAI's own (its OpenAPI document's), so a client generated from
# /openapi.json names its methods as one generated from OpenAI's: create_completion, list_models, ...
router = APIRouter(tags=["openai"])
# with serve --api-key, every /v1 request wants it: OpenAI's 401
UNAUTHORIZED = {401: {"model": ErrorBody, "description": "no or a wrong API key (serve --api-key): send "
                                                         "Authorization: Bearer KEY"}}
V1_ERRORS = {**ERROR_RESPONSES, **UNAUTHORIZED}


def streamed_too(shape: type[BaseModel], chunks: str) -> dict:
    """A 200 that is ``shape`` as JSON, or with ``stream: true`` server-sent events."""
    return {"model": shape, "description": f"the {shape.__name__}; with stream: true, server-sent events instead",
            "content": {"text/event-stream": {"schema": {"type": "string", "description": chunks}}}}


# --- checks: each names the field at fault, in OpenAI's error shape ---

def check_model(engine: Engine, name: str | None) -> None:
    shown = model_name(engine.model)
    if name is not None and name not in (shown, engine.model):
        raise OpenAIError(404, f"the model {name!r} does not exist here: this server has {shown!r} "
                               f"(GET /v1/models)", "model", "model_not_found")


def body_of(kind: type[BaseModel]) -> Callable:
    """A dependency: the request's body as ``kind``, for this server's model."""
    async def parse(request: Request, engine: EngineDep) -> BaseModel:
        try:  # the app's one parser (the app's middleware ran it too: this router may run without it)
            raw = parse_json(await request.body())
        except BodyError as e:
            raise OpenAIError(400, e.message, e.param) from None
        if not isinstance(raw, dict):
            raise OpenAIError(400, "the body must be a JSON object")
        raw = without_no_ops(raw, kind.model_fields)
        try:
            body = kind.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            # OpenAI answers a value out of its bounds with a 400 naming the field, never 422
            raise OpenAIError(400, f"{where or 'the body'}: {first['msg']}", where.split(".")[0] or None) from None
        check_model(engine, body.model)
        return body
    return parse


def check_prompt(engine: Engine, config: ServerConfig, ids: list[int], body: CommonBody, max_tokens: int) -> None:
    """Before anything runs or streams: the prompt's ids, the sampling, the context, the limit."""
    try:
        check_token_ids(ids, engine.config.n_vocab)
    except TextError as e:
        raise OpenAIError(400, str(e), "prompt") from None
    check_generation(engine.config, body.sampling(engine.config.n_vocab), len(ids), max_tokens, config.max_new_tokens)


def clocked(request: Request, prompt_tokens: int) -> Callable[[], Callable]:
    """The request's prompt tokens counted, and a clock for each choice's tokens (``probes.Clock``):
    -> a new choice's ``on_step``."""
    metrics, route = request.app.state.metrics, request.scope["route"].path
    metrics.prompt_tokens.labels(metrics.model, route).inc(prompt_tokens)
    return lambda: metrics.clock(route).step


def opener(engine: Engine, body: CommonBody):
    """How each choice opens its text: with the request's ``output_search`` (the server's default
    when it names none). Approximate finds a top-k, so it needs one: top_k, or temperature 0."""
    if body.output_search is None:
        return engine.open
    if body.output_search == "approximate":
        if body.needs_full():
            raise OpenAIError(400, "output_search 'approximate' finds the next token among a top-k: give top_k "
                                   "(or temperature 0); sampling from every token needs every logit (exact)",
                              "output_search")
        logprobs = getattr(body, "logprobs", None)  # an int on /v1/completions (0 asks too), a bool on chat
        if (logprobs is not None and logprobs is not False) or (getattr(body, "best_of", None) or 1) > 1:
            raise OpenAIError(400, "output_search 'approximate' can't give log-probabilities (or best_of's ranking "
                                   "by them): their normaliser needs every token's score, which only exact search "
                                   "computes. Leave out output_search (each choice's output_search then says "
                                   "'exact'), or logprobs", "output_search")
        try:
            engine.output_index()
        except NoIndex as e:
            raise OpenAIError(400, str(e), "output_search") from None
    return partial(engine.open, output_search=body.output_search)


def check_work(engine: Engine, config: ServerConfig, lengths: list[int], choices: int, max_tokens: int,
               scored: bool) -> None:
    """The request's bound on work, before anything runs: the tokens its choices compute (each
    prompt token read, again each scored over the whole vocabulary with echo and logprobs,
    each new one), at most ``config.max_request_tokens``; and the time they would take at the
    engine's measured pace (``search/pace.py``), at most ``config.max_request_s``."""
    work = choices * sum(n * (2 if scored else 1) + max_tokens for n in lengths)
    check_time(engine, config, Work(choices * sum(lengths), choices * sum(lengths) if scored else 0,
                                    choices * len(lengths) * max_tokens), work)
    if work > config.max_request_tokens:
        how = " read and scored over the whole vocabulary (echo with logprobs)" if scored else " read"
        raise OpenAIError(400, f"this request would compute {work:,} tokens ({len(lengths)} prompt(s) of "
                               f"{sum(lengths):,} tokens in all{how}, {max_tokens} new tokens a choice, "
                               f"{choices} choice(s) a prompt); this server computes at most "
                               f"{config.max_request_tokens:,} a request (puffergpt serve --max-request-tokens): "
                               "send fewer or shorter prompts a request (lm-eval: a smaller --batch_size), "
                               "or fewer choices or new tokens", "prompt", "request_too_large")


PACE_UNITS = {"read": "prompt token read", "scored": "position scored", "new": "new token"}


def check_time(engine: Engine, config: ServerConfig, work: Work, tokens: int) -> None:
    """A 400 naming both limits for work inside the token budget that could not finish in time."""
    limit = config.max_request_s
    seconds = engine.pace.estimate(work) if limit else None
    if seconds is None or seconds <= limit or tokens > config.max_request_tokens:
        return  # nothing measured yet, in time, or over the budget (said next)
    pace = ", ".join(f"{s * 1e3:,.1f} ms a {PACE_UNITS[k]}" for k, s in engine.pace.seconds().items())
    raise OpenAIError(400, f"this request would compute {tokens:,} tokens, within this server's "
                           f"{config.max_request_tokens:,} a request (puffergpt serve --max-request-tokens), but "
                           f"take about {seconds:,.0f} s at its measured pace ({pace}), over its limit of "
                           f"{limit:g} s a request (puffergpt serve --max-request-seconds): send fewer or shorter "
                           "prompts a request (lm-eval: a smaller --batch_size), or fewer choices or new tokens",
                      "prompt", "request_too_long")


# --- the routes ---

def model_card(engine: Engine) -> dict:
    return {"id": model_name(engine.model), "object": "model", "created": 0, "owned_by": "puffergpt",
            "max_model_len": engine.config.n_ctx}


@router.get("/v1/models", operation_id="listModels", summary="List the models",
            responses={200: {"model": ModelList}, **UNAUTHORIZED})
async def models(engine: EngineDep):
    """The one model this server has, as OpenAI lists models."""
    return {"object": "list", "data": [model_card(engine)]}


@router.get("/v1/models/{model_id:path}", operation_id="retrieveModel", summary="Retrieve a model",
            responses={200: {"model": ModelCard}, 404: ERROR_RESPONSES[404], **UNAUTHORIZED})
async def model(model_id: str, engine: EngineDep):
    """The model of this id, or a 404 (code model_not_found) naming the one this server has."""
    check_model(engine, model_id)
    return model_card(engine)


@router.post("/v1/completions", operation_id="createCompletion", openapi_extra=body_schema(CompletionBody),
             summary="Create a completion", responses={200: streamed_too(CompletionResponse, "data: lines, each a "
                                                       "CompletionResponse chunk, then data: [DONE]"), **V1_ERRORS})
async def completions(body: Annotated[CompletionBody, Depends(body_of(CompletionBody))], engine: EngineDep,
                      config: ConfigDep, generations: GenerationsDep, request: Request):
    """OpenAI's legacy completions: a prompt (or several, or token ids) continued, with exact
    log-probabilities, echo, stop strings and n choices."""
    n, best_of = body.choices()
    prompts = body.prompt_ids()
    if len(prompts) * best_of > MAX_CHOICES:
        raise OpenAIError(400, f"{len(prompts)} prompts x {best_of} choices is over {MAX_CHOICES} a request: send "
                               f"fewer prompts a request (lm-eval: --batch_size {MAX_CHOICES} or less)", "prompt")
    for ids in prompts:
        check_prompt(engine, config, ids, body, body.new_tokens())
    open_run = opener(engine, body)
    check_work(engine, config, list(map(len, prompts)), best_of, body.new_tokens(),
               body.echo and body.logprobs is not None)
    how = Choices(open_run, engine.config.n_vocab, body, body.new_tokens(), body.stop,
                  body.needs_full() or best_of > n, body.echo, body.logprobs, clocked(request, sum(map(len, prompts))))
    reply = Reply(f"cmpl-{uuid.uuid4().hex[:24]}", "text_completion", model_name(engine.model))
    if body.stream:
        return streamed(generations, partial(completion_events, how, reply, prompts, n), config.max_request_s)
    return await finished(generations, partial(whole_completion, how, reply, prompts, n, best_of),
                          config.max_request_s, request.receive)


@router.post("/v1/chat/completions", operation_id="createChatCompletion", openapi_extra=body_schema(ChatBody),
             summary="Create a chat completion", responses={200: streamed_too(ChatResponse, "data: lines, each a "
                                                            "chat.completion.chunk, then data: [DONE]"), **V1_ERRORS})
async def chat(body: Annotated[ChatBody, Depends(body_of(ChatBody))], engine: EngineDep, config: ConfigDep,
               generations: GenerationsDep, request: Request):
    """The messages written as a plain-text transcript that GPT-2 continues as the
    assistant, stopping at the next turn."""
    ids = tokenizer.encode(chat_prompt(body.messages))
    check_prompt(engine, config, ids, body, body.new_tokens())
    check_work(engine, config, [len(ids)], body.n or 1, body.new_tokens(), False)
    how = Choices(opener(engine, body), engine.config.n_vocab, body, body.new_tokens(), body.stop + TURN_STOPS,
                  body.needs_full(), False, body.top_logprobs_k(), clocked(request, len(ids)))
    reply = Reply(f"chatcmpl-{uuid.uuid4().hex[:24]}", "chat.completion.chunk", model_name(engine.model))
    if body.stream:
        return streamed(generations, partial(chat_events, how, reply, ids, body.n or 1), config.max_request_s)
    return await finished(generations, partial(whole_chat, how, reply, ids, body.n or 1), config.max_request_s,
                          request.receive)


@router.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
async def unknown(path: str):
    raise OpenAIError(404, f"no route /v1/{path}: this server has /v1/models, /v1/completions and "
                           f"/v1/chat/completions", code="unknown_url")
