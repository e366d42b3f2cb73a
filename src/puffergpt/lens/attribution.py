"""What each part of the model adds to the next token, made of searches.

- Direct logit attribution: the residual entering ln_f is a sum of parts (the
  embedding, each attention head's write, each attention's c_proj bias, each MLP's
  output). With ln_f's scale s taken from that actual residual (the standard
  linearisation), ln_f(x) . wte[c] = sum over parts p of ((p - mean p) / s * g) . wte[c]
  + b . wte[c], so the parts' values sum to token c's logit. A head's write is c_proj
  applied to its output z with every other head's slice zeroed, minus c_proj's bias:
  a layer's heads are one search with H masked queries (and a zero query, whose answer
  is the bias). wte[c] is one fetch.
- Why c and not r (``versus``): the same parts read against wte[c] - wte[r]; they sum to
  logit(c) - logit(r). wte[r] comes in the same fetch as wte[c].
- The MLP as a memory (Geva et al. 2021, 2022): what neuron n writes is row n of
  mlp.c_proj (c_proj of the one-hot e_n, minus the bias): a layer's listed neurons in one
  search. Each layer's neurons ranked two ways: the most active (the largest GELU outputs
  of the c_fc product the forward pass searched), each with its push on c (activation x
  the row read through ln_f as a part is: over every neuron, the pushes and c_proj's bias
  sum to the MLP's part), and, when asked, those that push c most, which takes every
  neuron's row (4C one-hot queries a layer: the whole of c_proj). The tokens each promotes
  are one top-k search over wte with those rows as queries, for every layer at once.

All of it runs on any ``Weights`` (numpy or searches): one code path.
"""

from __future__ import annotations

import numpy as np

from puffergpt.model.reference import Trace, Weights, layer_norm

NEURONS = 5  # neurons shown a layer each way: each is a query of the promotes search over all of wte
PROMOTES = 8  # tokens shown a neuron


def label(part: dict) -> str:
    """A part as the page names it: embed, L2 H5, L2 attn bias, L2 MLP, ln_f bias."""
    kind = part["kind"]
    if kind == "attn":
        return f"L{part['layer']} H{part['head']}"
    if kind == "attn_bias":
        return f"L{part['layer']} attn bias"
    if kind == "mlp":
        return f"L{part['layer']} MLP"
    return {"embed": "embed", "ln_f_bias": "ln_f bias"}.get(kind, str(kind))


def without_bias(p: Weights, name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``name``'s product of each row of x, minus its bias, and the bias, from one request
    (a zero query's answer is the bias): (n, in) -> (n, out) float64, (out,) float64."""
    q = np.vstack([np.asarray(x, np.float32), np.zeros((1, x.shape[1]), np.float32)])  # (n + 1, in)
    y = np.asarray(p.linear(name, q), np.float64)  # (n + 1, out)
    return y[:-1] - y[-1], y[-1]


def head_writes(p: Weights, layer: int, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What each head of a layer writes to the residual, and the layer's c_proj bias:
    z (H, hd) -> (H, C), (C,). One search with H masked queries."""
    H, hd = z.shape
    masked = np.zeros((H, H * hd), np.float32)  # head h's slice only, in the merged layout
    for h in range(H):
        masked[h, h * hd:(h + 1) * hd] = z[h]
    return without_bias(p, f"h.{layer}.attn.c_proj", masked)


class Reading:
    """Vectors written into the residual read as shares of token logits, through ln_f with the
    scale of the actual residual entering it (x, from the trace): what attribution and the
    neurons' pushes share."""

    def __init__(self, p: Weights, trace: Trace):
        c = p.config
        self.g, self.b = (np.asarray(a, np.float64) for a in p.norm("ln_f"))
        self.x = np.asarray(trace.residual[-1], np.float64)  # (C,) entering ln_f
        self.s = np.sqrt(self.x.var() + c.eps)

    def values(self, parts: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Each part's share of the logit of the token whose wte row is w: (n, C), (C,) -> (n,)"""
        parts = np.asarray(parts, np.float64)
        return ((parts - parts.mean(axis=-1, keepdims=True)) / self.s * self.g) @ w

    def logit(self, w: np.ndarray) -> float:
        return float(((self.x - self.x.mean()) / self.s * self.g + self.b) @ w)


def attribution(p: Weights, trace: Trace, token_id: int, versus: int | None = None) -> dict:
    """Direct logit attribution of ``token_id`` at the traced position: its logit and the
    parts that sum to it, embedding first, ln_f's bias last; with ``versus`` (a token id), the
    same parts of logit(token) - logit(versus). Requests: one fetch (wte[c], and wte[r]) and
    one search a layer (the heads' writes)."""
    ids = [int(token_id)] + ([int(versus)] if versus is not None else [])
    return attribution_of(p, trace, ids, np.asarray(p.token_rows(np.asarray(ids)), np.float64))


def attribution_of(p: Weights, trace: Trace, ids: list[int], rows: np.ndarray) -> dict:
    """``attribution`` with the tokens' wte rows given: ids [c] or [c, r], rows (1 or 2, C)."""
    read = Reading(p, trace)
    names, vectors = [{"kind": "embed"}], [trace.residual[0]]
    for layer in range(p.config.n_layer):
        writes, bias = head_writes(p, layer, trace[f"h.{layer}.attn.heads"])
        names += [{"kind": "attn", "layer": layer, "head": h} for h in range(len(writes))]
        names += [{"kind": "attn_bias", "layer": layer}, {"kind": "mlp", "layer": layer}]
        vectors += [*writes, bias, trace[f"h.{layer}.mlp.c_proj"]]
    vectors = np.vstack(vectors)  # (parts, C)

    def split(w: np.ndarray) -> list[dict]:
        values = read.values(vectors, w)
        return ([{**n, "value": float(v)} for n, v in zip(names, values, strict=True)]
                + [{"kind": "ln_f_bias", "value": float(read.b @ w)}])

    out = {"token_id": int(ids[0]), "logit": read.logit(rows[0]), "parts": split(rows[0])}
    if len(ids) > 1:  # the parts of the difference: each the chosen's minus the other's
        out["versus"] = {"token_id": int(ids[1]), "logit": read.logit(rows[1]), "parts": split(rows[0] - rows[1])}
    return out


def neuron_rows(p: Weights, layer: int, ids: np.ndarray | None = None) -> np.ndarray:
    """What neurons ``ids`` of a layer (default: every one) write: row n of mlp.c_proj, c_proj of
    the one-hot e_n minus its bias. One search, a one-hot query a neuron (and the zero one):
    -> (n, C) float64"""
    eye = np.eye(4 * p.config.n_embd, dtype=np.float32)  # (4C, 4C)
    return without_bias(p, f"h.{layer}.mlp.c_proj", eye if ids is None else eye[ids])[0]


def neurons(p: Weights, trace: Trace, w: np.ndarray, pushing: bool = False, n: int = NEURONS,
            k: int = PROMOTES) -> tuple[list[list[dict]], list[list[dict]] | None]:
    """Each layer's n most active neurons, for the token c whose wte row is w, with each one's
    push (activation x its row read as a part of c's logit) and the k tokens its row promotes
    most; with ``pushing``, also the n that push c most, which takes every neuron's row. Requests:
    one search a layer (the listed neurons' rows, or every neuron's), one top-k over wte for
    every neuron listed. -> (most active, most pushing or None), per layer"""
    read = Reading(p, trace)
    picked, rows = [], []
    for layer, a in enumerate(trace.layers("mlp.gelu")):
        acts = np.asarray(a, np.float64)  # (4C,)
        active = np.argsort(-acts, kind="stable")[:n]
        if pushing:
            written = neuron_rows(p, layer)  # (4C, C)
            push = acts * read.values(written, w)  # (4C,)
            ways = [active, np.argsort(-push, kind="stable")[:n]]
            picked.append([[(int(i), acts[i], push[i]) for i in way] for way in ways])
            rows += [written[way] for way in ways]
        else:
            written = neuron_rows(p, layer, active)  # (n, C)
            push = acts[active] * read.values(written, w)  # (n,)
            picked.append([[(int(i), acts[i], ps) for i, ps in zip(active, push, strict=True)]])
            rows.append(written)
    promoted = iter(p.top_k_many(np.vstack(rows).astype(np.float32), k, kind="wte.promotes"))
    out: tuple[list, list] = ([], [])
    for layer in picked:
        for way, chosen in enumerate(layer):
            out[way].append([{"neuron": i, "activation": float(act), "push": float(ps),
                              "promotes": [{"token_id": int(t), "score": float(v)} for t, v in zip(*next(promoted),
                                                                                                   strict=True)]}
                             for i, act, ps in chosen])
    return out[0], (out[1] if pushing else None)


def runner_up(p: Weights, got: dict, token_id: int) -> int:
    """The candidate with the highest logit other than ``token_id``: from the inspection's final
    candidates, or (a lens of one token) a top-2 search of its own."""
    final = [int(i) for i in got["lens"][-1]["ids"] if int(i) != int(token_id)]
    if final:
        return final[0]
    c = p.config
    h = layer_norm(np.asarray(got["trace"].residual[-1], np.float32), *p.norm("ln_f"), c.eps)
    ids, _ = p.top_k(h, 2)
    return next(int(i) for i in ids if int(i) != int(token_id))


def explain(p: Weights, got: dict, token_id: int, versus: int | None = None, pushing: bool = False) -> dict:
    """Fill an inspection (``inside.inspection``) with the attribution of ``token_id`` against
    ``versus`` (default: the runner-up) and the most active neurons, and with ``pushing`` those
    pushing the token most, unless it has them already. The requests go to whatever
    ``p.recording`` block is open."""
    ids = [int(token_id), runner_up(p, got, token_id) if versus is None else int(versus)]
    a = got.get("attribution")
    again = a is None or [a["token_id"], a["versus"]["token_id"]] != ids
    neurons_again = got.get("neurons_for") != ids[0] or (pushing and got.get("pushing") is None)
    if not again and not neurons_again:
        return got
    rows = np.asarray(p.token_rows(np.asarray(ids)), np.float64)  # (2, C): one fetch
    if again:
        got["attribution"] = attribution_of(p, got["trace"], ids, rows)
    if neurons_again:
        got["neurons"], got["pushing"] = neurons(p, got["trace"], rows[0], pushing)
        got["neurons_for"] = ids[0]
    return got
