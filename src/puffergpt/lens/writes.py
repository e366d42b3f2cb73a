"""What one attention head writes, position by position: the value matrix read as tokens.

Head h of layer L at the query's position mixes the value vectors of every position j at or before it with its
attention weights a_j, and c_proj's 64 rows of that head (W_O^h) turn the mix into what it adds to the residual.
The mix is a sum, so the head's write is a sum of pieces, one a source position:

    x_j = a_j * v_j @ W_O^h        (hd,) @ (hd, C) -> (C,)

Each piece is read as the attribution reads a part (``attribution.Reading``): through ln_f with the scale s of
the actual residual entering it, e_j = ((x_j - mean x_j) / s * g) . wte[c]. The e_j sum to the head's part in the
attribution of c. Each piece's top tokens rank every token t by the same expression with wte[t]: a top-k search
over the token vectors with (x_j - mean x_j) / s * g as the query.

Requests: one search of c_proj with a masked query a source (that head's slice, every other zero) and the zero
query (whose answer, the bias, is taken off: a piece has no bias), one top-k search over wte with a query a
source, and (when the token's row is not given) one fetch of wte[c].
"""

from __future__ import annotations

import re

import numpy as np

from puffergpt.lens.attribution import Reading, without_bias
from puffergpt.model.reference import Trace, Weights

TOP = 5  # tokens shown a piece


def head_of(spec: str, n_layer: int, n_head: int) -> tuple[int, int]:
    """'L.H' as a user writes it, checked against the model: ValueError naming its layers and heads."""
    where = f"this model has layers 0..{n_layer - 1} and heads 0..{n_head - 1}"
    m = re.fullmatch(r" *([0-9]{1,6})\.([0-9]{1,6}) *", str(spec))
    if m is None:
        raise ValueError(f"{str(spec)[:40]!r} is not a head: write L.H (layer L's head H, e.g. 2.2); {where}")
    layer, head = int(m[1]), int(m[2])
    if layer >= n_layer or head >= n_head:
        raise ValueError(f"head {layer}.{head} is not in this model: {where}")
    return layer, head


def pieces(p: Weights, layer: int, head: int, weights: np.ndarray, values: np.ndarray) -> np.ndarray:
    """x_j = a_j v_j W_O^h for every source j, from one search of c_proj with a masked query a source:
    weights (S,), values (S, hd) -> (S, C) float64"""
    c = p.config
    hd = c.head_dim
    masked = np.zeros((len(weights), c.n_embd), np.float32)  # the merged heads' layout, head h's slice only
    masked[:, head * hd:(head + 1) * hd] = np.asarray(weights, np.float32)[:, None] * values  # (S, hd)
    return without_bias(p, f"h.{layer}.attn.c_proj", masked)[0]


def writes(p: Weights, trace: Trace, weights: np.ndarray, values: np.ndarray, layer: int, head: int,
           token_id: int, k: int = TOP) -> dict:
    """What head ``head`` of ``layer`` writes at the traced position, a piece a source position, read against
    token ``token_id`` (one fetch of its wte row). ``weights`` (S,) and ``values`` (S, hd): that head's attention
    weights from the traced query and its value vectors at the S positions it sees. -> {"token_id", "layer",
    "head", "sources": [{"position", "weight", "effect", "top": [[token_id, score], ...]}], "total"}"""
    weights, values = np.asarray(weights, np.float64), np.asarray(values, np.float32)
    if values.shape != (len(weights), p.config.head_dim):
        raise ValueError(f"values {values.shape} do not match the {len(weights)} positions the query sees")
    x = pieces(p, layer, head, weights, values)  # (S, C)
    read = Reading(p, trace)
    w = np.asarray(p.token_rows(np.asarray([token_id]))[0], np.float64)  # (C,): one fetch
    effects = read.values(x, w)  # (S,)
    queries = (x - x.mean(axis=-1, keepdims=True)) / read.s * read.g  # (S, C): e_j = queries[j] . wte[c]
    tops = p.top_k_many(queries.astype(np.float32), k, kind="wte.writes")
    sources = [{"position": j, "weight": float(weights[j]), "effect": float(effects[j]),
                "top": [[int(t), float(v)] for t, v in zip(ids, scores, strict=True)]}
               for j, (ids, scores) in enumerate(tops)]
    return {"token_id": int(token_id), "layer": layer, "head": head, "sources": sources,
            "total": float(effects.sum())}
