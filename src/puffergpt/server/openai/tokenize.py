"""The tokenizer over HTTP, as vLLM's server defines it, so that clients that ask the
server for its tokenizer (lm-eval's ``local-completions``, among others) need none of
their own:

- ``POST /tokenize`` ``{"model", "prompt"}`` (or ``"messages"``: the chat template of
  ``/v1/chat/completions``) -> ``{"count", "max_model_len", "tokens", "token_strs"}``;
- ``POST /detokenize`` ``{"model", "tokens"}`` -> ``{"prompt"}``;
- ``GET /tokenizer_info``: GPT-2's ``tokenizer_config.json`` (vLLM's response is that file).

Errors have OpenAI's shape, as vLLM's do; the bodies are parsed as ``/v1``'s
(``openai.body_of``): a value out of bounds is a 400 naming its field.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from pydantic import BaseModel, ConfigDict, Field, model_validator

from puffergpt.app.protocol import MAX_PROMPT_CHARS
from puffergpt.model import tokenizer
from puffergpt.server.openai.protocol import ERROR_RESPONSES, Message, OpenAIError, body_schema, chat_prompt
from puffergpt.server.openai.routes import body_of
from puffergpt.server.state import EngineDep
from puffergpt.texts.text import TextError, check_token_ids

MAX_DETOKENIZE = 16 * 1024  # token ids a /detokenize: as many as a longest prompt can have

router = APIRouter(tags=["tokenizer"])


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    prompt: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    messages: list[Message] | None = Field(None, min_length=1, max_length=256)
    add_special_tokens: bool = True  # GPT-2 adds none: accepted for vLLM's clients, changes nothing
    add_generation_prompt: bool = True  # the chat template always ends with the assistant's prefix
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one(self):
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt (a string) or messages (a chat), not both or neither")
        return self

    def text(self) -> str:
        return self.prompt if self.prompt is not None else chat_prompt(self.messages)


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str | None = None
    tokens: list[int] = Field(..., max_length=MAX_DETOKENIZE)


class TokenizeResponse(BaseModel):
    """For the OpenAPI document (the route writes a dict): vLLM's answer."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None  # None unless return_token_strs


class DetokenizeResponse(BaseModel):
    prompt: str


@router.post("/tokenize", operation_id="tokenize", openapi_extra=body_schema(TokenizeBody), summary="Tokenize",
             responses={200: {"model": TokenizeResponse}, **ERROR_RESPONSES})
async def tokenize(body: Annotated[TokenizeBody, Depends(body_of(TokenizeBody))], engine: EngineDep):
    """A prompt (or a chat, as /v1/chat/completions writes it) as GPT-2's token ids, with the
    model's context (max_model_len), as vLLM answers."""
    ids = tokenizer.encode(body.text())
    return {"count": len(ids), "max_model_len": engine.config.n_ctx, "tokens": ids,
            "token_strs": [tokenizer.token_text(i) for i in ids] if body.return_token_strs else None}


@router.post("/detokenize", operation_id="detokenize", openapi_extra=body_schema(DetokenizeBody),
             summary="Detokenize", responses={200: {"model": DetokenizeResponse}, **ERROR_RESPONSES})
async def detokenize(body: Annotated[DetokenizeBody, Depends(body_of(DetokenizeBody))], engine: EngineDep):
    """Token ids as text, as vLLM answers."""
    try:
        check_token_ids(body.tokens, min(engine.config.n_vocab, tokenizer.VOCAB_SIZE))
    except TextError as e:
        raise OpenAIError(400, str(e), "tokens") from None
    return {"prompt": tokenizer.decode(body.tokens)}


@router.get("/tokenizer_info", operation_id="tokenizerInfo", summary="The tokenizer's configuration")
async def tokenizer_info(engine: EngineDep):
    """GPT-2's tokenizer_config.json, as transformers writes it, with this model's context."""
    eot = tokenizer.token_text(tokenizer.EOT)
    return {"tokenizer_class": "GPT2Tokenizer", "model_max_length": engine.config.n_ctx,
            "vocab_size": engine.config.n_vocab, "bos_token": eot, "eos_token": eot, "unk_token": eot,
            "pad_token": None, "add_bos_token": False, "add_prefix_space": False, "errors": "replace",
            "clean_up_tokenization_spaces": False}
