"""Replay: an insight's stored candidates recomputed with a model and compared, and with a
``data_at`` (``evidence.py``) the kind-specific data it holds too."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from puffergpt.notebook.checks import check_evidence
from puffergpt.notebook.evidence import DataAt, checkable, compare_data
from puffergpt.notebook.insight import NOTHING_TO_REPLAY, TOLERANCE, CandidatesAt, Insight, InvalidInsight

if TYPE_CHECKING:
    from puffergpt.model.session import Run


def replay(
    insight: Insight | dict, candidates_at: CandidatesAt, tolerance: float = TOLERANCE, model: str | None = None,
    data_at: DataAt | None = None,
) -> dict:
    """Recompute the stored candidates with ``candidates_at`` and compare them: the same
    ids in the same order, and each token's logit within ``tolerance`` of the stored one.
    With ``data_at``, the kind's data too (``evidence.compare_data``: a head's weights, a lens
    layer, an analogy, the attribution, a rerun with parts off), in ``"data"``; it must match
    as well. ``model``, when given, is the model candidates_at runs; another model is an error.
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
    data = compare_data(ev, data_at(ev), tolerance) if data_at is not None and checkable(ev) else None
    return {
        "replayable": True,
        "matches": same_ids and max_diff is not None and max_diff <= tolerance and (data is None or data["matches"]),
        "candidates_match": same_ids and max_diff is not None and max_diff <= tolerance,
        "data": data,
        "same_ids": same_ids,
        "max_abs_diff": max_diff,
        "tolerance": tolerance,
        "missing": missing,
        "first_differences": first,
        "now": now,
    }


def candidates_from_runs(open_run: Callable[[], Run]) -> CandidatesAt:
    """A candidates_at over any run (the engine's ``open``, or numpy's), through the
    application layer's one generation path, as the playground reads a text:
    prompt_ids[:position] in one prefill, then the top-k for the token at position."""
    from puffergpt.app.completion import complete
    from puffergpt.model.sampling import Sampling

    def candidates_at(prompt_ids: Sequence[int], position: int, k: int):
        (step,) = list(complete(open_run, list(prompt_ids[:position]), 1, Sampling(1.0, k)))  # driven to its end
        return [int(i) for i in step.ids], [float(v) for v in step.logits]

    return candidates_at
