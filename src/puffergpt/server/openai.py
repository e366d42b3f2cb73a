"""OpenAI-compatible routes: ``/v1/completions`` over the one completion path
(``texts.complete``), for the clients people already use."""

from __future__ import annotations

import codecs
import json
import math
import time
import uuid
from typing import Iterator

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from puffergpt import texts as app_layer, tokenizer
from puffergpt.sampling import Sampling
from puffergpt.server.bodies import MAX_NEW_TOKENS, MAX_PROMPT_CHARS
from puffergpt.text import Step, check_generation


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


def _log(p: float) -> float:
    return math.log(p) if p > 0 else -1e9  # JSON has no -inf


def openai_router(engine, texts, config) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions")
    def completions(body: CompletionBody):
        ids = tokenizer.encode(body.prompt)
        s = check_generation(engine.config, Sampling(body.temperature, body.top_k, body.seed), len(ids), body.max_tokens)
        cid, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span tokens

        def choice(step: Step) -> dict:
            lp = None
            if body.logprobs is not None:
                probs = {c["token_id"]: c["prob"] for c in step.candidates(1.0)}  # the model's own distribution
                top = sorted(probs.items(), key=lambda kv: -kv[1])[: body.logprobs]
                lp = {"tokens": [step.text], "token_logprobs": [_log(probs.get(step.token_id, 0.0))],
                      "top_logprobs": [{tokenizer.token_text(i): _log(p) for i, p in top}]}
            return {"text": utf8.decode(tokenizer.token_bytes(step.token_id)), "index": 0, "logprobs": lp, "finish_reason": None}

        def run() -> Iterator[tuple[Step, dict]]:
            for step in app_layer.complete(engine.open, ids, body.max_tokens, s):
                yield step, choice(step)

        def finish(steps: list[Step]) -> str:
            return "stop" if steps and steps[-1].token_id == tokenizer.EOT else "length"

        def chunk(ch: dict) -> str:
            return f"data: {json.dumps({'id': cid, 'object': 'text_completion', 'created': created, 'model': engine.model, 'choices': [ch]})}\n\n"

        if body.stream:
            def events() -> Iterator[str]:
                steps = []
                for step, ch in run():
                    steps.append(step)
                    yield chunk(ch)
                yield chunk({"text": utf8.decode(b"", final=True), "index": 0, "logprobs": None, "finish_reason": finish(steps)})
                yield "data: [DONE]\n\n"
            return StreamingResponse(events(), media_type="text/event-stream")

        out = list(run())
        steps = [st for st, _ in out]
        lp = None
        if body.logprobs is not None:
            lp = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            offset = len(body.prompt)
            for st, ch in out:
                for k in ("tokens", "token_logprobs", "top_logprobs"):
                    lp[k] += ch["logprobs"][k]
                lp["text_offset"].append(offset)
                offset += len(st.text)
        text = tokenizer.decode([st.token_id for st in steps])
        return {"id": cid, "object": "text_completion", "created": created, "model": engine.model,
                "choices": [{"text": text, "index": 0, "logprobs": lp, "finish_reason": finish(steps)}],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": len(steps), "total_tokens": len(ids) + len(steps)}}

    return router
