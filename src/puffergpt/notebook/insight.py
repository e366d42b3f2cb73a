"""What every part of the notebook shares: the format's versions, the bounds on what a
user or a page sends, the errors (each one a user can act on), and ``Insight``."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from puffergpt.model.sampling import Sampling
from puffergpt.texts.text import KEEP_CANDIDATES

FORMAT_VERSION = 2  # an insight without evidence is written in format 2
# An insight with evidence is written in format 3: format 1 with the kinds "attribution" and
# "ablation" and the data replay re-checks. A format 1 file still reads (its data is re-checked
# too); a puffergpt older than format 3 refuses a format 3 file, naming the upgrade.
EVIDENCE_FORMAT = 3
# Evidence whose sampling sets a control (penalties, logit_bias, min_p) is written in format 4:
# format 3 with those in its sampling and the positions the model generated (``generated``). Evidence
# without one is still format 3, which a puffergpt older than format 4 reads.
CONTROLS_FORMAT = 4
FORMATS = (1, 2, 3, 4)  # the formats this puffergpt reads
UPGRADE = "pip install -U puffergpt"  # what reads a newer format
NO_EVIDENCE = "no evidence (saved from a conversation)"
NOTHING_TO_REPLAY = ("nothing to replay: this insight has no evidence (it was saved from a conversation, "
                     "not from the playground), so there are no scores to recompute")
INSIGHTS = "insights"  # the folder of insight files inside the notebook
KINDS = ("token", "candidates", "attention", "lens", "analogy", "attribution", "ablation")
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
OPTIONAL_KEYS = ("requests", "data", "generated")
# The sampling's controls an evidence may record (format 4), as /v1 takes them (``sampling.controls_json``)
CONTROL_KEYS = ("min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias")
GIT_TIMEOUT_S = 60
PUSH_TIMEOUT_S = 300
# Used only where the user's git has no identity configured.
DEFAULT_NAME, DEFAULT_EMAIL = "puffergpt notebook", "notebook@puffergpt.invalid"

CandidatesAt = Callable[[Sequence[int], int, int, Sampling, Sequence[int]], tuple[Sequence[int], Sequence[float]]]
"""candidates_at(prompt_ids, position, k, sampling, generated) -> (ids, logits): the model's top-k
for the token at ``position``, having read prompt_ids[:position], after the sampling's controls
(the penalties count the tokens at the positions ``generated``, those the model wrote), best first."""


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
    request: str | None = None  # the digest of the save's Idempotency-Key: a retry finds this insight

    def summary(self) -> dict:
        return {"id": self.id, "path": self.path, "title": self.title, "tags": self.tags, "date": self.date,
                "model": self.model, "kind": self.evidence["kind"] if self.evidence else None,
                "evidence": self.evidence is not None, "commit": self.commit}

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "request"}

