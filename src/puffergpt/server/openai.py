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
  transcript (``chat_prompt``) and lets the model continue the assistant's turn,
  stopping at the next turn's prefix.
- Every error on ``/v1`` has OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Callable, Iterator, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.concurrency import run_in_threadpool

from puffergpt import tokenizer
from puffergpt.completion import Piece, Usage, choice_pieces
from puffergpt.model_info import model_name
from puffergpt.sampling import Sampling
from puffergpt.server.bodies import MAX_NEW_TOKENS, MAX_PROMPT_CHARS, BodyError, parse_json
from puffergpt.stores.base import StoreError
from puffergpt.text import Step, TextBusy, TextError, check_generation

MAX_LOGPROBS = 5  # OpenAI's bound for /v1/completions
MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat (a step keeps 100 candidates)
MAX_N = 8  # choices a prompt
MAX_CHOICES = 16  # choices a request, over all its prompts
MAX_STOPS = 4

# --- the chat template: GPT-2 is a base model, so a chat is a transcript it continues ---
ROLES = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
TURN_STOPS = ["\nUser:", "\nSystem:", "\nAssistant:"]


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


# --- request bodies: OpenAI's names; fields we don't use are ignored, as OpenAI clients send many ---

class CommonBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0, le=MAX_NEW_TOKENS)
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=1, le=tokenizer.VOCAB_SIZE)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    n: int | None = Field(None, ge=1, le=MAX_N)
    stop: str | list[str] | None = Field(default_factory=list, validate_default=True)
    stream: bool = False
    stream_options: dict | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("a stop sequence must not be empty")
        return stops

    def sampling(self, n_vocab: int, seed_offset: int = 0) -> Sampling:
        """No top_k: the whole vocabulary of the model being served."""
        seed = None if self.seed is None else (self.seed + seed_offset) % 2**63
        return Sampling(1.0 if self.temperature is None else self.temperature, self.top_k or n_vocab,
                        seed, 1.0 if self.top_p is None else self.top_p)

    def needs_full(self) -> bool:
        """Whether each token must score the whole vocabulary: the exact distribution."""
        return (self.top_p or 1.0) < 1 or (self.top_k is None and (self.temperature is None or self.temperature > 0))


class CompletionBody(CommonBody):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    best_of: int | None = Field(None, ge=1, le=MAX_N)
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v):
        for p in [v] if isinstance(v, str) else v:
            if isinstance(p, str) and not 1 <= len(p) <= MAX_PROMPT_CHARS:
                raise ValueError(f"a prompt must have 1 to {MAX_PROMPT_CHARS} characters")
        return v


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: str
    content: str | list[TextPart] | None = None

    @field_validator("role")
    @classmethod
    def _role(cls, v):
        if v not in ROLES:
            raise ValueError(f"role {v!r} is not one of {', '.join(ROLES)} (GPT-2 has no tools)")
        return v

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])


class ChatBody(CommonBody):
    messages: list[Message] = Field(..., min_length=1, max_length=256)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    max_completion_tokens: int | None = Field(None, ge=0, le=MAX_NEW_TOKENS)


def chat_prompt(messages: list[Message]) -> str:
    """The plain-text template: one line a turn, "Role: content", ending with the
    assistant's prefix for the model to continue:

        System: You are terse.
        User: Hello
        Assistant:
    """
    return "".join(f"{ROLES[m.role]}: {m.text()}\n" for m in messages) + "Assistant:"


# --- rendering ---

def _completion_logprobs(tokens: list[dict]) -> dict:
    return {"tokens": [e["token"] for e in tokens], "token_logprobs": [e["logprob"] for e in tokens],
            "top_logprobs": [None if e["top"] is None else {tokenizer.token_text(i): lp for i, lp in e["top"]}
                             for e in tokens],
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


def openai_router(engine, texts, config, generations=None) -> APIRouter:
    router = APIRouter()
    try:  # a dropped client ends its generation within a token (another module's mechanism)
        from puffergpt.server.streaming import Generations, stream
        generations = generations if generations is not None else Generations()
    except ImportError:  # pragma: no cover - until streaming.py lands
        stream = None

    def error(e: OpenAIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    shown = model_name(engine.model)

    def check_model(name: str | None) -> None:
        if name is not None and name not in (shown, engine.model):
            raise OpenAIError(404, f"the model {name!r} does not exist here: this server has {shown!r} "
                                   f"(GET /v1/models)", "model", "model_not_found")

    async def parse(request: Request, kind: type[BaseModel]):
        try:  # the app's one parser (the app's middleware ran it too: this router may run without it)
            raw = parse_json(await request.body())
        except BodyError as e:
            raise OpenAIError(400, e.message, e.param) from None
        if not isinstance(raw, dict):
            raise OpenAIError(400, "the body must be a JSON object")
        try:
            body = kind.model_validate(raw)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            raise OpenAIError(422, f"{where}: {first['msg']}", where.split(".")[0] or None) from None
        check_model(body.model)
        return body

    def guarded(handler):
        """Every error on /v1 in OpenAI's shape, the server serving on."""
        async def run(request: Request):
            try:
                return await handler(request)
            except OpenAIError as e:
                return error(e)
            except TextError as e:
                return error(OpenAIError(409 if isinstance(e, TextBusy) else 400, str(e)))
            except StoreError as e:
                return error(OpenAIError(503, f"the store failed: {e}", kind="server_error"))
        return run

    def checked_prompts(prompt) -> list[list[int]]:
        """A string, strings, token ids, or lists of token ids -> one id list a prompt."""
        if isinstance(prompt, str):
            return [tokenizer.encode(prompt)]
        if not prompt:
            raise OpenAIError(400, "prompt is an empty list: give a string, strings or token ids", "prompt")
        if isinstance(prompt[0], int):
            return [list(prompt)]
        out = [tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompt]
        if any(not p for p in out):
            raise OpenAIError(400, "a prompt in the list is empty: each needs at least one token", "prompt")
        return out

    def check_prompt(ids: list[int], body: CommonBody, max_tokens: int) -> None:
        for t in ids:
            if not 0 <= t < engine.config.n_vocab:
                raise OpenAIError(400, f"token id {t} is outside the vocabulary (0..{engine.config.n_vocab - 1})", "prompt")
        check_generation(engine.config, body.sampling(engine.config.n_vocab), len(ids), max_tokens)

    def streamed(produce: Callable[[threading.Event], Iterator[str]]) -> StreamingResponse:
        def safe(stop: threading.Event) -> Iterator[str]:
            try:
                yield from produce(stop)
                yield "data: [DONE]\n\n"
            except (TextError, StoreError) as e:  # mid-stream: an error event in OpenAI's shape
                yield _sse(OpenAIError(400 if isinstance(e, TextError) else 503, str(e)).body())
        if stream is None:  # pragma: no cover
            return StreamingResponse(safe(threading.Event()), media_type="text/event-stream")
        return stream(generations, safe)

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    def model_card() -> dict:
        return {"id": shown, "object": "model", "created": 0, "owned_by": "puffergpt"}

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str):
        try:
            check_model(model_id)
        except OpenAIError as e:
            return error(e)
        return model_card()

    # --- /v1/completions ---
    async def completions(request: Request):
        body = await parse(request, CompletionBody)
        if body.suffix:
            raise OpenAIError(400, "suffix is not supported: GPT-2 writes left to right and cannot fill in "
                                   "before a suffix", "suffix", "unsupported_parameter")
        n, best_of = body.n or 1, body.best_of or body.n or 1
        if best_of < n:
            raise OpenAIError(400, f"best_of ({best_of}) must be at least n ({n})", "best_of")
        if best_of > n and body.stream:
            raise OpenAIError(400, "best_of above n cannot stream: the best are known only at the end", "best_of")
        prompts = checked_prompts(body.prompt)
        if len(prompts) * best_of > MAX_CHOICES:
            raise OpenAIError(400, f"{len(prompts)} prompts x {best_of} choices is over {MAX_CHOICES} a request", "n")
        max_tokens = 16 if body.max_tokens is None else body.max_tokens
        for ids in prompts:
            check_prompt(ids, body, max_tokens)
        cid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        full = body.needs_full() or best_of > n

        def pieces(ids, j, should_stop=None):
            return choice_pieces(engine.open, ids, max_tokens, body.sampling(engine.config.n_vocab, j), body.stop, full, body.echo,
                                 body.logprobs, should_stop)

        def chunk(choices: list[dict], **extra) -> dict:
            return {"id": cid, "object": "text_completion", "created": created, "model": shown,
                    "choices": choices, **extra}

        if body.stream:
            def produce(stop: threading.Event) -> Iterator[str]:
                steps = []
                for pi, ids in enumerate(prompts):
                    for j in range(n):
                        for pc in pieces(ids, j, stop.is_set):
                            steps += pc.steps
                            lp = None if body.logprobs is None else _completion_logprobs(pc.tokens)
                            if pc.text or pc.tokens:
                                yield _sse(chunk([{"text": pc.text, "index": pi * n + j, "logprobs": lp, "finish_reason": None}]))
                            if pc.finish:
                                yield _sse(chunk([{"text": "", "index": pi * n + j, "logprobs": None, "finish_reason": pc.finish}]))
                if (body.stream_options or {}).get("include_usage"):
                    yield _sse(chunk([], **_usage(sum(map(len, prompts)), steps)))
            return streamed(produce)

        def whole() -> dict:
            choices, steps = [], []
            for pi, ids in enumerate(prompts):
                got = []
                for j in range(best_of):
                    ps = list(pieces(ids, j))
                    steps += [st for p in ps for st in p.steps]
                    tokens = [e for p in ps for e in p.tokens]
                    score = sum(st.logprob for p in ps for st in p.steps if st.phase != "prompt" and st.logprob is not None)
                    got.append((score, {"text": "".join(p.text for p in ps),
                                        "logprobs": None if body.logprobs is None else _completion_logprobs(tokens),
                                        "finish_reason": ps[-1].finish}))
                if best_of > n:  # the n with the highest total log-probability, as OpenAI's best_of
                    got = sorted(got, key=lambda g: -g[0])[:n]
                choices += [{"index": pi * n + j, **c} for j, (_, c) in enumerate(got)]
            return chunk(choices, **_usage(sum(map(len, prompts)), steps))

        return await run_in_threadpool(whole)

    # --- /v1/chat/completions ---
    async def chat(request: Request):
        body = await parse(request, ChatBody)
        n = body.n or 1
        ids = tokenizer.encode(chat_prompt(body.messages))
        max_tokens = next((m for m in (body.max_completion_tokens, body.max_tokens) if m is not None), 16)
        check_prompt(ids, body, max_tokens)
        k = (body.top_logprobs or 0) if body.logprobs else None
        stops = body.stop + TURN_STOPS
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())

        def pieces(j, should_stop=None) -> Iterator[Piece]:
            """The assistant's text without the space after its prefix."""
            started = False
            for pc in choice_pieces(engine.open, ids, max_tokens, body.sampling(engine.config.n_vocab, j), stops, body.needs_full(), False, k,
                                    should_stop):
                if not started:
                    pc.text = pc.text.lstrip(" ")
                    started = bool(pc.text)
                yield pc

        def chunk(choices: list[dict], kind: str = "chat.completion.chunk", **extra) -> dict:
            return {"id": cid, "object": kind, "created": created, "model": shown, "choices": choices, **extra}

        if body.stream:
            def produce(stop: threading.Event) -> Iterator[str]:
                steps = []
                for j in range(n):
                    yield _sse(chunk([{"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                       "finish_reason": None}]))
                    for pc in pieces(j, stop.is_set):
                        steps += pc.steps
                        if pc.text or pc.tokens:
                            yield _sse(chunk([{"index": j, "delta": {"content": pc.text}, "finish_reason": None,
                                               "logprobs": None if k is None else _chat_logprobs(pc.tokens)}]))
                        if pc.finish:
                            yield _sse(chunk([{"index": j, "delta": {}, "logprobs": None, "finish_reason": pc.finish}]))
                if (body.stream_options or {}).get("include_usage"):
                    yield _sse(chunk([], **_usage(len(ids), steps)))
            return streamed(produce)

        def whole() -> dict:
            choices, steps = [], []
            for j in range(n):
                ps = list(pieces(j))
                steps += [st for p in ps for st in p.steps]
                choices.append({"index": j, "message": {"role": "assistant", "content": "".join(p.text for p in ps)},
                                "logprobs": None if k is None else _chat_logprobs([e for p in ps for e in p.tokens]),
                                "finish_reason": ps[-1].finish})
            return chunk(choices, "chat.completion", **_usage(len(ids), steps))

        return await run_in_threadpool(whole)

    router.add_api_route("/v1/completions", guarded(completions), methods=["POST"])
    router.add_api_route("/v1/chat/completions", guarded(chat), methods=["POST"])

    @router.api_route("/v1/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"], include_in_schema=False)
    async def unknown(path: str):
        return error(OpenAIError(404, f"no route /v1/{path}: this server has /v1/models, /v1/completions and "
                                      f"/v1/chat/completions", code="unknown_url"))

    return router
