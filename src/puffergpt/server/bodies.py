"""Request bodies: one JSON parser for every route (``parse_json``), then strict types and
bounded values (a prompt's, new tokens' and a context's bounds are every edge's:
``app/protocol.py``). JSON that Python cannot hold as sent (an integer past int()'s digits,
nesting past the recursion limit, NaN, 1e400, a lone surrogate, bytes that are not UTF-8)
is a 400 that names the field; a body that breaks a field's type or bound is a 422 that
names it; nothing past the body's check runs."""

from __future__ import annotations

import json
import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from puffergpt.app.protocol import MAX_CONTEXT_CHARS, MAX_NEW_TOKENS, MAX_PROMPT_CHARS
from puffergpt.lens.contexts import MAX_PROMPTS as MAX_CONTEXTS
from puffergpt.lens.inside import MAX_VIEW_K
from puffergpt.lens.views import MAX_MAP_WORDS
from puffergpt.model import tokenizer
from puffergpt.model.sampling import PENALTY_RANGE, Sampling, bias_from_json
from puffergpt.texts.text import MAX_PROMPT_IDS

MAX_WORD_CHARS = 64
MAX_DEPTH = 32  # nesting of a body's JSON: the deepest field (an insight's evidence) needs 5
MAX_INT_DIGITS = 100  # no field takes more than 20 digits; int() refuses past 4300
MAX_ABLATE_PARTS = 2048  # parts one rerun may switch off: every head and MLP of GPT-2 XL is 1,248
MAX_PART_CHARS = 32  # "attn 11.11" is 10


class BodyError(ValueError):
    """A body that is not JSON Python holds as sent: a 400. ``param`` is the top-level
    field it is in (OpenAI's ``param``), None for the body as a whole."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, _short(param)


class _Refused:
    """What a parse hook returns for a value it refuses: the walk after the parse names
    the field it is in (the hooks see only the value's text)."""

    def __init__(self, why: str):
        self.why = why


def _int(text: str):
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Refused(f"is an integer of {digits} digits, at most {MAX_INT_DIGITS}")
    return int(text)


def _float(text: str):
    v = float(text)
    return v if math.isfinite(v) else _Refused(f"is {text}, too large for a number: send a finite number")


def _constant(text: str):  # NaN, Infinity, -Infinity: Python's json reads them, JSON has none
    return _Refused(f"is {text}, not a JSON number: send a finite number")


def parse_json(raw: bytes):
    """A request body as Python values, or BodyError saying what is wrong and where."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BodyError(f"the body is not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}): "
                        "send JSON as UTF-8") from None
    if text.startswith("\ufeff"):
        raise BodyError("the body is not UTF-8 JSON: it starts with a byte order mark (EF BB BF): send it without one")
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except json.JSONDecodeError as e:
        raise BodyError(f"the body is not JSON ({e.msg} at line {e.lineno} column {e.colno}): "
                        "send a JSON object") from None
    except RecursionError:  # past the interpreter's limit, before MAX_DEPTH could be counted
        key = re.match(r'\s*\{\s*"([\w.-]{1,64})"', text)  # the field it starts in, for the message
        raise BodyError(_too_deep(key and key[1]), key and key[1]) from None
    _walk(value)
    return value


def _too_deep(param: str | None) -> str:
    return f"{param or 'the body'} is nested more than {MAX_DEPTH} levels deep: no field takes that"


def _walk(value) -> None:
    """Every value of the body, without recursion: the refused ones, lone surrogates (valid
    JSON escapes that are not text: the tokenizer would write U+FFFD, answering for text
    the client did not send), and nesting past MAX_DEPTH, each named by its field."""
    todo = [(value, "", 0)]  # (value, where, depth)
    while todo:
        v, where, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise BodyError(_too_deep(_param(where)), _param(where))
        if isinstance(v, _Refused):
            raise BodyError(f"{_short(where) or 'the body'} {v.why}", _param(where))
        if isinstance(v, str):
            _text(v, _short(where) or "the body")
        elif isinstance(v, dict):
            for k, x in v.items():
                _text(k, f"a key in {_short(where) or 'the body'}")
                todo.append((x, f"{where}.{k}" if where else k, depth + 1))
        elif isinstance(v, list):
            todo += [(x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v)]


def _text(s: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BodyError(f"{where} is not valid Unicode: a lone surrogate (\\u{ord(s[e.start]):04x}) at character "
                        f"{e.start}: send text without lone surrogates", _param(where)) from None


def _short(where: str | None) -> str | None:
    """A place in the body as a message shows it: a key may be 64 KiB long."""
    return where if where is None or len(where) <= 80 else where[:77] + "..."


def _param(where: str) -> str | None:
    """The top-level field of a place in the body: 'messages' of 'messages[0].content'."""
    if where.startswith("a key in "):
        where = where[len("a key in "):]
    top = where.split(".")[0].split("[")[0]
    return None if not top or top == "the body" else top


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ControlsBody(Strict):
    """The sampling's controls (``sampling.py``), as /v1 takes them."""
    min_p: float = Field(0.0, ge=0, le=1)
    presence_penalty: float = Field(0.0, ge=-PENALTY_RANGE, le=PENALTY_RANGE)
    frequency_penalty: float = Field(0.0, ge=-PENALTY_RANGE, le=PENALTY_RANGE)
    repetition_penalty: float = Field(1.0, gt=0, le=100)
    logit_bias: dict[str, float] = Field(default_factory=dict)  # token id (a JSON key) -> -100..100

    @field_validator("logit_bias")
    @classmethod
    def _bias(cls, v):
        return bias_from_json(v)

    def with_controls(self, temperature: float, top_k: int = 40, seed: int | None = None) -> Sampling:
        return Sampling(temperature, top_k, seed, 1.0, self.min_p, self.presence_penalty, self.frequency_penalty,
                        self.repetition_penalty, self.logit_bias)


class SamplingBody(ControlsBody):
    max_tokens: int = Field(32, ge=0, le=MAX_NEW_TOKENS)
    temperature: float = Field(1.0, ge=0, le=100)
    top_k: int = Field(40, ge=1, le=tokenizer.VOCAB_SIZE)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    output_search: Literal["exact", "approximate"] | None = None  # None: as the text has it (the server's default)

    def sampling(self) -> Sampling:
        return self.with_controls(self.temperature, self.top_k, self.seed)


class GeneratedAt(Strict):
    position: int
    temperature: float = Field(..., ge=0, le=100)
    controls: ControlsBody | None = None  # the controls it was generated with (its step's "controls")

    def sampling(self) -> Sampling:
        return (self.controls or ControlsBody()).with_controls(self.temperature)


class ReopenBody(Strict):
    """What rebuilds a text another server held: of the token ids, the first ``length`` are the
    text (the rest stepped back from), and the positions the model generated, with the
    temperature and the controls each was sampled with (their candidates are recomputed after them)."""
    length: int
    generated: list[GeneratedAt] = Field(default_factory=list, max_length=MAX_PROMPT_IDS)


class CreateBody(Strict):
    """A text from a prompt, or from exact token ids (to reopen a text as it was); with
    ``reopen``, a text another server held, as the page kept it."""
    prompt: str | None = Field(None, min_length=1, max_length=MAX_PROMPT_CHARS)
    prompt_ids: list[int] | None = Field(None, min_length=1, max_length=MAX_PROMPT_IDS)
    reopen: ReopenBody | None = None

    @model_validator(mode="after")
    def one_of(self):
        if (self.prompt is None) == (self.prompt_ids is None):
            raise ValueError("give either prompt (text) or prompt_ids (token ids), not both or neither")
        if self.reopen is not None and self.prompt_ids is None:
            raise ValueError("reopen rebuilds a text from its token ids: give prompt_ids, not prompt")
        return self


class AppendBody(Strict):
    text: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS)


class PositionBody(Strict):
    position: int


class BranchBody(Strict):
    position: int
    rank: int | None = None
    token_id: int | None = None


class CompareBody(Strict):
    prompt: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS)
    top_k: int = Field(40, ge=1, le=tokenizer.VOCAB_SIZE)


class SamplingBodyInspect(SamplingBody):
    inspect: bool = False  # each token event also carries its attention and lens
    lens_k: int = Field(10, ge=1, le=MAX_VIEW_K)


class AblateBody(Strict):
    """Parts of the model switched off for a rerun of a step: "attn L.H" or "mlp L" (checked
    against the model by ``reference.Ablation``), and how many candidates to show before and after."""
    parts: list[str] = Field(..., min_length=1, max_length=MAX_ABLATE_PARTS)
    k: int = Field(10, ge=1, le=MAX_VIEW_K)
    mode: Literal["zero", "mean"] = "zero"  # zero: the part's output zeroed; mean: its mean over the text's positions

    @model_validator(mode="after")
    def short_parts(self):
        for part in self.parts:
            if len(part) > MAX_PART_CHARS:
                raise ValueError(f"a part is {len(part)} characters, at most {MAX_PART_CHARS}: "
                                 "write 'attn L.H' or 'mlp L'")
        return self


class WritesBody(Strict):
    """A head whose writes to read: "L.H" (layer L's head H, checked against the model by ``writes.head_of``)."""
    head: str = Field(..., min_length=1, max_length=MAX_PART_CHARS)


class AnalogyBody(Strict):
    a: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    b: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    c: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    k: int = Field(10, ge=1, le=MAX_VIEW_K)


class NeighboursBody(Strict):
    word: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    k: int = Field(10, ge=1, le=MAX_VIEW_K)


class MapBody(Strict):
    words: list[str] = Field(..., min_length=2, max_length=MAX_MAP_WORDS)
    text_id: str | None = Field(None, max_length=64)
    position: int | None = None


class OutputSearchBody(Strict):
    """A text's token whose prediction both output searches answer (``output_search.at``)."""
    text_id: str = Field(..., max_length=64)
    position: int = Field(..., ge=1)
    k: int = Field(40, ge=1, le=MAX_VIEW_K)
    ef: int | None = Field(None, ge=1, le=1000)  # the index's search list (None: the one it was built with)


class ContextsBody(Strict):
    """One word in 2 or 3 prompts, and an optional control prompt where it means what it does in
    the first (``contexts.py``): the count and each prompt are checked there, with a message
    naming the prompt; here only their size."""
    word: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    prompts: list[str] = Field(..., min_length=1, max_length=MAX_CONTEXTS)
    control: str | None = None
    k: int = Field(5, ge=1, le=MAX_VIEW_K)

    @model_validator(mode="after")
    def bounded(self):
        named = [(f"prompt {i}", prompt) for i, prompt in enumerate(self.prompts, 1)]
        for name, prompt in named + ([("the control prompt", self.control)] if self.control is not None else []):
            if len(prompt) > MAX_CONTEXT_CHARS:
                raise ValueError(f"{name} has {len(prompt)} characters, over {MAX_CONTEXT_CHARS}: "
                                 "a context is a sentence or two")
        return self
