"""The OpenAI-compatible routes' request bodies, in OpenAI's names (a field we don't act on
is accepted only at a value that asks for nothing: ``NO_OPS``; any other is a 400 naming it),
the chat template, and OpenAI's error shape.
A body says what it asks for (prompts as token ids, the number of new tokens, the
sampling); the routes (``openai.py``) run it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from puffergpt.app.protocol import MAX_NEW_TOKENS, MAX_PROMPT_CHARS
from puffergpt.model import tokenizer
from puffergpt.model.sampling import Sampling

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for max_tokens

MAX_LOGPROBS = 5  # OpenAI's bound for /v1/completions
MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat (a step keeps 100 candidates)
MAX_N = 8  # choices a prompt
MAX_CHOICES = 64  # choices a request, over all its prompts (lm-eval's --batch_size up to 64)
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


ANY = object()
# Fields of OpenAI's (or vLLM's) API this server does not act on, accepted only at the values that
# ask for nothing, so that doing nothing is honouring them: any other value is refused with a 400
# naming the field and why (a client asking for structured output or tools must learn it won't get it).
NO_OPS: dict[str, tuple[tuple, str]] = {
    "user": ((ANY,), ""), "metadata": ((ANY,), ""),  # labels for the caller's own records
    "store": ((None, False), "completions are not stored here"),
    "service_tier": ((None, "auto", "default"), "there is one tier"),
    "presence_penalty": ((None, 0), "no penalties are applied"),
    "frequency_penalty": ((None, 0), "no penalties are applied"),
    "repetition_penalty": ((None, 1), "no penalties are applied"),
    "logit_bias": ((None, {}), "logits are not biased"),
    "response_format": ((None, {"type": "text"}), "GPT-2 writes plain text only: no JSON mode or schema"),
    "tools": ((None, []), "GPT-2 cannot call tools"), "tool_choice": ((None, "none"), "GPT-2 cannot call tools"),
    "parallel_tool_calls": ((None, True, False), ""),  # with no tools there is nothing to call in parallel
    "functions": ((None, []), "GPT-2 cannot call functions"),
    "function_call": ((None, "none"), "GPT-2 cannot call functions"),
    "modalities": ((None, ["text"]), "GPT-2 writes text only"),
}


def without_no_ops(raw: dict, fields: dict) -> dict:
    """The body without the fields of ``NO_OPS`` at a value that asks for nothing; a 400 naming
    the first field that is neither declared (``fields``) nor such a no-op."""
    out = {}
    for key, value in raw.items():
        if key in fields:
            out[key] = value
        elif key in NO_OPS:
            allowed, why = NO_OPS[key]
            if ANY not in allowed and not any(value == a and type(value) is not bool or value is a for a in allowed):
                raise OpenAIError(400, f"{key}={value!r} is not supported: {why}. Leave {key} out, or send "
                                       f"{' or '.join(repr(a) for a in allowed if a is not None)}.", key,
                                  "unsupported_parameter")
        else:
            raise OpenAIError(400, f"unknown parameter {key!r}: this server takes {', '.join(fields)} "
                                   f"(and, at values that ask for nothing, {', '.join(NO_OPS)})", key,
                              "unknown_parameter")
    return out


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    """OpenAI's error body, for the OpenAPI document (``OpenAIError.body`` writes it)."""

    error: ErrorDetail


# --- the responses' shapes, for the OpenAPI document (the routes write plain dicts; extra keys allowed) ---

class Shape(BaseModel):
    model_config = ConfigDict(extra="allow")


class UsageShape(Shape):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(Shape):
    tokens: list[str]
    token_logprobs: list[float | None]  # None: the first echoed token (nothing predicts it)
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Shape):
    text: str
    index: int
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"] | None  # None: a streamed chunk before the last


class CompletionResponse(Shape):
    """A /v1/completions response (or, streamed, each event's data)."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageShape | None = None


class ModelCard(Shape):
    """One model of /v1/models: the one this server has."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int  # the context in tokens, as vLLM gives it: lm-eval's max_length, a client's budget


class ModelList(Shape):
    object: Literal["list"]
    data: list[ModelCard]


class ChatMessage(Shape):
    role: Literal["assistant"]
    content: str


class TopLogprob(Shape):
    token: str
    logprob: float
    bytes: list[int]  # the token's UTF-8 bytes: a token may hold part of a character


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]  # the top_logprobs most likely, most likely first


class ChatLogprobs(Shape):
    content: list[TokenLogprob]


class ChatChoice(Shape):
    index: int
    message: ChatMessage
    logprobs: ChatLogprobs | None
    finish_reason: Literal["stop", "length"]


class ChatResponse(Shape):
    """A /v1/chat/completions response (streamed: chat.completion.chunk objects with a delta)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: UsageShape


# The error responses each /v1 (and tokenizer) operation declares: what the server answers, never 422
ERROR_RESPONSES = {400: {"model": ErrorBody, "description": "a value out of bounds, unknown or unsupported "
                                                          "(param names the field), or more work than allowed"},
                   403: {"model": ErrorBody, "description": "sent by a page on an origin not allowed "
                                                          "(serve --cors-origin)"},
                   404: {"model": ErrorBody, "description": "no such model on this server"},
                   413: {"model": ErrorBody, "description": "a body over the server's bound"},
                   415: {"model": ErrorBody, "description": "a body that is not Content-Type: application/json"}}


def body_schema(kind: type[BaseModel]) -> dict:
    """``kind``'s JSON schema as an operation's request body (``openapi_extra``), its ``$defs``
    written in place: the routes parse their bodies themselves (to answer in OpenAI's shape),
    so FastAPI does not see them."""
    schema = kind.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(x):
        if isinstance(x, dict):
            return inline(defs[x["$ref"].rsplit("/", 1)[-1]]) if "$ref" in x else {k: inline(v) for k, v in x.items()}
        return [inline(v) for v in x] if isinstance(x, list) else x

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": inline(schema)}}}}


class CommonBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
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
    output_search: Literal["exact", "approximate"] | None = None  # puffergpt's extension (issue 35)

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

    def choices(self) -> tuple[int, int]:
        """(n, best_of): the choices returned a prompt, and those written to choose them from."""
        n, best_of = self.n or 1, self.best_of or self.n or 1
        if self.suffix:
            raise OpenAIError(400, "suffix is not supported: GPT-2 writes left to right and cannot fill in "
                                   "before a suffix", "suffix", "unsupported_parameter")
        if best_of < n:
            raise OpenAIError(400, f"best_of ({best_of}) must be at least n ({n})", "best_of")
        if best_of > n and self.stream:
            raise OpenAIError(400, "best_of above n cannot stream: the best are known only at the end", "best_of")
        return n, best_of

    def prompt_ids(self) -> list[list[int]]:
        """A string, strings, token ids, or lists of token ids -> one id list a prompt."""
        prompt = self.prompt
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

    def new_tokens(self) -> int:
        return DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


# A message's fields this template does not use, at the values an assistant's reply sent back as it
# came (the SDK's ChatCompletionMessage) carries; any other value is refused, naming the field
MESSAGE_NO_OPS = {"refusal": (None,), "tool_calls": (None, []), "function_call": (None,), "annotations": (None, []),
                  "audio": (None,)}


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: str
    content: str | list[TextPart] | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_ops(cls, v):
        if not isinstance(v, dict):
            return v
        for key, allowed in MESSAGE_NO_OPS.items():
            if key in v and v[key] not in allowed:
                raise ValueError(f"{key}={v[key]!r} is not supported: GPT-2 has no tools, audio or refusals")
        return {k: x for k, x in v.items() if k not in MESSAGE_NO_OPS}

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

    def new_tokens(self) -> int:
        return next((m for m in (self.max_completion_tokens, self.max_tokens) if m is not None), DEFAULT_MAX_TOKENS)

    def top_logprobs_k(self) -> int | None:
        """How many alternatives each token's log-probabilities list; None: no log-probabilities."""
        return (self.top_logprobs or 0) if self.logprobs else None


def chat_prompt(messages: list[Message]) -> str:
    """The plain-text template: one line a turn, "Role: content", ending with the
    assistant's prefix for the model to continue:

        System: You are terse.
        User: Hello
        Assistant:
    """
    return "".join(f"{ROLES[m.role]}: {m.text()}\n" for m in messages) + "Assistant:"
