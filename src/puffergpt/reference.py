"""GPT-2's forward pass in plain numpy float32, in the style of picoGPT.

The forward pass is written once, here. It asks a ``Products`` object for the
things that touch weights: embeddings, layer-norm parameters, every matrix
product, attention scores and the next-token scores. ``NumpyProducts`` does them
with numpy from a checkpoint in memory; the search engine (``engine.py``) does
them as vector searches. Layer norm, GELU, softmax, attention mixing and the
residual additions are the same code for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from puffergpt.checkpoints import Checkpoint, GPT2Config

# --- the arithmetic the server does itself ---------------------------------------------

def layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (g * (x - mean) / np.sqrt(var + eps) + b).astype(np.float32)


def gelu(x: np.ndarray) -> np.ndarray:
    # GPT-2's tanh approximation ("gelu_new")
    return (0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))).astype(np.float32)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# --- the seam ---------------------------------------------------------------------------

class Products(Protocol):
    """What the forward pass needs from the weights. Names are GPT-2's.

    ``log`` lists the requests made so far (empty for numpy, which makes none), and
    ``close()`` lets go of what the products hold (a text's namespace of keys)."""

    config: GPT2Config
    log: list

    def embed(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """wte[ids] + wpe[pos]: (T,), (T,) -> (T, C)"""

    def norm(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Layer-norm gain and bias of ``h.{i}.ln_1``, ``h.{i}.ln_2`` or ``ln_f``: (C,), (C,)"""

    def linear(self, name: str, x: np.ndarray) -> np.ndarray:
        """x @ W + b for ``h.{i}.attn.c_attn`` etc.: (T, in) -> (T, out)"""

    def attention_scores(self, layer: int, q: np.ndarray, k: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Store the new keys k at positions pos, then score q against every key at or
        before each query's position: (H, T, hd), (H, T, hd), (T,) -> (H, T, S) where
        S = pos[-1] + 1, with -inf where a key comes after the query."""

    def top_k(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k tokens whose wte rows score highest against x: (C,) -> ids (k,), logits (k,), best first"""

    def top_k_many(self, x: np.ndarray, k: int, kind: str = "lens.top_k") -> list[tuple[np.ndarray, np.ndarray]]:
        """top_k for several vectors in one request (the logit lens; ``kind`` names it in
        the request log): (n, C) -> n x (ids, logits)"""

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Every token's score, the whole vocabulary: (C,) -> (V,). A search over all of wte."""

    def row(self, name: str, i: int) -> np.ndarray:
        """Row i of an embedding, ``wte`` (token i's vector) or ``wpe``, one fetch: -> (C,)"""

    def close(self) -> None: ...


@dataclass
class Trace:
    """What one forward pass shows of its last token, for the learning views: the residual
    stream entering each block and after the last (before ln_f), each layer's attention
    of the last token's query over positions 0..p: scores (q.k / sqrt(hd)) and softmax
    weights, each head's output before c_proj, what attention and the MLP added to the
    residual, and the MLP's neuron activations (GELU of c_fc). Recorded from the
    products' own results, never recomputed."""

    residual: list[np.ndarray] = field(default_factory=list)  # n_layer + 1 of (C,)
    scores: list[np.ndarray] = field(default_factory=list)  # n_layer of (H, S)
    weights: list[np.ndarray] = field(default_factory=list)  # n_layer of (H, S)
    heads: list[np.ndarray] = field(default_factory=list)  # n_layer of (H, hd): weights @ values
    attn: list[np.ndarray] = field(default_factory=list)  # n_layer of (C,): attention's c_proj output
    acts: list[np.ndarray] = field(default_factory=list)  # n_layer of (4C,): gelu(c_fc)
    mlp: list[np.ndarray] = field(default_factory=list)  # n_layer of (C,): the MLP's c_proj output


@dataclass
class Cache:
    """The attention values of one text, per layer: (H, S, hd). Values stay in the
    server; keys live wherever ``Products`` keeps them."""

    values: list[np.ndarray] = field(default_factory=list)

    def length(self) -> int:
        return self.values[0].shape[1] if self.values else 0


# --- the forward pass -------------------------------------------------------------------

def attention(
    p: Products, layer: int, x: np.ndarray, pos: np.ndarray, cache: Cache, trace: Trace | None = None
) -> np.ndarray:
    c = p.config
    T, H, hd = x.shape[0], c.n_head, c.head_dim
    qkv = p.linear(f"h.{layer}.attn.c_attn", x)  # (T, C) -> (T, 3C)
    q, k, v = (a.reshape(T, H, hd).transpose(1, 0, 2) for a in np.split(qkv, 3, axis=-1))  # 3 x (H, T, hd)
    start = int(pos[0])
    # New tokens take the place of anything cached at their positions (after a step back).
    cache.values[layer] = np.concatenate([cache.values[layer][:, :start], v], axis=1)  # (H, S, hd)
    scores = p.attention_scores(layer, q, k, pos)  # (H, T, S)
    w = softmax(scores / np.sqrt(hd))  # the causal mask is already in scores as -inf
    if trace is not None:  # the last token's row: (H, T, S) -> (H, S)
        trace.scores.append((scores[:, -1] / np.sqrt(hd)).astype(np.float32))
        trace.weights.append(w[:, -1].astype(np.float32))
    out = (w @ cache.values[layer]).astype(np.float32)  # (H, T, S) @ (H, S, hd) -> (H, T, hd)
    if trace is not None:
        trace.heads.append(out[:, -1].copy())  # (H, hd)
    out = out.transpose(1, 0, 2).reshape(T, H * hd)  # merge heads -> (T, C)
    y = p.linear(f"h.{layer}.attn.c_proj", out)  # (T, C) -> (T, C)
    if trace is not None:
        trace.attn.append(y[-1].copy())
    return y


def mlp(p: Products, layer: int, x: np.ndarray, trace: Trace | None = None) -> np.ndarray:
    h = gelu(p.linear(f"h.{layer}.mlp.c_fc", x))  # (T, C) -> (T, 4C)
    y = p.linear(f"h.{layer}.mlp.c_proj", h)  # (T, 4C) -> (T, C)
    if trace is not None:
        trace.acts.append(h[-1].copy())
        trace.mlp.append(y[-1].copy())
    return y


def forward(p: Products, ids: np.ndarray, start: int, cache: Cache, trace: Trace | None = None) -> np.ndarray:
    """Read tokens ``ids`` at positions start.. (earlier positions are in ``cache``) and
    return the final hidden states after ``ln_f``: (T,) -> (T, C). A ``trace`` records
    what the last token went through."""
    c = p.config
    ids = np.asarray(ids, dtype=np.int64)
    pos = np.arange(start, start + len(ids))
    if len(ids) == 0:
        raise ValueError("forward needs at least one token")
    if pos[-1] >= c.n_ctx:
        raise ValueError(f"position {pos[-1]} is past the model's context of {c.n_ctx} tokens")
    if start > cache.length():
        raise ValueError(f"start {start} leaves a gap after the {cache.length()} cached positions")
    if not cache.values:
        cache.values = [np.zeros((c.n_head, 0, c.head_dim), np.float32) for _ in range(c.n_layer)]
    x = p.embed(ids, pos)  # (T, C)
    for i in range(c.n_layer):
        if trace is not None:
            trace.residual.append(x[-1].copy())  # entering block i
        x = x + attention(p, i, layer_norm(x, *p.norm(f"h.{i}.ln_1"), c.eps), pos, cache, trace)
        x = x + mlp(p, i, layer_norm(x, *p.norm(f"h.{i}.ln_2"), c.eps), trace)
    if trace is not None:
        trace.residual.append(x[-1].copy())  # after the last block, before ln_f
    return layer_norm(x, *p.norm("ln_f"), c.eps)


# --- numpy products ---------------------------------------------------------------------

class NumpyProducts:
    """The ordinary way: every product is numpy against weights held in memory."""

    def __init__(self, ckpt: Checkpoint):
        self.config = ckpt.config
        self.params = ckpt.params
        self.log: list = []  # numpy makes no requests
        self.keys: list[np.ndarray] = [
            np.zeros((self.config.n_head, 0, self.config.head_dim), np.float32)
        ] * self.config.n_layer

    def embed(self, ids, pos):
        return self.params["wte.weight"][ids] + self.params["wpe.weight"][pos]

    def norm(self, name):
        return self.params[f"{name}.weight"], self.params[f"{name}.bias"]

    def linear(self, name, x):
        return x @ self.params[f"{name}.weight"] + self.params[f"{name}.bias"]

    def attention_scores(self, layer, q, k, pos):
        start = int(pos[0])
        self.keys[layer] = K = np.concatenate([self.keys[layer][:, :start], k], axis=1)  # (H, S, hd)
        scores = q @ K.transpose(0, 2, 1)  # (H, T, hd) @ (H, hd, S) -> (H, T, S)
        return np.where(np.arange(K.shape[1])[None, :] <= pos[:, None], scores, -np.inf)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return x @ self.params["wte.weight"].T  # (T, C) -> (T, V)

    def top_k(self, x, k):
        logits = self.logits(x)
        ids = np.argsort(-logits, kind="stable")[:k]
        return ids, logits[ids]

    def top_k_many(self, x, k, kind: str = "lens.top_k"):
        return [self.top_k(v, k) for v in x]

    def row(self, name, i):
        if name not in ("wte", "wpe"):
            raise ValueError(f"row() reads an embedding (wte, wpe), not {name!r}")
        return self.params[f"{name}.weight"][i].copy()

    def close(self) -> None:
        pass


class Reference:
    """The numpy GPT-2: ``logits(ids)`` for a whole prompt, or incremental decode."""

    def __init__(self, ckpt: Checkpoint):
        self.ckpt = ckpt
        self.products = NumpyProducts(ckpt)
        self.cache = Cache()

    def logits(self, ids) -> np.ndarray:
        """Full logits for every position of a fresh prompt: (T,) -> (T, V)."""
        self.products = NumpyProducts(self.ckpt)
        self.cache = Cache()
        return self.products.logits(forward(self.products, np.asarray(ids), 0, self.cache))

    def step(self, ids, start: int) -> np.ndarray:
        """Read ids at positions start.. with the KV cache; logits of the last one: (V,)."""
        h = forward(self.products, np.asarray(ids), start, self.cache)
        return self.products.logits(h[-1])

    def greedy(self, ids, n: int) -> list[int]:
        self.products, self.cache = NumpyProducts(self.ckpt), Cache()
        ids = list(ids)
        logits, out = self.step(ids, 0), []
        for _ in range(n):
            t = int(np.argmax(logits))
            out.append(t)
            logits = self.step([t], len(ids) + len(out) - 1)
        return out
