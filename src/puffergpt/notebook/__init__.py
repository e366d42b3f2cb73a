"""The insight notebook: what clicked for the learner, in their words, with the evidence.

A notebook is a git repository on the user's disk. Each insight is one Markdown file,
``insights/<id>.md``, written and committed in one step:

    ---                         front matter (YAML): version, id, title, date, model, kind, tags
    ...
    ---
    the learner's words         (the body, as they wrote it)

    ## Evidence                 readable: prompt, token, candidates, sampling, requests

    ### Evidence data (format 3, or 4 with the sampling's controls)
    ```json                     machine-readable: the evidence dict, exactly as saved
    {...}
    ```

An insight from a conversation (an assistant over MCP, a custom GPT's action) has no
evidence: its file is format 2, the front matter and the learner's words only (``model``
and ``kind`` null), and ``replay`` says there is nothing to replay. A file with evidence is
format 3 (format 1 with the kinds attribution and ablation, and the data replay re-checks); a
format 1 file still reads, and an older puffergpt refuses format 3 naming the upgrade. Evidence
whose sampling sets a control (penalties, logit_bias, min_p) is format 4: format 3 with those
controls and ``generated``; evidence without one is still written as format 3.

The evidence is what the learner was looking at, so that the insight can be replayed
(``replay``): its scores, and the data of its kind, re-checked. Its keys (``check_evidence``):

    kind        "token" | "candidates" | "attention" | "lens" | "analogy" | "attribution" | "ablation"
    model       the model's name ("demo", "gpt2", a checkpoint path)
    prompt_ids  the text's token ids (at least ``position`` of them)
    position    p >= 1: the candidates are the model's scores for the token at p,
                having read prompt_ids[:p] (the playground's step at p)
    token_id    the token at p (prompt_ids[p] when the text goes on past p)
    sampling    {"temperature": >= 0, "top_k": >= 1, "seed": int or null}, and in format 4 the
                controls set, bounded as /v1's: "presence_penalty", "frequency_penalty" in
                [-2, 2], "repetition_penalty" > 0, "logit_bias" {"id": -100..100} (at most
                300), "min_p" in [0, 1]; the candidates are after them
    generated   format 4, needed with a presence or frequency penalty: the positions before p
                the model generated, increasing (the penalties count their tokens)
    candidates  [{"token_id", "logit"}, ...] best first, as the engine returned them
    requests    optional: the requests that produced them, [{"kind", "rows", "ms", ...}, ...]
    data        optional, kind-specific: attention {"layer", "head", "weights"},
                lens {"layer", "ids", "logits"}, analogy {"terms", "ids", "scores"},
                attribution {"token_id", "logit", "parts", "versus": {"token_id", "logit",
                "parts"}}, ablation {"parts": ["attn L.H" | "mlp L"], "mode": "zero" | "mean"
                (default zero), "after": [{"token_id", "logit"}]}; replay recomputes it
                (``evidence.py``) and names what differs

git runs as the ``git`` binary with argument lists (never a shell). A failed commit
leaves the file on disk and the next save commits it too; a failed push keeps the commit.

The package, one module a part, each importing only those above it:

    insight.py     the shared names: versions, bounds, errors, ``Insight``
    checks.py      what comes from outside, checked: title, body, tags, id, evidence
    controls.py    the sampling's controls evidence records (format 4), as replay applies them
    fileformat.py  an Insight as Markdown (``render``) and back (``parse``)
    files.py       the insight files read and written as untrusted, never through a link
    repository.py  the git-backed ``Notebook``: save, get, list, push
    evidence.py    the kind's data recomputed (``data_from_runs``) and compared
    replaying.py   ``replay``: the stored candidates (and the data) recomputed and compared

Callers import from ``puffergpt.notebook``; the names below are the package's surface.

May import: ``puffergpt.model``, ``puffergpt.texts``, ``puffergpt.lens`` and ``puffergpt.app``
(replay recomputes an insight's evidence with a model); never an edge.
"""

from __future__ import annotations

from puffergpt.notebook.checks import (
    check_body,
    check_evidence,
    check_id,
    check_tags,
    check_title,
    slug,
)
from puffergpt.notebook.evidence import WEIGHT_TOLERANCE, DataAt, data_from_runs
from puffergpt.notebook.fileformat import _shown, evidence_json, json_heading, parse, render, render_evidence
from puffergpt.notebook.insight import (
    CONTROL_KEYS,
    CONTROLS_FORMAT,
    DEFAULT_EMAIL,
    DEFAULT_NAME,
    EVIDENCE_FORMAT,
    EVIDENCE_KEYS,
    FORMAT_VERSION,
    FORMATS,
    GIT_TIMEOUT_S,
    ID_RE,
    INSIGHTS,
    KINDS,
    MAX_BODY_CHARS,
    MAX_CANDIDATES,
    MAX_EVIDENCE_BYTES,
    MAX_FILE_BYTES,
    MAX_MODEL_CHARS,
    MAX_QUERY_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_TITLE_CHARS,
    NO_EVIDENCE,
    NOTHING_TO_REPLAY,
    OPTIONAL_KEYS,
    PUSH_TIMEOUT_S,
    SLUG_CHARS,
    TAG_RE,
    TOLERANCE,
    UPGRADE,
    CandidatesAt,
    GitError,
    Insight,
    InsightNotFound,
    InvalidInsight,
    NotebookError,
    NotebookUnavailable,
)
from puffergpt.notebook.replaying import candidates_from_runs, replay
from puffergpt.notebook.repository import Notebook

__all__ = [
    "CONTROLS_FORMAT", "CONTROL_KEYS", "DEFAULT_EMAIL", "DEFAULT_NAME", "EVIDENCE_FORMAT", "EVIDENCE_KEYS", "FORMATS",
    "FORMAT_VERSION", "GIT_TIMEOUT_S", "ID_RE", "INSIGHTS", "KINDS", "MAX_BODY_CHARS", "MAX_CANDIDATES",
    "MAX_EVIDENCE_BYTES", "MAX_FILE_BYTES", "MAX_MODEL_CHARS", "MAX_QUERY_CHARS", "MAX_TAGS", "MAX_TAG_CHARS",
    "MAX_TITLE_CHARS", "NOTHING_TO_REPLAY", "NO_EVIDENCE", "OPTIONAL_KEYS", "PUSH_TIMEOUT_S", "SLUG_CHARS",
    "TAG_RE", "TOLERANCE", "UPGRADE", "WEIGHT_TOLERANCE", "CandidatesAt", "DataAt", "GitError", "Insight",
    "InsightNotFound", "InvalidInsight", "Notebook", "NotebookError", "NotebookUnavailable", "_shown",
    "candidates_from_runs", "check_body", "check_evidence", "check_id", "check_tags", "check_title", "data_from_runs",
    "evidence_json", "json_heading", "parse", "render", "render_evidence", "replay", "slug",
]
