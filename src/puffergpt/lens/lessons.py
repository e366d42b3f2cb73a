"""Lessons: guided experiments that chain the views, each step a claim tested on the live model.

A lesson is data, one YAML file in ``puffergpt/lessons/`` (``LESSONS``), its id the file's
name: a title, a summary, a starter prompt and its steps. Each step names the view the page
opens on the learner's text (``VIEWS``), what a teacher wants the learner to read (``say``), and
a check (``lab.CHECKS``, in ``lesson_checks.py``) with its arguments. The check computes a claim
from the model on the learner's prompt, its evidence, and whether it holds. A teacher adds a
lesson by adding a file (docs/lessons.md); ``load`` refuses a bad one by name.

``run`` runs every step in order on one prompt (the starter where none is given): what
``POST /api/lessons/{id}/run``, ``puffergpt lesson`` and the MCP tool ``run_lesson`` answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from puffergpt.lens import lesson_checks, patching  # noqa: F401  (lesson_checks registers the checks)
from puffergpt.lens.lab import CHECKS, Lab
from puffergpt.model.checkpoints import GPT2Config
from puffergpt.model.session import Run
from puffergpt.texts.text import TextError

# The views a step may open on the learner's text: the page's panels (static/lessons.js).
VIEWS = ("candidates", "requests", "kv", "attention", "versus", "ablate", "lens", "patching", "contexts", "insight")
ID = re.compile(r"[a-z0-9][a-z0-9-]{0,59}")
MAX_LESSON_PROMPT = 1000  # characters: a lesson's prompt is a line or a few
MAX_LESSON_TOKENS = 64  # tokens: a lesson's checks read it several times over


class LessonError(ValueError):
    """A lesson file a teacher wrote that can't be used as it is, or an id no lesson has."""


@dataclass(frozen=True)
class Step:
    title: str
    view: str
    say: str
    check: str
    args: dict


@dataclass(frozen=True)
class Lesson:
    id: str
    title: str
    summary: str
    starter: str
    steps: tuple[Step, ...]
    order: int = 100  # where it is listed: by order, then id

    def brief(self) -> dict:
        return {"id": self.id, "title": self.title, "steps": len(self.steps)}

    def to_json(self) -> dict:
        return {"id": self.id, "title": self.title, "summary": self.summary, "starter": self.starter,
                "steps": [{"title": s.title, "view": s.view, "say": s.say, "check": s.check} for s in self.steps]}


def _text(d: dict, key: str, where: str) -> str:
    v = d.get(key)
    if not isinstance(v, str) or not v.strip():
        raise LessonError(f"{where}: '{key}' must be some text")
    return v.strip() if key != "starter" else v


def _step(d, where: str) -> Step:
    if not isinstance(d, dict):
        raise LessonError(f"{where} must be a mapping with title, view, say and check")
    if extra := sorted(set(d) - {"title", "view", "say", "check", "args"}):
        raise LessonError(f"{where} has unknown keys {', '.join(map(str, extra))} (allowed: title, view, say, "
                          "check, args)")
    view, name, args = d.get("view"), d.get("check"), d.get("args") or {}
    if view not in VIEWS:
        raise LessonError(f"{where}: view {view!r} is not one of {', '.join(VIEWS)}")
    if name not in CHECKS:
        raise LessonError(f"{where}: check {name!r} is not one of {', '.join(sorted(CHECKS))}")
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise LessonError(f"{where}: args must be a mapping of names to values")
    return Step(_text(d, "title", where), view, _text(d, "say", where), name, dict(args))


def parse(lesson_id: str, text: str) -> Lesson:
    """A lesson from its file's text, checked: LessonError naming the file and the problem."""
    where = f"lesson {lesson_id!r}"
    if not ID.fullmatch(lesson_id):
        raise LessonError(f"{where}: a lesson's file name is lower-case letters, digits and '-' (then .yaml)")
    try:
        d = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise LessonError(f"{where} is not valid YAML: {e}") from None
    if not isinstance(d, dict):
        raise LessonError(f"{where} must be a mapping with title, summary, starter and steps")
    if extra := sorted(set(d) - {"order", "title", "summary", "starter", "steps"}):
        raise LessonError(f"{where} has unknown keys {', '.join(map(str, extra))} (allowed: order, title, summary, "
                          "starter, steps)")
    order = d.get("order", 100)
    if isinstance(order, bool) or not isinstance(order, int):
        raise LessonError(f"{where}: 'order' (where it is listed) must be a whole number, got {order!r}")
    title, summary, starter = (_text(d, key, where) for key in ("title", "summary", "starter"))
    steps = d.get("steps")
    if not isinstance(steps, list) or not steps:
        raise LessonError(f"{where}: 'steps' must be a list of at least one step")
    return Lesson(lesson_id, title, summary, starter, tuple(_step(s, f"{where}, step {i + 1}")
                                                            for i, s in enumerate(steps)), order)


def folder() -> Path:
    return Path(str(resources.files("puffergpt") / "lessons"))


def load(extra: Path | None = None) -> dict[str, Lesson]:
    """Every lesson, by id, listed by their ``order``, then id: the package's, and a teacher's own
    folder's (``serve --lessons DIR``), whose file replaces a shipped lesson of the same id."""
    found = {f.stem: f for f in sorted(folder().glob("*.yaml"))}
    if extra is not None:
        found |= {f.stem: f for f in sorted(check_folder(extra).glob("*.yaml"))}
    got = [parse(i, f.read_text(encoding="utf-8")) for i, f in found.items()]
    return {x.id: x for x in sorted(got, key=lambda x: (x.order, x.id))}


def check_folder(where) -> Path:
    """A teacher's folder of lessons: it exists, and every lesson in it reads (LessonError naming
    the file and the problem), so that a typo shows when the server starts, not in class."""
    where = Path(where).expanduser()
    if not where.is_dir():
        raise LessonError(f"{str(where)[:200]!r} is not a folder of lessons: give a directory of YAML files "
                          "(docs/lessons.md)")
    files = sorted(where.glob("*.yaml"))
    if not files:
        raise LessonError(f"{str(where)[:200]!r} holds no lesson: each lesson is a file NAME.yaml (docs/lessons.md)")
    for f in files:
        try:
            parse(f.stem, f.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise LessonError(f"{f}: not UTF-8 text") from None
        except LessonError as e:
            raise LessonError(f"{f}: {e}") from None
    return where


def get(lesson_id, extra: Path | None = None) -> Lesson:
    lessons = load(extra)
    if lesson_id not in lessons:
        raise LessonError(f"there is no lesson {str(lesson_id)[:60]!r}: the lessons are {', '.join(lessons)}")
    return lessons[lesson_id]


def check_prompt(prompt) -> list[int]:
    return patching.bounded_ids(prompt, "lesson's", MAX_LESSON_PROMPT, MAX_LESSON_TOKENS, "each step reads it again")


def run(lesson: Lesson, open_run: Callable[[], Run], config: GPT2Config, prompt: str | None = None) -> dict:
    """Every step of the lesson on ``prompt`` (the starter where None), in order: {"id", "title",
    "prompt", "prompt_ids", "steps": [{"title", "view", "say", "claim", "holds", "evidence"}],
    "candidates" (the prompt's 10 best next tokens: what an insight saved from a step keeps),
    "requests" (the store's, in order)}. A step that can't be tested on this prompt says why, as
    a claim that does not hold."""
    prompt = lesson.starter if prompt is None else prompt
    lab = Lab(open_run, config, prompt, check_prompt(prompt))
    steps = []
    for step in lesson.steps:
        try:
            got = CHECKS[step.check](lab, **step.args)
        except TextError as e:  # the prompt lacks what the step needs: said, as a claim that fails
            got = {"claim": str(e), "holds": False, "evidence": {}}
        steps.append({"title": step.title, "view": step.view, "say": step.say, **got})
    return {"id": lesson.id, "title": lesson.title, "prompt": prompt, "prompt_ids": lab.ids, "steps": steps,
            "candidates": lab.top(10), "requests": lab.requests}


def contract(got: dict) -> dict:
    """What ``puffergpt lesson --json`` prints: {"steps": [{"title", "claim", "holds", "evidence"}]}."""
    return {"id": got["id"], "prompt": got["prompt"],
            "steps": [{k: s[k] for k in ("title", "claim", "holds", "evidence")} for s in got["steps"]]}


__all__ = ["VIEWS", "Lesson", "LessonError", "contract", "get", "load", "parse", "run"]
