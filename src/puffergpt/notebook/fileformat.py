"""The file format: an Insight rendered as Markdown with YAML front matter (``render``),
and a file read back (``parse``), which names what is wrong with a file edited by hand."""

from __future__ import annotations

import datetime as dt
import json
import re
import unicodedata

import yaml

from puffergpt.model import tokenizer
from puffergpt.notebook import controls
from puffergpt.notebook.checks import check_evidence
from puffergpt.notebook.insight import (
    CONTROLS_FORMAT,
    FORMAT_VERSION,
    FORMATS,
    UPGRADE,
    Insight,
    InvalidInsight,
    NotebookError,
)


def _fence(text: str, char: str = "`") -> str:
    """A code fence longer than any run of its character in text (CommonMark)."""
    runs = re.findall(re.escape(char) + "+", text)
    return char * max(3, 1 + max(map(len, runs), default=0))


def _shown(s: str) -> str:
    """Text shown as it is, with control characters (a terminal's escapes) written out."""
    return "".join(c if c in "\n\t" or unicodedata.category(c) != "Cc" else f"\\x{ord(c):02x}" for c in s)


def render_evidence(ev: dict) -> str:
    """The readable section: deterministic for given evidence (parse() relies on it)."""
    p, ids = ev["position"], ev["prompt_ids"]
    s = ev["sampling"]
    token = json.dumps(tokenizer.token_text(ev["token_id"]), ensure_ascii=False)
    prompt = _shown(tokenizer.decode(ids[:p]))
    fence = _fence(prompt)
    lines = ["## Evidence", "",
             f"- kind: {ev['kind']}",
             f"- model: {_shown(ev['model'])}",
             f"- position {p}: token {ev['token_id']} {_shown(token)}",
             f"- sampling: temperature {s['temperature']:g}, top-k {s['top_k']}, seed {s['seed']}",
             *controls.readable(ev),
             "", f"What the model had read ({p} tokens):", "", fence + "text", prompt, fence, "",
             f"Its {len(ev['candidates'])} candidates, best first:", ""]
    rows = [f"{'rank':>4}  {'token id':>8}  {'logit':>12}  token"]
    for i, c in enumerate(ev["candidates"]):
        text = _shown(json.dumps(tokenizer.token_text(c["token_id"]), ensure_ascii=False))
        rows.append(f"{i:>4}  {c['token_id']:>8}  {c['logit']:>12.6f}  {text}")
    table = "\n".join(rows)
    lines += [_fence(table) + "text", table, _fence(table)]
    if reqs := ev.get("requests"):
        kinds: dict[str, int] = {}
        for r in reqs:
            kinds[str(r.get("kind", "?"))] = kinds.get(str(r.get("kind", "?")), 0) + 1
        ms = sum(r["ms"] for r in reqs if type(r.get("ms")) in (int, float))
        lines += ["", f"{len(reqs)} requests ({_shown(', '.join(f'{k} x{n}' for k, n in kinds.items()))}), {ms:.1f} ms"]
    if data := ev.get("data"):
        lines += ["", f"{ev['kind']} data: {_shown(', '.join(sorted(data)))} (in the JSON below)"]
    return "\n".join(lines) + "\n"


def json_heading(version: int) -> str:
    return f"### Evidence data (format {version})"


def evidence_json(ev: dict) -> str:
    """The evidence as JSON a person can still read: a key a line, a candidate or request
    a line. Every line but the braces starts with a space, so none can end the fence."""
    def one(v) -> str:
        return json.dumps(v, ensure_ascii=False, allow_nan=False)

    lines = []
    for k, v in ev.items():
        if k in ("candidates", "requests"):
            v = "[\n" + ",\n".join(f"  {one(x)}" for x in v) + "\n ]"
        else:
            v = one(v)
        lines.append(f" {one(k)}: {v}")
    return "{\n" + ",\n".join(lines) + "\n}"


def render(ins: Insight) -> str:
    ev = ins.evidence
    front = {"version": controls.version_of(ev) if ev else FORMAT_VERSION, "id": ins.id, "title": ins.title,
             "date": ins.date, "model": ins.model, "kind": ev["kind"] if ev else None, "tags": ins.tags}
    if ins.request is not None:  # a save that may be retried: the retry finds it by this
        front["request"] = ins.request
    yaml_text = yaml.safe_dump(front, allow_unicode=True, sort_keys=False, width=10**6)
    if ev is None:  # format 2: the words only
        return f"---\n{yaml_text}---\n\n{ins.body}\n" if ins.body else f"---\n{yaml_text}---\n"
    data = evidence_json(ins.evidence)
    body = ins.body + "\n\n" if ins.body else ""
    heading = json_heading(front["version"])
    return f"---\n{yaml_text}---\n\n{body}{render_evidence(ins.evidence)}\n{heading}\n\n```json\n{data}\n```\n"


def _scalar(v) -> bool:
    return isinstance(v, (str, int, float, dt.date))  # YAML reads an unquoted date as a date


def _kind(v) -> str:
    return {list: "a list", dict: "a mapping", type(None): "nothing"}.get(type(v), type(v).__name__)


def parse(text: str, path: str) -> Insight:
    """An insight file back into an Insight; NotebookError names what is wrong."""
    if not text.startswith("---\n") or (end := text.find("\n---\n", 3)) < 0:
        raise NotebookError(f"{path}: no front matter (a file starts with '---' lines)")
    try:
        front = yaml.safe_load(text[4:end + 1])
    except yaml.YAMLError as e:
        raise NotebookError(f"{path}: the front matter is not YAML ({e})") from None
    if not isinstance(front, dict) or not {"id", "title", "date", "model", "tags", "version"} <= set(front):
        raise NotebookError(f"{path}: the front matter lacks id, title, date, model, tags or version")
    if front["version"] not in FORMATS:
        raise NotebookError(f"{path}: format {front['version']!r}; this puffergpt reads formats "
                            f"{', '.join(map(str, FORMATS))}: upgrade puffergpt ({UPGRADE})")
    no_evidence = front["version"] == 2
    needed = ("id", "title", "date") if no_evidence else ("id", "title", "date", "model")
    # A list or a mapping (YAML aliases can nest one a billion strings deep) is not what a save
    # writes: each key is named with what it holds, so a title is never reported as the tags.
    bad = [f"{k} must be text, got {_kind(front[k])}" for k in needed if not _scalar(front[k])]
    tags = front["tags"]
    if tags is not None and not isinstance(tags, list):
        bad.append(f"tags must be a list of words, got {_kind(tags)}")
    elif tags and not all(map(_scalar, tags)):
        bad.append(f"tags must be a list of words, got one that is {_kind(next(t for t in tags if not _scalar(t)))}")
    if bad:
        raise NotebookError(f"{path}: the front matter's {'; its '.join(bad)}")
    request = str(front["request"]) if _scalar(front.get("request")) else None
    if no_evidence:  # the rest is the learner's words, whatever they hold (a ```json block too)
        return Insight(id=str(front["id"]), path=path, title=str(front["title"]), body=text[end + 5:].strip("\n"),
                       tags=[str(t) for t in front["tags"] or []], date=str(front["date"]), model=None, evidence=None,
                       request=request)
    # The JSON block is the last fenced block: JSON lines never start with a fence.
    start = text.rfind("\n```json\n")
    stop = text.rfind("\n```")
    if start < 0 or stop <= start:
        raise NotebookError(f"{path}: no evidence data (a ```json block at the end)")
    try:
        ev = check_evidence(json.loads(text[start + 9:stop]))
    except (ValueError, InvalidInsight) as e:
        raise NotebookError(f"{path}: the evidence data does not read back: {e}") from None
    if controls.controlled(ev) and front["version"] < CONTROLS_FORMAT:  # what an older puffergpt would misread
        raise NotebookError(f"{path}: format {front['version']} has no sampling controls, and its evidence records "
                            f"some: a file with them is format {CONTROLS_FORMAT} (version: {CONTROLS_FORMAT})")
    heading = text.rfind(f"\n### Evidence data (format {front['version']})", 0, start)  # format 1's too
    rest = text[end + 5:heading if heading >= 0 else start]
    readable = render_evidence(ev)
    if rest.endswith(readable):
        body = rest[: -len(readable)]
    else:  # the readable part was edited by hand: the body ends at the last Evidence heading
        body = rest[: max(0, rest.rfind("## Evidence\n"))]
    return Insight(
        id=str(front["id"]),
        path=path,
        title=str(front["title"]),
        body=body.strip("\n"),
        tags=[str(t) for t in front["tags"] or []],
        date=str(front["date"]),
        model=str(front["model"]),
        evidence=ev,
        request=request,
    )
