"""Inside the transformer: what one step shows of its last token, from the searches
that made it.

- attention: the scores the attention search returned for the last token's query
  (q.k / sqrt(head_dim)) and their softmax weights, per layer and head (``Trace``);
- the logit lens: the residual stream entering each block, through ln_f, searched
  against the token vectors (top-k), in one request; the last entry is the final
  candidates. The layer where the model "made up its mind" (``decided_layer``) is the
  first from which every later entry's top-1 is the final top-1;
- what each part adds to the next token, and the MLP's neurons: ``attribution.py``,
  from what the inspection keeps of the trace.
"""

from __future__ import annotations

import numpy as np

from puffergpt.model.reference import Trace, Weights, layer_norm

MAX_VIEW_K = 100  # tokens a lens, analogy or neighbours view may ask for


def check_k(k, what: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_VIEW_K:
        raise ValueError(f"{what} must be an integer in 1..{MAX_VIEW_K}, got {k!r}")
    return k


def lens(weights: Weights, trace: Trace, k: int, final: tuple[np.ndarray, np.ndarray] | None = None) -> list[dict]:
    """n_layer + 1 entries: entry l the top-k of ln_f(residual entering block l); entry
    n_layer the final candidates (``final`` when the step has them: no second ln_f)."""
    c = weights.config
    g, b = weights.norm("ln_f")
    n = c.n_layer + (final is None)
    xs = np.stack([layer_norm(r, g, b, c.eps) for r in trace.residual[:n]])  # (n, C)
    tops = weights.top_k_many(xs, k)  # one request
    if final is not None:
        tops.append((np.asarray(final[0][:k]), np.asarray(final[1][:k], np.float64)))
    return [{"layer": l, "ids": np.asarray(ids), "logits": np.asarray(logits)} for l, (ids, logits) in enumerate(tops)]


def inspection(weights: Weights, trace: Trace, k: int, final=None) -> dict:
    """scores, weights: (L, H, S); lens: n_layer + 1 entries; residual: (L + 1, C); and what
    the attribution and the neurons need of the trace (each head's output, each MLP's, each
    MLP's neurons (L, 4C): small beside the attention)."""
    kept = trace.only("resid", "attn.heads", "attn.c_proj", "mlp.gelu", "mlp.c_proj")
    return {"scores": np.stack(trace.layers("attn.scores")), "weights": np.stack(trace.layers("attn.weights")),
            "lens": lens(weights, trace, k, final), "residual": np.stack(trace.residual), "k": k,
            "trace": kept}


def final_top1(lens_entries: list[dict]) -> int:
    """The model's own prediction: the top-1 of the last lens entry (not the sampled token)."""
    return int(lens_entries[-1]["ids"][0])


def decided_layer(lens_entries: list[dict]) -> int:
    """The layer where the model made up its mind: the smallest l such that the top-1 of
    every lens entry from l on is the final top-1. (A layer whose top-1 equals it, then
    changes, then comes back, does not count: only the last unbroken run does.)"""
    final = final_top1(lens_entries)
    i = len(lens_entries) - 1
    while i > 0 and len(lens_entries[i - 1]["ids"]) and int(lens_entries[i - 1]["ids"][0]) == final:
        i -= 1
    return int(lens_entries[i]["layer"])


def rank_of(entry: dict, token_id: int) -> int | None:
    hit = np.flatnonzero(np.asarray(entry["ids"]) == token_id)
    return int(hit[0]) if len(hit) else None
