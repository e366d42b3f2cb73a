"""Inside the transformer: what one step shows of its last token, from the searches
that made it.

- attention: the scores the attention search returned for the last token's query
  (q.k / sqrt(head_dim)) and their softmax weights, per layer and head (``Trace``);
- the logit lens: the residual stream entering each block, through ln_f, searched
  against the token vectors (top-k), in one request; the last entry is the final
  candidates. Where a layer's top-1 first equals the final top-1 is where the model
  "made up its mind".
"""

from __future__ import annotations

import numpy as np

from puffergpt.reference import Products, Trace, layer_norm

MAX_VIEW_K = 100  # tokens a lens, analogy or neighbours view may ask for


def check_k(k, what: str = "k") -> int:
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_VIEW_K:
        raise ValueError(f"{what} must be an integer in 1..{MAX_VIEW_K}, got {k!r}")
    return k


def lens(products: Products, trace: Trace, k: int, final: tuple[np.ndarray, np.ndarray] | None = None) -> list[dict]:
    """n_layer + 1 entries: entry l the top-k of ln_f(residual entering block l); entry
    n_layer the final candidates (``final`` when the step has them: no second ln_f)."""
    c = products.config
    g, b = products.norm("ln_f")
    n = c.n_layer + (final is None)
    xs = np.stack([layer_norm(r, g, b, c.eps) for r in trace.residual[:n]])  # (n, C)
    tops = products.top_k_many(xs, k)  # one request
    if final is not None:
        tops.append((np.asarray(final[0][:k]), np.asarray(final[1][:k], np.float64)))
    return [{"layer": l, "ids": np.asarray(ids), "logits": np.asarray(logits)} for l, (ids, logits) in enumerate(tops)]


def inspection(products: Products, trace: Trace, k: int, final=None) -> dict:
    """scores, weights: (L, H, S); lens: n_layer + 1 entries; residual: (L + 1, C)."""
    return {"scores": np.stack(trace.scores), "weights": np.stack(trace.weights),
            "lens": lens(products, trace, k, final), "residual": np.stack(trace.residual), "k": k}


def first_top1(lens_entries: list[dict], token_id: int) -> int | None:
    """The first layer whose top-1 is token_id (None if none is)."""
    return next((e["layer"] for e in lens_entries if len(e["ids"]) and int(e["ids"][0]) == token_id), None)


def rank_of(entry: dict, token_id: int) -> int | None:
    hit = np.flatnonzero(np.asarray(entry["ids"]) == token_id)
    return int(hit[0]) if len(hit) else None
