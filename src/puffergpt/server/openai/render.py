"""OpenAI's answers rendered: a request's choices written (``Choices``, ``Reply``) and each
shape ``/v1`` sends, whole or streamed as server-sent events, from the pieces of the one
completion path (``completion.choice_pieces``). The routes (``openai.py``) parse, check and
call these; they compute nothing of the model's."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from fastapi.responses import StreamingResponse

from puffergpt.app.completion import Piece, Usage, choice_pieces
from puffergpt.model import tokenizer
from puffergpt.model.session import KeysExpired
from puffergpt.server.openai.protocol import (
    CommonBody,
    OpenAIError,
)
from puffergpt.server.streaming import Ending, Generations, stream
from puffergpt.stores.base import StoreError
from puffergpt.texts.text import Step, TextError

# --- one request's choices, written and rendered ---

@dataclass
class Choices:
    """How each choice of one request is written (``completion.choice_pieces``'s arguments)."""

    open_run: Callable
    n_vocab: int
    body: CommonBody
    max_tokens: int
    stops: list[str]
    full: bool
    echo: bool
    k: int | None  # log-probabilities' alternatives a token; None: none asked for
    clock: Callable[[], Callable] | None = None  # a new choice's on_step: its tokens timed (/metrics)

    def pieces(self, ids: list[int], j: int, should_stop: Callable[[], bool]) -> Iterator[Piece]:
        """Choice j (its seed offset) of the prompt ``ids``, until ``should_stop()`` (checked
        before each piece: each echoed token is one)."""
        pieces = choice_pieces(self.open_run, ids, self.max_tokens, self.body.sampling(self.n_vocab, j),
                               self.stops, self.full, self.echo, self.k, should_stop,
                               None if self.clock is None else self.clock())
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
        except KeysExpired as e:
            yield _sse(OpenAIError(503, str(e), code="text_expired", kind="server_error").body())
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


def searched(steps: list[Step]) -> str:
    """Which search chose a choice's tokens (puffergpt's ``output_search`` on each choice): "approximate"
    where any came from the index over the token vectors (``wte.ann``), else "exact"."""
    return "approximate" if any(r.kind == "wte.ann" for st in steps for r in st.requests) else "exact"


def _sse(d: dict) -> str:
    return f"data: {json.dumps(d)}\n\n"


def completion_events(how: Choices, reply: Reply, prompts: list[list[int]], n: int,
                      stop: threading.Event) -> Iterator[str]:
    """/v1/completions streamed: each choice's pieces, then its finish, then the usage if asked."""
    steps = []
    for pi, ids in enumerate(prompts):
        for j in range(n):
            mine = []
            for pc in how.pieces(ids, j, stop.is_set):
                mine += pc.steps
                lp = None if how.k is None else _completion_logprobs(pc.tokens)
                if pc.text or pc.tokens:
                    yield _sse(reply.chunk([{"text": pc.text, "index": pi * n + j, "logprobs": lp,
                                             "finish_reason": None}]))
                if pc.finish:
                    yield _sse(reply.chunk([{"text": "", "index": pi * n + j, "logprobs": None,
                                             "finish_reason": pc.finish, "output_search": searched(mine)}]))
            steps += mine
    if how.body.stream_options is not None and how.body.stream_options.include_usage:
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
                                "finish_reason": ps[-1].finish,
                                "output_search": searched([st for p in ps for st in p.steps])}))
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
        mine = []
        for pc in how.assistant(ids, j, stop.is_set):
            mine += pc.steps
            if pc.text or pc.tokens:
                yield _sse(reply.chunk([{"index": j, "delta": {"content": pc.text}, "finish_reason": None,
                                         "logprobs": None if how.k is None else _chat_logprobs(pc.tokens)}]))
            if pc.finish:
                yield _sse(reply.chunk([{"index": j, "delta": {}, "logprobs": None, "finish_reason": pc.finish,
                                         "output_search": searched(mine)}]))
        steps += mine
    if how.body.stream_options is not None and how.body.stream_options.include_usage:
        yield _sse(reply.chunk([], **_usage(len(ids), steps)))


def whole_chat(how: Choices, reply: Reply, ids: list[int], n: int, stop: threading.Event) -> dict:
    choices, steps = [], []
    for j in range(n):
        ps = list(how.assistant(ids, j, stop.is_set)) or [Piece("", finish="length")]  # none: stopped
        steps += [st for p in ps for st in p.steps]
        choices.append({"index": j, "message": {"role": "assistant", "content": "".join(p.text for p in ps)},
                        "logprobs": None if how.k is None else _chat_logprobs([e for p in ps for e in p.tokens]),
                        "finish_reason": ps[-1].finish,
                        "output_search": searched([st for p in ps for st in p.steps])})
    return reply.chunk(choices, "chat.completion", **_usage(len(ids), steps))
