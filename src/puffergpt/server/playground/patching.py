"""Activation patching (``lens/patching.py``) and the lessons (``lens/lessons.py``) over HTTP.

- ``POST /api/patching/propose``: both prompts' tokens, checked to be as many, each one's best
  next tokens (the answer and the wrong token proposed), and what each mode would cost in
  forward passes: two runs, before anything costly;
- ``POST /api/patching``: the patching itself as server-sent events, ``start`` (both runs' d
  and the runs it costs), ``run`` per patched run (its place and r), then ``done`` with the
  grid (or ``error``). Closing the stream stops it within a run; bounded by the prompts' tokens
  (``MAX_PATCH_TOKENS``) and the server's ``--max-request-seconds``;
- ``GET /api/lessons``, ``GET /api/lessons/{id}`` and ``POST /api/lessons/{id}/run``: the
  lessons, one, and one run on the learner's prompt, each claim with its verdict.

Every run is a forward pass of searches in a run of its own, counted and marked extra.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, Literal

from fastapi import APIRouter, HTTPException
from fastapi.responses import StreamingResponse
from pydantic import Field

from puffergpt.app.protocol import request_json
from puffergpt.lens import lessons, patching
from puffergpt.lens.lessons import MAX_LESSON_PROMPT
from puffergpt.search.engine import Engine
from puffergpt.server.bodies import MAX_WORD_CHARS, Strict
from puffergpt.server.playground import responses
from puffergpt.server.playground.responses import BODY, Response, errors
from puffergpt.server.state import ConfigDep, EngineDep, GenerationsDep
from puffergpt.server.streaming import sse, stream
from puffergpt.stores.base import StoreError
from puffergpt.texts.text import TextError

router = APIRouter(prefix="/api", tags=["views"])


class ProposeBody(Strict):
    clean: str = Field(..., min_length=1, max_length=patching.MAX_PATCH_CHARS)
    corrupt: str = Field(..., min_length=1, max_length=patching.MAX_PATCH_CHARS)


class PatchBody(ProposeBody):
    answer: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    wrong: str = Field(..., min_length=1, max_length=MAX_WORD_CHARS)
    mode: Literal["positions", "heads"] = "positions"


class LessonBody(Strict):
    prompt: str | None = Field(None, min_length=1, max_length=MAX_LESSON_PROMPT)


class Proposal(Response):
    """Both prompts' tokens, each run's best next tokens, the proposed answer (the clean run's top
    choice) and wrong token (the corrupted run's), and ``runs``: the forward passes each mode costs."""

    clean: list[dict[str, Any]]
    corrupt: list[dict[str, Any]]
    answer: dict[str, Any]
    wrong: dict[str, Any]
    runs: dict[str, int]
    requests: list[dict[str, Any]]


class LessonBrief(Response):
    id: str
    title: str
    steps: int


class LessonRun(Response):
    """Each step on the learner's prompt: its ``claim`` computed from the model, whether it
    ``holds``, its ``evidence``; ``candidates``: the prompt's 10 best next tokens (an insight's)."""

    steps: list[dict[str, Any]]


@router.post("/patching/propose", response_model=Proposal, operation_id="proposePatching",
             summary="Check two prompts for patching, propose the tokens, say the cost", responses=errors(*BODY, 503))
def propose(body: ProposeBody, engine: EngineDep) -> dict:
    """Both prompts read once each (two forward passes and two top-k searches): their tokens, the
    answer and wrong token proposed, and the forward passes each mode would cost."""
    got = patching.propose(engine.open, engine.config, body.clean, body.corrupt)
    return {**got, "requests": [request_json(r) for r in got["requests"]]}


def patch_events(engine: Engine, asked: patching.Asked, stop: threading.Event) -> Iterator[str]:
    """The patching's events, in its worker thread: ``start``, ``run`` each, then ``done`` or ``error``."""
    t0, seen, requests = time.perf_counter(), [], 0
    try:
        for e in patching.patching(engine.open, engine.config, asked, should_stop=stop.is_set):
            requests += len(e["requests"])
            seen.append({k: v for k, v in e.items() if k != "requests"})
            yield sse("start" if e["kind"] == "base" else "run", {**seen[-1], "requests": requests})
        key = "layers" if asked.mode == "positions" else "heads"
        yield sse("done", {"clean_diff": seen[0]["clean_diff"], "corrupt_diff": seen[0]["corrupt_diff"],
                           key: patching.grid(engine.config, asked, seen), "runs": len(seen) + 1,
                           "requests": requests, "stopped": stop.is_set(),
                           "ms": round((time.perf_counter() - t0) * 1e3, 1)})
    except (TextError, StoreError) as e:
        yield sse("error", {"detail": str(e)})


@router.post("/patching", operation_id="patchActivations", summary="Activation patching (server-sent events)",
             response_class=StreamingResponse, responses={200: responses.event_stream(
                 "event: start (both runs' d and the runs it costs), event: run for each patched run, then "
                 "event: done with the grid, or event: error with its detail"), **errors(*BODY, 503)})
def run_patching(body: PatchBody, engine: EngineDep, config: ConfigDep, generations: GenerationsDep):
    """Each layer and position (or each head at the last position) of the clean run copied into the
    corrupted run: r = (d_patched - d_corrupt) / (d_clean - d_corrupt), d = logit(answer) -
    logit(wrong). Close the stream to stop it."""
    asked = patching.check(body.clean, body.corrupt, body.answer, body.wrong, body.mode)  # a plain 400 first
    return stream(generations, lambda stop: patch_events(engine, asked, stop),
                  farewell=lambda why: sse("error", {"detail": why.message}), limit_s=config.max_request_s)


def lesson_of(lesson_id: str, config) -> lessons.Lesson:
    try:
        return lessons.get(lesson_id, config.lessons_dir)
    except lessons.LessonError as e:
        raise HTTPException(404, str(e)) from None


@router.get("/lessons", response_model=list[LessonBrief], operation_id="listLessons", summary="The lessons")
def list_lessons(config: ConfigDep) -> list[dict]:
    """Every lesson: its id, title and number of steps (the shipped ones and the server's ``--lessons``)."""
    return [x.brief() for x in lessons.load(config.lessons_dir).values()]


@router.get("/lessons/{lesson_id}", response_model=dict[str, Any], operation_id="getLesson", summary="A lesson",
            responses=errors(404))
def get_lesson(lesson_id: str, config: ConfigDep) -> dict:
    """A lesson's summary, starter and steps (each step's title, the view it opens and what it says)."""
    return lesson_of(lesson_id, config).to_json()


@router.post("/lessons/{lesson_id}/run", response_model=LessonRun, operation_id="testLessonClaims",
             summary="Run a lesson on a prompt: each claim with its verdict", responses=errors(*BODY, 404, 503))
def run_lesson(lesson_id: str, body: LessonBody, engine: EngineDep, config: ConfigDep) -> dict:
    """Every step of the lesson on ``prompt`` (default: its starter): each claim computed from the
    model, whether it holds, and its evidence. Each step's forward passes are searches, counted."""
    got = lessons.run(lesson_of(lesson_id, config), engine.open, engine.config, body.prompt)
    return {**got, "requests": len(got["requests"])}
