"""What each part of the model adds to the next token, made of searches.

- Direct logit attribution: the residual entering ln_f is a sum of parts (the
  embedding, each attention head's write, each attention's c_proj bias, each MLP's
  output). With ln_f's scale s taken from that actual residual (the standard
  linearisation), ln_f(x) . wte[c] = sum over parts p of ((p - mean p) / s * g) . wte[c]
  + b . wte[c], so the parts' values sum to token c's logit. A head's write is c_proj
  applied to its output z with every other head's slice zeroed, minus c_proj's bias:
  a layer's heads are one search with H masked queries (and a zero query, whose answer
  is the bias). wte[c] is one fetch.
- The MLP as a memory (Geva et al. 2021, 2022): the most active neurons of a layer are
  the largest GELU outputs of the c_fc product the forward pass searched; what neuron n
  writes is row n of mlp.c_proj (c_proj of the one-hot e_n, minus the bias: one search a
  layer), and the tokens it promotes are one top-k search over wte with those rows as
  queries, for every layer at once.

Both run on any ``Products`` (numpy or searches): one code path.
"""

from __future__ import annotations

import numpy as np

from puffergpt.reference import Products, Trace

NEURONS = 5  # neurons shown a layer: each is a query of the promotes search over all of wte (60 for GPT-2 small)
PROMOTES = 8  # tokens shown a neuron


def without_bias(p: Products, name: str, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``name``'s product of each row of x, minus its bias, and the bias, from one request
    (a zero query's answer is the bias): (n, in) -> (n, out) float64, (out,) float64."""
    q = np.vstack([np.asarray(x, np.float32), np.zeros((1, x.shape[1]), np.float32)])  # (n + 1, in)
    y = np.asarray(p.linear(name, q), np.float64)  # (n + 1, out)
    return y[:-1] - y[-1], y[-1]


def head_writes(p: Products, layer: int, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What each head of a layer writes to the residual, and the layer's c_proj bias:
    z (H, hd) -> (H, C), (C,). One search with H masked queries."""
    H, hd = z.shape
    masked = np.zeros((H, H * hd), np.float32)  # head h's slice only, in the merged layout
    for h in range(H):
        masked[h, h * hd:(h + 1) * hd] = z[h]
    return without_bias(p, f"h.{layer}.attn.c_proj", masked)


def attribution(p: Products, trace: Trace, token_id: int) -> dict:
    """Direct logit attribution of ``token_id`` at the traced position: its logit and the
    parts that sum to it, embedding first, ln_f's bias last. Requests: one fetch (wte[c])
    and one search a layer (the heads' writes)."""
    c = p.config
    w = np.asarray(p.row("wte", token_id), np.float64)  # (C,)
    g, b = (np.asarray(a, np.float64) for a in p.norm("ln_f"))
    x = np.asarray(trace.residual[-1], np.float64)  # entering ln_f
    s = np.sqrt(x.var() + c.eps)

    def value(part) -> float:
        part = np.asarray(part, np.float64)
        return float(((part - part.mean()) / s * g) @ w)

    parts = [{"kind": "embed", "value": value(trace.residual[0])}]
    for layer in range(c.n_layer):
        writes, bias = head_writes(p, layer, trace[f"h.{layer}.attn.heads"])
        parts += [{"kind": "attn", "layer": layer, "head": h, "value": value(v)} for h, v in enumerate(writes)]
        parts.append({"kind": "attn_bias", "layer": layer, "value": value(bias)})
        parts.append({"kind": "mlp", "layer": layer, "value": value(trace[f"h.{layer}.mlp.c_proj"])})
    parts.append({"kind": "ln_f_bias", "value": float(b @ w)})
    logit = float(((x - x.mean()) / s * g + b) @ w)
    return {"token_id": int(token_id), "logit": logit, "parts": parts}


def top_neurons(trace: Trace, n: int = NEURONS) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each layer's n most active neurons: (ids (n,), activations (n,)), largest first.
    Arithmetic on the c_fc product the forward pass already searched: no request."""
    out = []
    for a in trace.layers("mlp.gelu"):
        top = np.argsort(-a, kind="stable")[:n]
        out.append((top.astype(np.int64), np.asarray(a[top], np.float64)))
    return out


def neurons(p: Products, tops: list[tuple[np.ndarray, np.ndarray]], k: int = PROMOTES) -> list[list[dict]]:
    """For each layer's top neurons: what each writes (row n of mlp.c_proj, one search a
    layer) and the k tokens that row promotes most (one top-k over wte for all layers)."""
    rows = []
    for layer, (ids, _) in enumerate(tops):
        onehot = np.zeros((len(ids), 4 * p.config.n_embd), np.float32)  # (n, 4C)
        onehot[np.arange(len(ids)), ids] = 1
        rows.append(without_bias(p, f"h.{layer}.mlp.c_proj", onehot)[0])  # (n, C)
    promoted = iter(p.top_k_many(np.vstack(rows).astype(np.float32), k, kind="wte.promotes"))
    out = []
    for ids, acts in tops:
        layer = []
        for n, a in zip(ids, acts, strict=True):
            t_ids, scores = next(promoted)
            layer.append({"neuron": int(n), "activation": float(a),
                          "promotes": [{"token_id": int(t), "score": float(v)}
                                       for t, v in zip(t_ids, scores, strict=True)]})
        out.append(layer)
    return out


def explain(p: Products, got: dict, token_id: int) -> dict:
    """Fill an inspection (``inside.inspection``) with the attribution of ``token_id`` and
    the neurons, unless it has them already; their requests go to ``p.log``."""
    a = got.get("attribution")
    if a is None or a["token_id"] != int(token_id):
        got["attribution"] = attribution(p, got["trace"], int(token_id))
    if got.get("neurons") is None:
        got["neurons"] = neurons(p, got["top_neurons"])
    return got
