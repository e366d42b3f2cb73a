"""Completion: the one path that reads a prompt and writes tokens, and what it cost.

- ``complete``: a prompt read and up to n tokens written in a text of its own, closed at
  the end (``generate``, ``/v1/completions``, Compare, the notebook's replay and bench);
- ``choice_pieces``: one choice of a completion as a client may see it: UTF-8 whole across
  tokens, stop strings held back while they may be starting and never returned, each
  token with its offset and log-probabilities (the ``/v1`` routes only render it);
- ``compare``: the prompt's next-token candidates through two runs (the engine's
  searches and the numpy reference), side by side;
- ``Usage``: requests, sequential round trips, bytes and cost of some steps.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from puffergpt.lens import inspector
from puffergpt.model import tokenizer
from puffergpt.model.reference import NO_ABLATION, Ablation
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.model.tokenizer import token_dict
from puffergpt.texts import probabilities
from puffergpt.texts.text import Step, TextError, check_generation, opened

LOWEST = -1e9  # JSON has no -inf: a log-probability below this is sent as this


def complete(open_run: Callable[[], Run], ids: list[int], n: int, s: Sampling,
             should_stop: Callable[[], bool] | None = None, inspect: int = 0,
             full: bool = False, echo: bool = False, explain: bool = False, versus: int | None = None,
             ablation: Ablation = NO_ABLATION, over_all: bool = False,
             on_step: Callable[[Step], None] | None = None) -> Iterator[Step]:
    """Read ``ids`` and write up to ``n`` tokens in a text of its own, closed at the end.
    ``full``: each token scores the whole vocabulary (exact log-probabilities, ``Step.logz``);
    ``echo``: first a step (phase "prompt") for each prompt token, scored the same way;
    ``explain`` (with ``inspect``): each token's attribution and the MLP's top neurons, and the
    attribution's difference from ``versus`` (a token id; default: each step's runner-up);
    ``ablation``: parts of the model switched off for the whole text; ``over_all``: each token's
    candidates also get their probabilities over the whole vocabulary (one search more a token,
    ``texts/probabilities.py``); ``on_step(step)`` as each step comes (a server's clock, ``/metrics``).

    Drive it to its end or call its ``close()`` from the thread that runs it: never leave
    an unfinished one to the garbage collector, whose finaliser would take the store's
    lock from whatever thread it runs in."""
    with opened(open_run, ablation=ablation) as text:
        text.append(list(ids))  # checks the ids and that they fit the context
        check_generation(text.config, s, len(ids), n)
        if echo:
            yield from text.score_prompt()
        if inspect and full:
            raise TextError("inspect works over the top-k candidates: not with top_p or full log-probabilities")
        steps = (inspector.generate(text, n, s, inspect, explain, should_stop, versus) if inspect
                 else text.generate(n, s, should_stop=should_stop, full=full))
        for step in probabilities.normalised(text, steps) if over_all else steps:
            if on_step is not None:
                on_step(step)
            yield step


# --- one choice, as a client may see it -------------------------------------------------

@dataclass
class Piece:
    """Text a client may see now, the tokens it comes from (with offsets and
    log-probabilities), the steps behind them, and at the end why the choice ended."""

    text: str
    tokens: list[dict] = field(default_factory=list)  # {"token_id", "token", "offset", "logprob", "top"}
    steps: list[Step] = field(default_factory=list)
    finish: str | None = None


def ends_choice(token_id: int) -> bool:
    """/v1's rule for a generated ``<|endoftext|>``: it ends the choice (finish "stop") and is
    its last token (lm-eval counts it), never its text. MCP's generate follows it too."""
    return token_id == tokenizer.EOT


def choice_text(ids: list[int]) -> tuple[str, str]:
    """Generated token ids as a choice's text and finish reason, by ``ends_choice``: the
    text of the ids before an ending token, "stop" if one ended them, else "length"."""
    end = next((i for i, t in enumerate(ids) if ends_choice(t)), None)
    return tokenizer.decode(ids[:end]), "length" if end is None else "stop"


def _entry(step: Step, offset: int, k: int | None) -> dict:
    scored = step.logz is not None
    return {"token_id": step.token_id, "token": step.text, "offset": offset,
            "logprob": max(step.logprob, LOWEST) if scored else None,
            "top": [(i, max(lp, LOWEST)) for i, lp in step.logprobs(k)] if scored and k is not None else None}


def _held(out: str, stops: list[str]) -> int:
    """How many characters at the end of out could begin a stop string."""
    return max([n for s in stops for n in range(1, len(s)) if out.endswith(s[:n])], default=0)


def choice_pieces(open_run: Callable[[], Run], ids: list[int], max_tokens: int, s: Sampling,
                  stops: list[str], full: bool, echo: bool, k: int | None,
                  should_stop: Callable[[], bool] | None = None,
                  on_step: Callable[[Step], None] | None = None) -> Iterator[Piece]:
    """One choice: the prompt (with ``echo``, scored when ``k`` is set), then the new text
    as it becomes safe to show. Offsets count characters from the prompt's start. A generated
    ``<|endoftext|>`` ends the choice and is its last token (offset: the text's end), never text."""
    prompt = tokenizer.decode(ids)
    steps = complete(open_run, ids, max_tokens, s, should_stop, full=full or k is not None,
                     echo=echo and k is not None, on_step=on_step)
    try:
        if echo and k is None:
            yield Piece(prompt)
        utf8, offset = codecs.getincrementaldecoder("utf-8")(errors="replace"), 0
        out, sent, queue, taken, finish, eot = "", 0, [], [], "length", []
        base = len(prompt)  # the new text's offsets follow the prompt's, echoed or not
        for step in steps:
            if step.phase == "prompt":  # echo's scored prompt: no stop applies to it
                t = utf8.decode(tokenizer.token_bytes(step.token_id), final=step.position == len(ids) - 1)
                yield Piece(t, [_entry(step, offset, k)], [step])
                offset += len(t)
                continue
            taken.append(step)
            if ends_choice(step.token_id):  # the model's end: in the tokens (lm-eval counts it), not the text
                finish = "stop"
                out += utf8.decode(b"", final=True)
                eot = [_entry(step, base + len(out), k)]
                break
            queue.append(_entry(step, base + len(out), k))
            out += utf8.decode(tokenizer.token_bytes(step.token_id))
            cut = min([i for i in (out.find(st, max(0, sent - len(st))) for st in stops) if i >= 0], default=None)
            if cut is not None:
                finish = "stop"
                out = out[:cut]
                break
            safe = len(out) - _held(out, stops)
            now = [e for e in queue if e["offset"] < base + safe]
            if safe > sent or now:
                yield Piece(out[sent:safe], now, taken)
                queue, taken, sent = queue[len(now):], [], safe
        if finish == "length":
            out += utf8.decode(b"", final=True)
        last = [e for e in queue if e["offset"] < base + len(out) or finish == "length" or eot] + eot
        yield Piece(out[sent:], last, taken, finish)
    finally:
        steps.close()  # here, in the thread that drove it: the text and its keys go now


# --- Compare: the engine's candidates beside the reference's ----------------------------

def compare(search: Callable[[], Run], reference: Callable[[], Run], ids: list[int], top_k: int) -> dict:
    """The prompt through the engine and through the numpy reference: the engine's top-k
    beside the reference's logit for each, and the largest difference. The search runs
    first: a prompt it refuses (the context) never opens the reference."""
    rows = {}
    for name, open_run in (("search", search), ("reference", reference)):
        run = open_run()  # the checkpoint's load is not the comparison's time
        steps = list(complete(lambda r=run: r, ids, 1, Sampling(1.0, top_k)))
        step = steps[0]
        rows[name] = {"ids": [int(i) for i in step.ids], "logits": [float(v) for v in step.logits],
                      "requests": len(step.requests), "ms": round(step.ms, 1)}
    ref = dict(zip(rows["reference"]["ids"], rows["reference"]["logits"], strict=True))
    table = [{"rank": i, **token_dict(tid), "search": lg, "reference": ref.get(tid)}
             for i, (tid, lg) in enumerate(zip(rows["search"]["ids"], rows["search"]["logits"], strict=True))]
    diffs = [abs(r["search"] - r["reference"]) for r in table if r["reference"] is not None]
    return {"prompt_tokens": len(ids), "rows": table, "same_ids": rows["search"]["ids"] == rows["reference"]["ids"],
            "max_abs_diff": max(diffs) if diffs else None,
            "search": {k: v for k, v in rows["search"].items() if k in ("requests", "ms")},
            "reference": {k: v for k, v in rows["reference"].items() if k in ("requests", "ms")}}


# --- what it cost -----------------------------------------------------------------------

@dataclass
class Usage:
    """Totals over some steps: what they read and wrote, and the requests behind it."""

    tokens: int = 0
    requests: int = 0
    round_trips: int = 0  # sequential: each waits for the one before (concurrent writes don't)
    bytes: int = 0  # bytes of documents scanned, written or fetched
    ms: float = 0.0
    cost_usd: float = 0.0

    @classmethod
    def of(cls, steps: list[Step], tokens: int | None = None) -> Usage:
        reqs = [r for st in steps for r in st.requests]
        return cls(len(steps) if tokens is None else tokens, len(reqs), sum(r.round_trips for r in reqs),
                   sum(r.bytes for r in reqs), round(sum(st.ms for st in steps), 1), sum(r.cost_usd() for r in reqs))

    @classmethod
    def phases(cls, steps: list[Step], prompt_tokens: int) -> dict[str, Usage]:
        """The prefill (the first step, which read the prompt) and the decode apart."""
        return {"prefill": cls.of(steps[:1], prompt_tokens if steps else 0), "decode": cls.of(steps[1:])}

    def to_json(self) -> dict:
        return dict(self.__dict__)


__all__ = ["Piece", "Usage", "choice_pieces", "compare", "complete"]
