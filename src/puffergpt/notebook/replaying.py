"""Replay: an insight's stored candidates recomputed with a model, after the sampling's controls it
recorded (``controls.py``), and compared; with a ``data_at`` (``evidence.py``) the kind-specific data
it holds too."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from puffergpt.model import sampling
from puffergpt.model.sampling import Sampling
from puffergpt.notebook import controls
from puffergpt.notebook.checks import check_evidence
from puffergpt.notebook.evidence import DataAt, checkable, compare_data
from puffergpt.notebook.insight import NOTHING_TO_REPLAY, TOLERANCE, CandidatesAt, Insight, InvalidInsight

if TYPE_CHECKING:
    from puffergpt.model.session import Run


def replay(
    insight: Insight | dict, candidates_at: CandidatesAt, tolerance: float = TOLERANCE, model: str | None = None,
    data_at: DataAt | None = None,
) -> dict:
    """Recompute the stored candidates with ``candidates_at``, after the controls the evidence recorded
    (its sampling's penalties, logit_bias; the positions it says the model generated), and compare them:
    the same ids in the same order, and each token's logit within ``tolerance`` of the stored one (each
    difference names the controls that move its token, ``moved``; ``controls`` says what replay applied).
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
    stored, s = ev["candidates"], controls.sampling_of(ev)
    ids, logits = candidates_at(ev["prompt_ids"], ev["position"], len(stored), s, ev.get("generated", []))
    now = [{"token_id": int(i), "logit": float(v)} for i, v in zip(ids, logits, strict=True)]
    by_id = {c["token_id"]: c["logit"] for c in now}
    diffs = [abs(c["logit"] - by_id[c["token_id"]]) for c in stored if c["token_id"] in by_id]
    first = []
    for rank, (was, is_) in enumerate(zip(stored, now, strict=False)):  # replay may find fewer
        d = abs(was["logit"] - by_id[was["token_id"]]) if was["token_id"] in by_id else None
        if was["token_id"] != is_["token_id"] or d is None or d > tolerance:
            # the controls that move the stored token: where they were doctored, its logit differs by their change
            first.append({"rank": rank, "stored": was, "now": is_, "diff": d,
                          "moved": controls.moved(ev, was["token_id"])})
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
        "controls": sampling.controls_json(s),  # what it replayed with ({} for none)
        "now": now,
    }


def candidates_from_runs(open_run: Callable[[], Run]) -> CandidatesAt:
    """A candidates_at over any run (the engine's ``open``, or numpy's), as a reopened text computes a
    step again (``texts/recompute.py``): prompt_ids[:position] in one prefill on a text of its own, then
    the top-k for the token at position after the sampling's controls (the penalties counting the tokens
    at the positions ``generated``), exact over the whole vocabulary as the step's were."""
    from puffergpt.texts.recompute import best_at
    from puffergpt.texts.text import opened

    def candidates_at(prompt_ids: Sequence[int], position: int, k: int, s: Sampling, generated: Sequence[int]):
        with opened(open_run, list(prompt_ids[:position])) as text:
            ids, logits, _ = best_at(text, position, k, s, generated)
        return [int(i) for i in ids], [float(v) for v in logits]

    return candidates_at
