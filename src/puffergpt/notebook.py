"""The insight notebook: what clicked for the learner, in their words, with the evidence.

A notebook is a git repository on the user's disk. Each insight is one Markdown file,
``insights/<id>.md``, written and committed in one step:

    ---                         front matter (YAML): version, id, title, date, model, kind, tags
    ...
    ---
    the learner's words         (the body, as they wrote it)

    ## Evidence                 readable: prompt, token, candidates, sampling, requests

    ### Evidence data (format 1)
    ```json                     machine-readable: the evidence dict, exactly as saved
    {...}
    ```

An insight from a conversation (an assistant over MCP, a custom GPT's action) has no
evidence: its file is format 2, the front matter and the learner's words only (``model``
and ``kind`` null), and ``replay`` says there is nothing to replay. A file with evidence is
written as format 1 still, so an older puffergpt reads every insight that has evidence.

The evidence is what the learner was looking at, so that the insight can be replayed
(``replay``) and its scores re-checked. Its keys (checked by ``check_evidence``):

    kind        "token" | "candidates" | "attention" | "lens" | "analogy"
    model       the model's name ("demo", "gpt2", a checkpoint path)
    prompt_ids  the text's token ids (at least ``position`` of them)
    position    p >= 1: the candidates are the model's scores for the token at p,
                having read prompt_ids[:p] (the playground's step at p)
    token_id    the token at p (prompt_ids[p] when the text goes on past p)
    sampling    {"temperature": >= 0, "top_k": >= 1, "seed": int or null}
    candidates  [{"token_id", "logit"}, ...] best first, as the engine returned them
    requests    optional: the requests that produced them, [{"kind", "rows", "ms", ...}, ...]
    data        optional, kind-specific: attention {"layer", "head", "weights"},
                lens {"layer", "ids", "logits"}, analogy {"terms", "ids", "scores"}

git runs as the ``git`` binary with argument lists (never a shell). A failed commit
leaves the file on disk and the next save commits it too; a failed push keeps the commit.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import json
import logging
import math
import os
import re
import secrets
import stat
import subprocess
import threading
import unicodedata
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import numpy as np
import yaml

from puffergpt import tokenizer
from puffergpt.text import KEEP_CANDIDATES, MAX_PROMPT_IDS

if TYPE_CHECKING:
    from puffergpt.reference import Products

log = logging.getLogger("puffergpt.notebook")

FORMAT_VERSION = 2  # the newest format written: 2 is an insight without evidence
EVIDENCE_FORMAT = 1  # an insight with evidence is written in format 1, unchanged
FORMATS = (1, 2)  # the formats this puffergpt reads
NO_EVIDENCE = "no evidence (saved from a conversation)"
NOTHING_TO_REPLAY = ("nothing to replay: this insight has no evidence (it was saved from a conversation, "
                     "not from the playground), so there are no scores to recompute")
INSIGHTS = "insights"  # the folder of insight files inside the notebook
KINDS = ("token", "candidates", "attention", "lens", "analogy")
TOLERANCE = 1e-3  # replayed scores must match the stored ones within this

# Bounds on what a user or a page sends (the server's 64 KiB body bound holds them all).
MAX_TITLE_CHARS = 200
MAX_BODY_CHARS = 20_000
MAX_TAGS = 16
MAX_TAG_CHARS = 32
MAX_MODEL_CHARS = 500
MAX_CANDIDATES = KEEP_CANDIDATES  # what a text's step keeps, so what replay can recompute
MAX_EVIDENCE_BYTES = 48 * 1024  # of the evidence as compact JSON
MAX_QUERY_CHARS = 200
MAX_FILE_BYTES = 1 << 20  # an insight file read back (the largest a save writes is under 512 KB)

ID_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,99}")
TAG_RE = re.compile(r"[\w][\w.+-]*")
SLUG_CHARS = 60
EVIDENCE_KEYS = ("kind", "model", "prompt_ids", "position", "token_id", "sampling", "candidates")
OPTIONAL_KEYS = ("requests", "data")
GIT_TIMEOUT_S = 60
PUSH_TIMEOUT_S = 300
# Used only where the user's git has no identity configured.
DEFAULT_NAME, DEFAULT_EMAIL = "puffergpt notebook", "notebook@puffergpt.invalid"

CandidatesAt = Callable[[Sequence[int], int, int], tuple[Sequence[int], Sequence[float]]]
"""candidates_at(prompt_ids, position, k) -> (ids, logits): the model's top-k for the token
at ``position``, having read prompt_ids[:position], best first."""


class NotebookError(Exception):
    """A notebook problem the user can act on; the message says what to do."""


class InvalidInsight(NotebookError, ValueError):
    """A title, body, tag or evidence that can't be saved as it is."""


class InsightNotFound(NotebookError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class GitError(NotebookError):
    """git is missing or failed; nothing saved was lost (the message says where it is)."""


class NotebookUnavailable(NotebookError):
    """The notebook's files could not be written or read (a read-only notebook, a full
    disk, permissions); nothing saved was lost, and the message says why and where."""


@dataclass
class Insight:
    id: str
    path: str  # relative to the notebook, posix
    title: str
    body: str
    tags: list[str]
    date: str  # ISO 8601, UTC
    model: str | None  # the evidence's model; None without evidence
    evidence: dict | None  # None for an insight from a conversation
    commit: str | None = None  # the last commit that holds the file; None until committed

    def summary(self) -> dict:
        return {"id": self.id, "path": self.path, "title": self.title, "tags": self.tags, "date": self.date,
                "model": self.model, "kind": self.evidence["kind"] if self.evidence else None,
                "evidence": self.evidence is not None, "commit": self.commit}

    def to_json(self) -> dict:
        return asdict(self)


# --- checking what comes from outside ----------------------------------------------------

def _control_chars(s: str, allowed: str = "", categories: tuple[str, ...] = ("Cc",)) -> list[str]:
    return sorted({repr(c) for c in s if unicodedata.category(c) in categories and c not in allowed})


def check_title(title) -> str:
    if not isinstance(title, str):
        raise InvalidInsight(f"the title must be text, got {type(title).__name__}")
    title = title.strip()
    if not title:
        raise InvalidInsight("the title is empty: give the insight a short title")
    if len(title) > MAX_TITLE_CHARS:
        raise InvalidInsight(f"the title has {len(title)} characters, at most {MAX_TITLE_CHARS}: shorten it")
    if bad := _control_chars(title, categories=("Cc", "Zl", "Zp")):  # line and paragraph separators too
        raise InvalidInsight(f"the title has control characters ({', '.join(bad)}): a title is one line of text")
    return title


def check_body(body) -> str:
    if not isinstance(body, str):
        raise InvalidInsight(f"the body must be text, got {type(body).__name__}")
    body = body.replace("\r\n", "\n").replace("\r", "\n").strip("\n")
    if len(body) > MAX_BODY_CHARS:
        raise InvalidInsight(f"the body has {len(body)} characters, at most {MAX_BODY_CHARS}: shorten it")
    if bad := _control_chars(body, "\n\t"):
        raise InvalidInsight(f"the body has control characters ({', '.join(bad)}): only text, new lines and tabs")
    return body


def check_tags(tags) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str) or not isinstance(tags, (list, tuple)):
        raise InvalidInsight(f"tags must be a list of words, got {type(tags).__name__}")
    if len(tags) > MAX_TAGS:
        raise InvalidInsight(f"{len(tags)} tags, at most {MAX_TAGS}")
    out: list[str] = []
    for t in tags:
        if not isinstance(t, str) or not TAG_RE.fullmatch(t.strip()) or len(t.strip()) > MAX_TAG_CHARS:
            raise InvalidInsight(f"tag {t!r}: a tag is one word of letters, digits, '.', '+', '-' or '_', "
                                 f"at most {MAX_TAG_CHARS} characters")
        if t.strip() not in out:
            out.append(t.strip())
    return out


def _int(v, what: str, lo: int, hi: int | None = None) -> int:
    # bool is an int in Python, never in the evidence
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v >= hi):
        rng = f"{lo}..{hi - 1}" if hi is not None else f">= {lo}"
        raise InvalidInsight(f"evidence {what} must be an integer in {rng}, got {v!r}")
    return v


def _number(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidInsight(f"evidence {what} must be a finite number, got {v!r}")
    return float(v)


def _keys(d, what: str, required: Sequence[str], optional: Sequence[str] = ()) -> dict:
    if not isinstance(d, dict):
        raise InvalidInsight(f"evidence {what} must be an object, got {type(d).__name__}")
    if missing := [k for k in required if k not in d]:
        raise InvalidInsight(f"evidence {what} lacks {', '.join(missing)} (it needs {', '.join(required)})")
    if extra := [k for k in d if k not in required and k not in optional]:
        raise InvalidInsight(f"evidence {what} has unknown keys {', '.join(map(str, extra))} "
                             f"(allowed: {', '.join([*required, *optional])})")
    return d


def check_evidence(ev, n_vocab: int = tokenizer.VOCAB_SIZE) -> dict:
    """The evidence, checked for replay and normalised (numbers as floats); raises
    InvalidInsight naming the first problem."""
    _keys(ev, "", EVIDENCE_KEYS, OPTIONAL_KEYS)
    if ev["kind"] not in KINDS:
        raise InvalidInsight(f"evidence kind must be one of {', '.join(KINDS)}, got {ev['kind']!r}")
    model = ev["model"]
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_CHARS or _control_chars(model):
        raise InvalidInsight(
            f"evidence model must be a model's name (one line, at most {MAX_MODEL_CHARS} characters), got {model!r}"
        )
    ids = ev["prompt_ids"]
    if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_PROMPT_IDS:
        raise InvalidInsight(f"evidence prompt_ids must be a list of 1 to {MAX_PROMPT_IDS} token ids")
    ids = [_int(t, f"prompt_ids[{i}]", 0, n_vocab) for i, t in enumerate(ids)]
    p = _int(ev["position"], "position", 1, len(ids) + 1)
    token = _int(ev["token_id"], "token_id", 0, n_vocab)
    if p < len(ids) and ids[p] != token:
        raise InvalidInsight(f"evidence token_id {token} is not the token at position {p} of prompt_ids ({ids[p]})")
    s = _keys(ev["sampling"], "sampling", ("temperature", "top_k", "seed"))
    sampling = {"temperature": _number(s["temperature"], "sampling.temperature"),
                "top_k": _int(s["top_k"], "sampling.top_k", 1, n_vocab + 1),
                "seed": None if s["seed"] is None else _int(s["seed"], "sampling.seed", 0, 2**63)}
    if sampling["temperature"] < 0:
        raise InvalidInsight(f"evidence sampling.temperature must be >= 0, got {sampling['temperature']}")
    cands = ev["candidates"]
    if not isinstance(cands, list) or not 1 <= len(cands) <= MAX_CANDIDATES:
        raise InvalidInsight(f"evidence candidates must be a list of 1 to {MAX_CANDIDATES} {{token_id, logit}}")
    cands = [_keys(c, f"candidates[{i}]", ("token_id", "logit")) for i, c in enumerate(cands)]
    cands = [{"token_id": _int(c["token_id"], f"candidates[{i}].token_id", 0, n_vocab),
              "logit": _number(c["logit"], f"candidates[{i}].logit")} for i, c in enumerate(cands)]
    if len({c["token_id"] for c in cands}) != len(cands):
        raise InvalidInsight("evidence candidates repeat a token_id: each candidate is a different token")
    out = {"kind": ev["kind"], "model": model.strip(), "prompt_ids": ids, "position": p, "token_id": token,
           "sampling": sampling, "candidates": cands}
    if "requests" in ev:
        out["requests"] = _requests(ev["requests"])
    if "data" in ev:
        out["data"] = _data(ev["kind"], ev["data"])
    size = len(json.dumps(out, separators=(",", ":")))
    if size > MAX_EVIDENCE_BYTES:
        raise InvalidInsight(f"the evidence is {size:,} bytes as JSON, at most {MAX_EVIDENCE_BYTES:,}: "
                             "attach fewer candidates or less kind-specific data")
    return out


def _requests(reqs) -> list[dict]:
    if not isinstance(reqs, list):
        raise InvalidInsight("evidence requests must be a list of objects")
    for i, r in enumerate(reqs):
        if not isinstance(r, dict) or not all(isinstance(k, str) for k in r):
            raise InvalidInsight(f"evidence requests[{i}] must be an object")
        for k, v in r.items():
            if not (v is None or isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))):
                raise InvalidInsight(f"evidence requests[{i}].{k} must be text, a finite number or null")
    return reqs


def _data(kind: str, data) -> dict:
    if not isinstance(data, dict):
        raise InvalidInsight("evidence data must be an object")
    try:  # finite numbers only: the file's JSON must read back as it was
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidInsight(f"evidence data must be plain JSON with finite numbers ({e})") from None
    for key in {"attention": ("layer", "head"), "lens": ("layer",)}.get(kind, ()):
        if key in data:
            _int(data[key], f"data.{key}", 0)
    return data


def check_id(insight_id) -> str:
    # Ids name files: only what save() makes, so no path can leave the folder.
    if not isinstance(insight_id, str) or not ID_RE.fullmatch(insight_id):
        raise InsightNotFound(f"no insight {insight_id!r}: an insight id is lowercase letters, digits and '-'")
    return insight_id


def slug(title: str) -> str:
    """A safe file-name part from any title: ASCII letters and digits joined by '-'."""
    ascii_ = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    s = re.sub(r"[^a-z0-9]+", "-", ascii_.lower()).strip("-")
    return s[:SLUG_CHARS].rstrip("-") or "insight"


# --- the file format ---------------------------------------------------------------------

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


JSON_HEADING = f"### Evidence data (format {EVIDENCE_FORMAT})"


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
    front = {"version": EVIDENCE_FORMAT if ev else FORMAT_VERSION, "id": ins.id, "title": ins.title, "date": ins.date,
             "model": ins.model, "kind": ev["kind"] if ev else None, "tags": ins.tags}
    yaml_text = yaml.safe_dump(front, allow_unicode=True, sort_keys=False, width=10**6)
    if ev is None:  # format 2: the words only
        return f"---\n{yaml_text}---\n\n{ins.body}\n" if ins.body else f"---\n{yaml_text}---\n"
    data = evidence_json(ins.evidence)
    body = ins.body + "\n\n" if ins.body else ""
    return f"---\n{yaml_text}---\n\n{body}{render_evidence(ins.evidence)}\n{JSON_HEADING}\n\n```json\n{data}\n```\n"


def _scalar(v) -> bool:
    return isinstance(v, (str, int, float, dt.date))  # YAML reads an unquoted date as a date


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
                            f"{', '.join(map(str, FORMATS))}: upgrade puffergpt")
    no_evidence = front["version"] == 2
    needed = ("id", "title", "date") if no_evidence else ("id", "title", "date", "model")
    if bad := [k for k in needed if not _scalar(front[k])] + (
        []
        if front["tags"] is None or isinstance(front["tags"], list) and all(map(_scalar, front["tags"]))
        else ["tags"]
    ):
        # a list or a mapping (YAML aliases can nest one a billion strings deep) is not what a save writes
        raise NotebookError(f"{path}: the front matter's {', '.join(bad)} must be text (tags a list of words)")
    if no_evidence:  # the rest is the learner's words, whatever they hold (a ```json block too)
        return Insight(id=str(front["id"]), path=path, title=str(front["title"]), body=text[end + 5:].strip("\n"),
                       tags=[str(t) for t in front["tags"] or []], date=str(front["date"]), model=None, evidence=None)
    # The JSON block is the last fenced block: JSON lines never start with a fence.
    start = text.rfind("\n```json\n")
    stop = text.rfind("\n```")
    if start < 0 or stop <= start:
        raise NotebookError(f"{path}: no evidence data (a ```json block at the end)")
    try:
        ev = check_evidence(json.loads(text[start + 9:stop]))
    except (ValueError, InvalidInsight) as e:
        raise NotebookError(f"{path}: the evidence data does not read back: {e}") from None
    heading = text.rfind("\n" + JSON_HEADING, 0, start)
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
    )


# --- the notebook ------------------------------------------------------------------------

class Notebook:
    """A git repository of insight files. ``path`` is initialised as a repository when it
    is absent or empty (with ``create``); a non-empty directory that is not a repository
    of its own is refused. ``git`` is the git binary to run."""

    def __init__(self, path: str | Path, create: bool = True, git: str = "git"):
        self.path = Path(path).expanduser().absolute()
        self.git_binary = git
        self.lock = threading.Lock()  # one save or push at a time: git's index is one file
        self._open(create)

    def _open(self, create: bool) -> None:
        p = self.path
        if p.exists() and not p.is_dir():
            raise NotebookError(f"{p} is a file, not a notebook directory: pick a directory")
        if (p / ".git").exists():
            top = self._git("rev-parse", "--show-toplevel", what="read the notebook repository").strip()
            if Path(top).resolve() != p.resolve():
                raise NotebookError(
                    f"{p} is inside the git repository {top}, not one of its own: pick another directory"
                )
            return
        if p.exists() and any(p.iterdir()):
            raise NotebookError(f"{p} is not empty and is not a git repository: use an empty (or new) directory "
                                "for the notebook, or an existing notebook repository")
        if not create:
            raise NotebookError(f"there is no notebook at {p} yet: save an insight first (or give --notebook DIR)")
        p.mkdir(parents=True, exist_ok=True)
        self._git("init", "-q", "-b", "main", what="initialise the notebook repository")

    # --- git ---

    def _git(self, *args: str, what: str, timeout: float = GIT_TIMEOUT_S, env: dict | None = None) -> str:
        """Run git in the notebook with an argument list; GitError says what failed and why."""
        try:
            cmd = [self.git_binary, "-C", str(self.path), *self._identity(args), *args]
            r = subprocess.run(cmd, capture_output=True, text=True, encoding="utf-8", errors="replace",
                               timeout=timeout, env=env, stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise GitError(
                f"could not {what}: git is not installed (no {self.git_binary!r} on PATH); install git"
            ) from None
        except subprocess.TimeoutExpired:
            raise GitError(f"could not {what}: git took more than {timeout:.0f} s") from None
        if r.returncode != 0:
            err = (r.stderr or r.stdout).strip()
            if "index.lock" in err:
                raise GitError(
                    f"could not {what}: git's index is locked ({self.path / '.git' / 'index.lock'} exists). "
                    "Another git command is running in the notebook, or one crashed: "
                    "if none is running, delete that file"
                )
            raise GitError(f"could not {what}: git {args[0]} failed: {err[-800:] or f'exit status {r.returncode}'}")
        return r.stdout

    def _identity(self, args: tuple[str, ...]) -> list[str]:
        """``-c user.name=... -c user.email=...`` where the user's git has none, for commits."""
        if args[0] != "commit":
            return []
        out = []
        for key, default in (("user.name", DEFAULT_NAME), ("user.email", DEFAULT_EMAIL)):
            r = subprocess.run([self.git_binary, "-C", str(self.path), "config", "--get", key],
                               capture_output=True, text=True, timeout=GIT_TIMEOUT_S, stdin=subprocess.DEVNULL)
            if r.returncode != 0 or not r.stdout.strip():
                out += ["-c", f"{key}={default}"]
        return out

    def _pending(self) -> list[str]:
        """Insight files not committed as they are (a save whose commit failed), posix paths."""
        out = self._git(
            "status", "--porcelain", "-z", "--untracked-files=all", "--", INSIGHTS, what="read the notebook's status"
        )
        paths = [e[3:] for e in out.split("\0") if len(e) > 3 and e[1] != "D" and e[0] != "D"]
        return sorted(
            p for p in paths if PurePosixPath(p).suffix == ".md" and PurePosixPath(p).parent == PurePosixPath(INSIGHTS)
        )

    def _commit(self, message: str) -> str:
        files = self._pending()
        if not files:
            raise NotebookError("nothing to commit")  # save always has its new file
        self._git("add", "--", *files, what="stage the insight")
        self._git("commit", "-q", "-m", message, "--", *files, what="commit the insight")
        return self._git("rev-parse", "HEAD", what="read the commit").strip()

    # --- insights ---

    def save(self, title: str, body: str, tags: Sequence[str] | None, evidence: dict | None = None) -> Insight:
        """Write one insight file and commit it (with any earlier uncommitted ones). On a
        git failure the file stays and GitError says where; the next save commits it.
        ``evidence`` None is an insight from a conversation: the words only."""
        ev = None if evidence is None else check_evidence(evidence)
        ins = Insight(id="", path="", title=check_title(title), body=check_body(body), tags=check_tags(tags),
                      date=dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
                      model=ev["model"] if ev else None, evidence=ev)
        with self.lock:
            self._write(ins)
            earlier = [f for f in self._pending_or_empty() if f != ins.path]
            message = self._message(ins, earlier)
            try:
                ins.commit = self._commit(message)
            except GitError as e:
                raise GitError(f"the insight is saved in {self.path / ins.path} but not committed ({e}). "
                               "It will be committed with the next save.") from None
        return ins

    def _pending_or_empty(self) -> list[str]:
        try:
            return self._pending()
        except GitError:
            return []  # the commit below reports git's failure

    # --- files: read as untrusted, through the insights folder's descriptor, never a link ---

    @contextlib.contextmanager
    def _insights(self, create: bool = False) -> Iterator[int | None]:
        """The insights folder as a directory descriptor that every read and write goes
        through, opened without following a symbolic link (a link would lead out of the
        notebook); None when it is absent and not ``create``."""
        folder, fd = self.path / INSIGHTS, None
        try:
            root = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fd = self._open_folder(root, create)
            finally:
                os.close(root)
        except FileNotFoundError:
            if create:
                raise NotebookUnavailable(
                    f"the notebook folder {self.path} is gone: serve again with --notebook DIR"
                ) from None
        except OSError as e:
            if folder.is_symlink():
                raise NotebookError(
                    f"{folder} is a symbolic link (to {os.readlink(folder)}): puffergpt reads and writes "
                    "insights only inside the notebook. Replace the link with a folder holding the same "
                    "files"
                ) from None
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                raise NotebookError(
                    f"{folder} is not a folder: move it away, and the next save makes the folder"
                ) from None
            raise self._unavailable(e, f"open {folder}", writing=create) from None
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    @staticmethod
    def _open_folder(root: int, create: bool) -> int | None:
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW  # a link is ELOOP (or ENOTDIR), not followed
        try:
            return os.open(INSIGHTS, flags, dir_fd=root)
        except FileNotFoundError:
            if not create:
                return None
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process
            os.mkdir(INSIGHTS, dir_fd=root)
        return os.open(INSIGHTS, flags, dir_fd=root)

    def _unavailable(self, e: OSError, doing: str, writing: bool = True) -> NotebookUnavailable:
        if not writing:
            fix = "check that the server's user may read the notebook's files"
        elif e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = (f"the notebook is read-only: make it writable (`chmod -R u+w {self.path}`) "
                   "or serve with another --notebook DIR")
        elif e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            fix = "the disk is full: free some space and save again"
        else:
            fix = "check the notebook's folder and save again"
        return NotebookUnavailable(f"could not {doing}: {e.strerror or e}. {fix[0].upper()}{fix[1:]}")

    def _read(self, folder: int, name: str) -> str:
        """One insight file's text, read as untrusted: a regular file in the folder (not a
        link, a FIFO, a device), at most MAX_FILE_BYTES, UTF-8. FileNotFoundError when it
        is absent; NotebookError naming the file otherwise."""
        rel = f"{INSIGHTS}/{name}"
        try:  # O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except FileNotFoundError:
            raise
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise NotebookError(f"{rel} is a symbolic link: puffergpt reads insights only inside the notebook, "
                                    "never through a link. Replace the link with the file itself") from None
            raise self._unavailable(e, f"read {self.path / rel}", writing=False) from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise NotebookError(f"{rel} is not a regular file: move it out of the notebook's {INSIGHTS} folder")
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise NotebookError(f"{rel} has more than {MAX_FILE_BYTES} bytes, more than a save writes: "
                                f"move it out of the notebook's {INSIGHTS} folder")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise NotebookError(
                f"{rel} is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}): fix the file, "
                f"or restore its committed version with `git -C {self.path} checkout -- {rel}`"
            ) from None

    def _write(self, ins: Insight) -> None:
        """Write the file under a new id; never over another insight's file, never through
        a link, nothing left half-written when the disk refuses."""
        stamp = ins.date[:19].replace(":", "").replace("T", "-")  # 2025-01-02-153000
        with self._insights(create=True) as folder:
            for _ in range(8):
                ins.id = f"{stamp}-{slug(ins.title)}-{secrets.token_hex(3)}"
                ins.path = f"{INSIGHTS}/{ins.id}.md"
                try:
                    if self._write_new(folder, ins.id, render(ins)):
                        return
                except OSError as e:
                    raise self._unavailable(e, f"write the insight in {self.path / INSIGHTS}") from None
        raise NotebookError("could not find a free file name for the insight: try again")

    @staticmethod
    def _write_new(folder: int, insight_id: str, text: str) -> bool:
        """Write ``text`` to a temporary file and link it as ``<id>.md``; False if that
        name is taken (the link fails: no overwrite)."""
        tmp = f".{insight_id}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666, dir_fd=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
            os.link(tmp, f"{insight_id}.md", src_dir_fd=folder, dst_dir_fd=folder, follow_symlinks=False)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp, dir_fd=folder)

    @staticmethod
    def _message(ins: Insight, earlier: list[str]) -> str:
        ev = ins.evidence
        lines = [f"Insight: {ins.title}", "",
                 f"{ev['kind']} evidence from {ev['model']} at position {ev['position']} "
                 f"(token {ev['token_id']}, {len(ev['candidates'])} candidates)." if ev
                 else "No evidence: saved from a conversation."]
        if ins.tags:
            lines.append(f"Tags: {', '.join(ins.tags)}")
        lines.append(f"File: {ins.path}")
        if earlier:
            lines += ["", "Also commits insight files not committed before (an earlier commit failed):", *earlier]
        return "\n".join(lines) + "\n"

    def get(self, insight_id: str) -> Insight:
        name = f"{check_id(insight_id)}.md"
        with self._insights() as folder:
            try:
                text = None if folder is None else self._read(folder, name)
            except FileNotFoundError:
                text = None
        if text is None:
            raise InsightNotFound(f"no insight {insight_id!r} in {self.path}")
        ins = parse(text, f"{INSIGHTS}/{name}")
        ins.commit = self._commits().get(ins.path)
        return ins

    def list(self, query: str | None = None, tag: str | None = None) -> list[Insight]:
        """Insights, newest first; ``query`` matches title, body and tags (any case), ``tag``
        one tag. A file that does not read is left out with a warning in the log."""
        if query is not None and len(query) > MAX_QUERY_CHARS:
            raise InvalidInsight(f"the search has {len(query)} characters, at most {MAX_QUERY_CHARS}")
        q, t = (query or "").strip().casefold(), (tag or "").strip().casefold()
        commits, out = self._commits(), []
        for ins in self._read_all():
            if t and t not in (x.casefold() for x in ins.tags):
                continue
            if q and q not in "\n".join([ins.title, ins.body, *ins.tags]).casefold():
                continue
            ins.commit = commits.get(ins.path)
            out.append(ins)
        return sorted(out, key=lambda i: (i.date, i.id), reverse=True)

    def _read_all(self) -> Iterator[Insight]:
        """Every insight file that reads; one that does not is left out with a warning."""
        with self._insights() as folder:
            for name in [] if folder is None else sorted(os.listdir(folder)):
                if not (name.endswith(".md") and ID_RE.fullmatch(name[:-3])):
                    continue
                try:
                    yield parse(self._read(folder, name), f"{INSIGHTS}/{name}")
                except (NotebookError, OSError) as e:
                    log.warning("skipping %s: %s", self.path / INSIGHTS / name, e)

    def _commits(self) -> dict[str, str]:
        """The latest commit of each insight file, from one git log."""
        try:
            out = self._git("log", "--format=%x00%H", "--name-only", "--", INSIGHTS, what="read the notebook's history")
        except GitError as e:
            if "does not have any commits" in str(e) or "bad default revision" in str(e):
                return {}
            raise
        latest: dict[str, str] = {}
        for block in out.split("\0")[1:]:
            sha, *files = block.strip().split("\n")
            for f in files:
                latest.setdefault(f.strip(), sha)
        return latest

    def push(self) -> dict:
        """Commit what an earlier save left uncommitted, then push to the remote with the
        user's own git setup. A failed push is a GitError; the commits stay."""
        with self.lock:
            remotes = self._git("remote", what="read the notebook's remotes").split()
            if not remotes:
                raise NotebookError(f"the notebook at {self.path} has no remote: add one with "
                                    f"`git -C {self.path} remote add origin URL`, then push again")
            if self._pending():
                self._commit("Insights saved earlier whose commit had failed\n")
            if not self._commits():
                raise NotebookError(f"the notebook at {self.path} has no insights yet: nothing to push")
            branch = self._git("rev-parse", "--abbrev-ref", "HEAD", what="read the notebook's branch").strip()
            upstream = self._upstream()
            remote = upstream.split("/", 1)[0] if upstream else ("origin" if "origin" in remotes else remotes[0])
            args = ("push", "--porcelain") if upstream else ("push", "--porcelain", remote, f"HEAD:refs/heads/{branch}")
            # The user's own environment (HOME, credential helpers), and never a prompt for a password nobody will type.
            env = {**os.environ, "GIT_TERMINAL_PROMPT": "0"}
            try:
                out = self._git(*args, what=f"push the notebook to {remote}", timeout=PUSH_TIMEOUT_S, env=env)
            except GitError as e:
                raise GitError(
                    f"{e}. Your insights are committed in {self.path}: push again when the remote is reachable "
                    f"(if git says the remote has commits you lack, `git -C {self.path} pull --rebase` first)."
                ) from None
            head = self._git("rev-parse", "HEAD", what="read the commit").strip()
        return {"remote": remote, "branch": branch, "commit": head, "output": out.strip()}

    def _upstream(self) -> str | None:
        try:
            return (
                self._git("rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{u}", what="read the upstream").strip()
                or None
            )
        except GitError:
            return None


# --- replay ------------------------------------------------------------------------------

def replay(
    insight: Insight | dict, candidates_at: CandidatesAt, tolerance: float = TOLERANCE, model: str | None = None
) -> dict:
    """Recompute the stored candidates with ``candidates_at`` and compare them: the same
    ids in the same order, and each token's logit within ``tolerance`` of the stored one.
    ``model``, when given, is the model candidates_at runs; another model is an error.
    An insight without evidence replays to ``{"replayable": False, "matches": None, "reason"}``."""
    if isinstance(insight, Insight) and insight.evidence is None:
        return {"replayable": False, "matches": None, "reason": NOTHING_TO_REPLAY}
    ev = insight.evidence if isinstance(insight, Insight) else check_evidence(insight)
    if model is not None and model != ev["model"]:
        raise InvalidInsight(
            f"this insight was saved from model {ev['model']!r}, not {model!r}: replay it with that model"
        )
    stored = ev["candidates"]
    ids, logits = candidates_at(ev["prompt_ids"], ev["position"], len(stored))
    now = [{"token_id": int(i), "logit": float(v)} for i, v in zip(ids, logits, strict=True)]
    by_id = {c["token_id"]: c["logit"] for c in now}
    diffs = [abs(c["logit"] - by_id[c["token_id"]]) for c in stored if c["token_id"] in by_id]
    first = []
    for rank, (was, is_) in enumerate(zip(stored, now, strict=False)):  # replay may find fewer
        d = abs(was["logit"] - by_id[was["token_id"]]) if was["token_id"] in by_id else None
        if was["token_id"] != is_["token_id"] or d is None or d > tolerance:
            first.append({"rank": rank, "stored": was, "now": is_, "diff": d})
        if len(first) == 5:
            break
    same_ids = [c["token_id"] for c in stored] == [c["token_id"] for c in now]
    missing = sum(c["token_id"] not in by_id for c in stored)
    max_diff = float(np.max(diffs)) if diffs else None
    return {
        "replayable": True,
        "matches": same_ids and max_diff is not None and max_diff <= tolerance,
        "same_ids": same_ids,
        "max_abs_diff": max_diff,
        "tolerance": tolerance,
        "missing": missing,
        "first_differences": first,
        "now": now,
    }


def candidates_from_products(open_products: Callable[[], Products]) -> CandidatesAt:
    """A candidates_at over any Products (the engine's ``open``, or numpy's), through the
    application layer's one generation path, as the playground reads a text:
    prompt_ids[:position] in one prefill, then the top-k for the token at position."""
    from puffergpt.completion import complete
    from puffergpt.sampling import Sampling

    def candidates_at(prompt_ids: Sequence[int], position: int, k: int):
        (step,) = list(complete(open_products, list(prompt_ids[:position]), 1, Sampling(1.0, k)))  # driven to its end
        return [int(i) for i in step.ids], [float(v) for v in step.logits]

    return candidates_at
