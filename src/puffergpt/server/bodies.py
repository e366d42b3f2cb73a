"""Request bodies: strict types, bounded values. A body that breaks them is a 422 that
names the field; nothing past the body's check runs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from puffergpt import tokenizer
from puffergpt.inside import MAX_VIEW_K

MAX_PROMPT_CHARS = 16 * 1024
MAX_PROMPT_IDS = 4096  # token ids of a text: more than any GPT-2's context
MAX_NEW_TOKENS = 512
MAX_WORD_CHARS = 64


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SamplingBody(Strict):
    max_tokens: int = Field(32, ge=0, le=MAX_NEW_TOKENS)
    temperature: float = Field(1.0, ge=0, le=100)
    top_k: int = Field(40, ge=1, le=tokenizer.VOCAB_SIZE)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)


class CreateBody(Strict):
    """A text from a prompt, or from exact token ids (to reopen a text as it was)."""
    prompt: str | None = Field(None, min_length=1, max_length=MAX_PROMPT_CHARS)
    prompt_ids: list[int] | None = Field(None, min_length=1, max_length=MAX_PROMPT_IDS)

    @model_validator(mode="after")
    def one_of(self):
        if (self.prompt is None) == (self.prompt_ids is None):
            raise ValueError("give either prompt (text) or prompt_ids (token ids), not both or neither")
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


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # OpenAI clients send fields we don't use
    model: str | None = None
    prompt: str = Field(..., min_length=1, max_length=MAX_PROMPT_CHARS)
    max_tokens: int = Field(16, ge=0, le=MAX_NEW_TOKENS)
    temperature: float = Field(1.0, ge=0, le=100)
    top_k: int = Field(40, ge=1, le=tokenizer.VOCAB_SIZE)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    logprobs: int | None = Field(None, ge=0, le=40)
    stream: bool = False


class SamplingBodyInspect(SamplingBody):
    inspect: bool = False  # each token event also carries its attention and lens
    lens_k: int = Field(10, ge=1, le=MAX_VIEW_K)


class AnalogyBody(Strict):
    a: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    b: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    c: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    k: int = Field(10, ge=1, le=MAX_VIEW_K)


class NeighboursBody(Strict):
    word: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    k: int = Field(10, ge=1, le=MAX_VIEW_K)


class MapBody(Strict):
    words: list[str] = Field(..., min_length=2, max_length=24)
    text_id: str | None = Field(None, max_length=64)
    position: int | None = None
