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
  and written over its choices, at most ``--max-request-tokens``); a completion still
  running after ``--max-request-seconds``, or at shutdown, is ended (``streaming.py``):
  an error, and ``[DONE]`` when streamed. Whole answers stop when the client goes, too.
- Every error on ``/v1`` has OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``
  (``errors.py``); the bodies and the error are ``openai_bodies.py``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ValidationError

from puffergpt import tokenizer
from puffergpt.completion import Piece, Usage, choice_pieces
from puffergpt.engine import Engine
from puffergpt.model_info import model_name
from puffergpt.server.bodies import BodyError, parse_json
from puffergpt.server.openai_bodies import (
    ERROR_RESPONSES,
    MAX_CHOICES,
    TURN_STOPS,
    ChatBody,
    ChatResponse,
    CommonBody,
    CompletionBody,
    CompletionResponse,
    ModelCard,
    ModelList,
    OpenAIError,
    body_schema,
    chat_prompt,
    without_no_ops,
)
from puffergpt.server.state import ConfigDep, EngineDep, GenerationsDep, ServerConfig
from puffergpt.server.streaming import Ending, Generations, finished, stream
from puffergpt.stores.base import StoreError
from puffergpt.text import Step, TextError, check_generation, check_token_ids

# Each operation id is OpenAI's own (its OpenAPI document's), so a client generated from
# /openapi.json names its methods as one generated from OpenAI's: create_completion, list_models, ...
router = APIRouter(tags=["openai"])


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


def check_work(config: ServerConfig, lengths: list[int], choices: int, max_tokens: int, scored: bool) -> None:
    """The request's bound on work, before anything runs: the tokens its choices compute (each
    prompt token read, again each scored over the whole vocabulary with echo and logprobs,
    each new one), at most ``config.max_request_tokens``."""
    work = choices * sum(n * (2 if scored else 1) + max_tokens for n in lengths)
    if work > config.max_request_tokens:
        how = " read and scored over the whole vocabulary (echo with logprobs)" if scored else " read"
        raise OpenAIError(400, f"this request would compute {work:,} tokens ({len(lengths)} prompt(s) of "
                               f"{sum(lengths):,} tokens in all{how}, {max_tokens} new tokens a choice, "
                               f"{choices} choice(s) a prompt); this server computes at most "
                               f"{config.max_request_tokens:,} a request (puffergpt serve --max-request-tokens): "
                               "send fewer or shorter prompts a request (lm-eval: a smaller --batch_size), "
                               "or fewer choices or new tokens", "prompt", "request_too_large")


# --- one request's choices, written and rendered ---

@dataclass
class Choices:
    """How each choice of one request is written (``completion.choice_pieces``'s arguments)."""

    open_products: Callable
    n_vocab: int
    body: CommonBody
    max_tokens: int
    stops: list[str]
    full: bool
    echo: bool
    k: int | None  # log-probabilities' alternatives a token; None: none asked for

    def pieces(self, ids: list[int], j: int, should_stop: Callable[[], bool]) -> Iterator[Piece]:
        """Choice j (its seed offset) of the prompt ``ids``, until ``should_stop()`` (checked
        before each piece: each echoed token is one)."""
        pieces = choice_pieces(self.open_products, ids, self.max_tokens, self.body.sampling(self.n_vocab, j),
                               self.stops, self.full, self.echo, self.k, should_stop)
        with contextlib.closing(pieces):  # closed here, in the thread that drove it
            while not should_stop():
                pc = next(pieces, None)
                if pc is None:
                    return
                yield pc

    def assistant(self, ids: list[int], j: int, should_stop: Callable[[], bool]) -> Iterator[Piece]:
        """A chat's choice: the assistant's text without the space after its prefix."""
        started = False
        for pc in self.pieces(ids, j, should_stop):
            if not started:
                pc.text = pc.text.lstrip(" ")
                started = bool(pc.text)
            yield pc


@dataclass
class Reply:
    """The envelope of one response's objects: its id, time, kind and model."""

    id: str
    kind: str
    model: str
    created: int = 0

    def __post_init__(self):
        self.created = self.created or int(time.time())

    def chunk(self, choices: list[dict], kind: str | None = None, **extra) -> dict:
        return {"id": self.id, "object": kind or self.kind, "created": self.created, "model": self.model,
                "choices": choices, **extra}


DONE = "data: [DONE]\n\n"


def farewell(why: Ending) -> str:
    """The last events of a stream the server ends (its time limit, its shutdown)."""
    return _sse(OpenAIError(why.status, why.message, code=why.code, kind=why.kind).body()) + DONE


def streamed(generations: Generations, produce: Callable[[threading.Event], Iterator[str]],
             limit_s: float | None) -> StreamingResponse:
    """Server-sent events in OpenAI's shape, ending with ``[DONE]``; an error mid-stream is
    an error event (the status went out with the first byte), then ``[DONE]``."""
    def safe(stop: threading.Event) -> Iterator[str]:
        try:
            yield from produce(stop)
            yield DONE
        except (TextError, StoreError) as e:
            yield _sse(OpenAIError(400 if isinstance(e, TextError) else 503, str(e),
                                   kind="invalid_request_error" if isinstance(e, TextError) else "server_error").body())
            yield DONE
    return stream(generations, safe, farewell=farewell, limit_s=limit_s)


# --- rendering ---

def _top(e: dict) -> dict | None:
    """The k most likely tokens, and the chosen one after them when it is not among them (OpenAI's
    "up to logprobs + 1"): ``logprobs: 0`` gives the chosen token alone. None where nothing is scored."""
    if e["top"] is None:
        return None
    top = {tokenizer.token_text(i): lp for i, lp in e["top"]}
    top.setdefault(e["token"], e["logprob"])
    return top


def _completion_logprobs(tokens: list[dict]) -> dict:
    return {"tokens": [e["token"] for e in tokens], "token_logprobs": [e["logprob"] for e in tokens],
            "top_logprobs": [_top(e) for e in tokens],
            "text_offset": [e["offset"] for e in tokens]}


def _chat_logprobs(tokens: list[dict]) -> dict:
    def one(i: int, lp: float) -> dict:
        return {"token": tokenizer.token_text(i), "logprob": lp, "bytes": list(tokenizer.token_bytes(i))}
    return {"content": [{**one(e["token_id"], e["logprob"]), "top_logprobs": [one(i, lp) for i, lp in e["top"] or []]}
                        for e in tokens]}


def _usage(prompt_tokens: int, steps: list[Step]) -> dict:
    """OpenAI's usage, and beside it (a key of ours, which clients ignore) what the
    searches behind the answer cost: ``{"usage": ..., "puffergpt": ...}``."""
    generated = sum(1 for st in steps if st.phase != "prompt")
    use = Usage.of(steps)
    return {"usage": {"prompt_tokens": prompt_tokens, "completion_tokens": generated,
                      "total_tokens": prompt_tokens + generated},
            "puffergpt": {"requests": use.requests, "round_trips": use.round_trips, "bytes": use.bytes,
                          "cost_usd": use.cost_usd,
                          "all_vocabulary_searches": sum(r.kind == "wte.all" for st in steps for r in st.requests)}}


def _sse(d: dict) -> str:
    return f"data: {json.dumps(d)}\n\n"


def completion_events(how: Choices, reply: Reply, prompts: list[list[int]], n: int,
                      stop: threading.Event) -> Iterator[str]:
    """/v1/completions streamed: each choice's pieces, then its finish, then the usage if asked."""
    steps = []
    for pi, ids in enumerate(prompts):
        for j in range(n):
            for pc in how.pieces(ids, j, stop.is_set):
                steps += pc.steps
                lp = None if how.k is None else _completion_logprobs(pc.tokens)
                if pc.text or pc.tokens:
                    yield _sse(reply.chunk([{"text": pc.text, "index": pi * n + j, "logprobs": lp,
                                             "finish_reason": None}]))
                if pc.finish:
                    yield _sse(reply.chunk([{"text": "", "index": pi * n + j, "logprobs": None,
                                             "finish_reason": pc.finish}]))
    if (how.body.stream_options or {}).get("include_usage"):
        yield _sse(reply.chunk([], **_usage(sum(map(len, prompts)), steps)))


def whole_completion(how: Choices, reply: Reply, prompts: list[list[int]], n: int, best_of: int,
                     stop: threading.Event) -> dict:
    """/v1/completions at once: best_of choices a prompt written, the n most likely returned."""
    choices, steps = [], []
    for pi, ids in enumerate(prompts):
        got = []
        for j in range(best_of):
            ps = list(how.pieces(ids, j, stop.is_set)) or [Piece("", finish="length")]  # none: stopped
            steps += [st for p in ps for st in p.steps]
            tokens = [e for p in ps for e in p.tokens]
            score = sum(st.logprob for p in ps for st in p.steps if st.phase != "prompt" and st.logprob is not None)
            got.append((score, {"text": "".join(p.text for p in ps),
                                "logprobs": None if how.k is None else _completion_logprobs(tokens),
                                "finish_reason": ps[-1].finish}))
        if best_of > n:  # the n with the highest total log-probability, as OpenAI's best_of
            got = sorted(got, key=lambda g: -g[0])[:n]
        choices += [{"index": pi * n + j, **c} for j, (_, c) in enumerate(got)]
    return reply.chunk(choices, **_usage(sum(map(len, prompts)), steps))


def chat_events(how: Choices, reply: Reply, ids: list[int], n: int, stop: threading.Event) -> Iterator[str]:
    """/v1/chat/completions streamed: a role delta, the content deltas, the finish, a choice at a time."""
    steps = []
    for j in range(n):
        yield _sse(reply.chunk([{"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]))
        for pc in how.assistant(ids, j, stop.is_set):
            steps += pc.steps
            if pc.text or pc.tokens:
                yield _sse(reply.chunk([{"index": j, "delta": {"content": pc.text}, "finish_reason": None,
                                         "logprobs": None if how.k is None else _chat_logprobs(pc.tokens)}]))
            if pc.finish:
                yield _sse(reply.chunk([{"index": j, "delta": {}, "logprobs": None, "finish_reason": pc.finish}]))
    if (how.body.stream_options or {}).get("include_usage"):
        yield _sse(reply.chunk([], **_usage(len(ids), steps)))


def whole_chat(how: Choices, reply: Reply, ids: list[int], n: int, stop: threading.Event) -> dict:
    choices, steps = [], []
    for j in range(n):
        ps = list(how.assistant(ids, j, stop.is_set)) or [Piece("", finish="length")]  # none: stopped
        steps += [st for p in ps for st in p.steps]
        choices.append({"index": j, "message": {"role": "assistant", "content": "".join(p.text for p in ps)},
                        "logprobs": None if how.k is None else _chat_logprobs([e for p in ps for e in p.tokens]),
                        "finish_reason": ps[-1].finish})
    return reply.chunk(choices, "chat.completion", **_usage(len(ids), steps))


# --- the routes ---

def model_card(engine: Engine) -> dict:
    return {"id": model_name(engine.model), "object": "model", "created": 0, "owned_by": "puffergpt"}


@router.get("/v1/models", operation_id="listModels", responses={200: {"model": ModelList}})
async def models(engine: EngineDep):
    return {"object": "list", "data": [model_card(engine)]}


@router.get("/v1/models/{model_id:path}", operation_id="retrieveModel",
            responses={200: {"model": ModelCard}, 404: ERROR_RESPONSES[404]})
async def model(model_id: str, engine: EngineDep):
    check_model(engine, model_id)
    return model_card(engine)


@router.post("/v1/completions", operation_id="createCompletion", openapi_extra=body_schema(CompletionBody),
             responses={200: {"model": CompletionResponse}, **ERROR_RESPONSES})
async def completions(body: Annotated[CompletionBody, Depends(body_of(CompletionBody))], engine: EngineDep,
                      config: ConfigDep, generations: GenerationsDep, request: Request):
    n, best_of = body.choices()
    prompts = body.prompt_ids()
    if len(prompts) * best_of > MAX_CHOICES:
        raise OpenAIError(400, f"{len(prompts)} prompts x {best_of} choices is over {MAX_CHOICES} a request: send "
                               f"fewer prompts a request (lm-eval: --batch_size {MAX_CHOICES} or less)", "prompt")
    for ids in prompts:
        check_prompt(engine, config, ids, body, body.new_tokens())
    check_work(config, list(map(len, prompts)), best_of, body.new_tokens(), body.echo and body.logprobs is not None)
    how = Choices(engine.open, engine.config.n_vocab, body, body.new_tokens(), body.stop,
                  body.needs_full() or best_of > n, body.echo, body.logprobs)
    reply = Reply(f"cmpl-{uuid.uuid4().hex[:24]}", "text_completion", model_name(engine.model))
    if body.stream:
        return streamed(generations, partial(completion_events, how, reply, prompts, n), config.max_request_s)
    return await finished(generations, partial(whole_completion, how, reply, prompts, n, best_of),
                          config.max_request_s, request.receive)


@router.post("/v1/chat/completions", operation_id="createChatCompletion", openapi_extra=body_schema(ChatBody),
             responses={200: {"model": ChatResponse}, **ERROR_RESPONSES})
async def chat(body: Annotated[ChatBody, Depends(body_of(ChatBody))], engine: EngineDep, config: ConfigDep,
               generations: GenerationsDep, request: Request):
    ids = tokenizer.encode(chat_prompt(body.messages))
    check_prompt(engine, config, ids, body, body.new_tokens())
    check_work(config, [len(ids)], body.n or 1, body.new_tokens(), False)
    how = Choices(engine.open, engine.config.n_vocab, body, body.new_tokens(), body.stop + TURN_STOPS,
                  body.needs_full(), False, body.top_logprobs_k())
    reply = Reply(f"chatcmpl-{uuid.uuid4().hex[:24]}", "chat.completion.chunk", model_name(engine.model))
    if body.stream:
        return streamed(generations, partial(chat_events, how, reply, ids, body.n or 1), config.max_request_s)
    return await finished(generations, partial(whole_chat, how, reply, ids, body.n or 1), config.max_request_s,
                          request.receive)


@router.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
async def unknown(path: str):
    raise OpenAIError(404, f"no route /v1/{path}: this server has /v1/models, /v1/completions and "
                           f"/v1/chat/completions", code="unknown_url")
