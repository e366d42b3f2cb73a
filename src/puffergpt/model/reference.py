"""GPT-2's forward pass in plain numpy float32, in the style of picoGPT.

The forward pass is written once, here. It asks a ``Weights`` object for the
things that touch weights, and for nothing else: embeddings, layer-norm parameters,
every matrix product, attention scores and the next-token scores. ``NumpyWeights``
does them with numpy from a checkpoint in memory; the search engine
(``search/weights.py``) does them as vector searches. Layer norm, GELU, softmax,
attention mixing and the residual additions are the same code for both. What a
text's run needs besides (requests recorded, a turn among texts, its namespace of
keys) is its session, beside the weights (``session.py``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from puffergpt.model.checkpoints import Checkpoint, GPT2Config

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

class Weights(Protocol):
    """What the forward pass and the learning views need from the weights: their products, and
    nothing of how they are run (``session.Session``). Names are GPT-2's."""

    config: GPT2Config
    untrained: frozenset[int] | None  # token rows no training touched (``untrained.py``); None: unknown

    def embed(self, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """wte[ids] + wpe[pos]: (T,), (T,) -> (T, C)"""

    def norm(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Layer-norm gain and bias of ``h.{i}.ln_1``, ``h.{i}.ln_2`` or ``ln_f``: (C,), (C,)"""

    def linear(self, name: str, x: np.ndarray) -> np.ndarray:
        """x @ W + b for ``h.{i}.attn.c_attn`` etc.: (T, in) -> (T, out)"""

    def attention_scores(self, layer: int, q: np.ndarray, k: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Store the new keys k at positions pos (the text's own: a text's weights are opened for
        it), then score q against every key at or before each query's position:
        (H, T, hd), (H, T, hd), (T,) -> (H, T, S) where S = pos[-1] + 1, with -inf where a key
        comes after the query."""

    def top_k(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The k tokens whose wte rows score highest against x: (C,) -> ids (k,), logits (k,), best first"""

    def top_k_many(self, x: np.ndarray, k: int, kind: str = "lens.top_k") -> list[tuple[np.ndarray, np.ndarray]]:
        """top_k for several vectors in one request (the logit lens; ``kind`` names it in
        the request log): (n, C) -> n x (ids, logits)"""

    def logits(self, x: np.ndarray) -> np.ndarray:
        """Every token's score, the whole vocabulary: (C,) -> (V,). A search over all of wte."""

    def token_logits(self, x: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """The scores of the tokens ``ids`` only, one search restricted to their wte rows (the
        tokens a sampling control may raise, ``sampling.py``): (C,), (n,) -> (n,)"""

    def row(self, name: str, i: int) -> np.ndarray:
        """Row i of an embedding, ``wte`` (token i's vector) or ``wpe``, one fetch: -> (C,)"""

    def token_rows(self, ids: np.ndarray) -> np.ndarray:
        """Token vectors by id, for the embedding views: (n,) -> (n, C)"""

    def cosine_all(self, v: np.ndarray) -> np.ndarray:
        """Cosine similarity of v to every token vector: (C,) -> (V,)"""


class Trace:
    """What one forward pass shows of its last token, for the learning views, by GPT-2's
    names (as the request kinds are): ``h.{l}.resid`` the residual entering block l (C,),
    ``ln_f.resid`` entering ln_f (C,); ``h.{l}.attn.scores`` q.k / sqrt(hd) (H, S) and
    ``h.{l}.attn.weights`` their softmax (H, S); ``h.{l}.attn.heads`` each head's output
    before c_proj (H, hd); ``h.{l}.attn.c_proj`` and ``h.{l}.mlp.c_proj`` what attention and
    the MLP add to the residual (C,); ``h.{l}.mlp.gelu`` the MLP's neurons (4C,). Recorded from
    the products' own results (``record``), never recomputed."""

    KINDS = ("resid", "attn.scores", "attn.weights", "attn.heads", "attn.c_proj", "mlp.gelu", "mlp.c_proj")

    def __init__(self, values: dict[str, np.ndarray] | None = None, on: bool = True):
        self.values: dict[str, np.ndarray] = dict(values or {})
        self.on = on  # off: the forward pass records nothing (no learning view asked)

    def record(self, name: str, value: np.ndarray) -> None:
        if self.on:
            self.values[name] = np.array(value, np.float32)  # a copy: the pass goes on with its arrays

    def __getitem__(self, name: str) -> np.ndarray:
        return self.values[name]

    @property
    def n_layer(self) -> int:
        return sum(1 for n in self.values if n.startswith("h.") and n.endswith(".resid"))

    def layers(self, kind: str) -> list[np.ndarray]:
        """``kind`` of every layer, in order: ``layers("attn.weights")`` -> n_layer of (H, S)"""
        return [self.values[f"h.{l}.{kind}"] for l in range(self.n_layer)]

    @property
    def residual(self) -> list[np.ndarray]:
        """The residual entering each block, then entering ln_f: n_layer + 1 of (C,)"""
        return self.layers("resid") + [self.values["ln_f.resid"]]

    def only(self, *kinds: str) -> Trace:
        """A trace of these kinds alone (what a kept inspection needs, without the neurons)."""
        return Trace({n: v for n, v in self.values.items() if n == "ln_f.resid" or n.split(".", 2)[-1] in kinds})


NO_TRACE = Trace(on=False)


class Ablation:
    """Parts of the model switched off, by the Trace's names, for every position a forward pass
    reads: ``"attn L.H"`` zeroes head H's mixed values (its slice of ``h.{L}.attn.heads``, before
    c_proj), ``"mlp L"`` the MLP's neurons and its output, c_proj's bias included
    (``h.{L}.mlp.gelu``, ``h.{L}.mlp.c_proj``). The forward pass hands each of those values to
    ``apply`` as it makes it, and the residual entering each block and ln_f (``h.{l}.resid``,
    ``ln_f.resid``: (T, C)) too, which an activation patch replaces (``lens/patching.py``); the
    empty ablation (``NO_ABLATION``) hands every value back."""

    def __init__(self, heads: dict[int, tuple[int, ...]] | None = None, mlps: tuple[int, ...] = (),
                 means: dict[str, np.ndarray] | None = None):
        """``means``: mean ablation, each value switched off replaced by its mean over positions
        (``Averaging``: heads (H, hd), the MLP's (4C,) and (C,)); None: zero ablation."""
        self.heads = {l: tuple(sorted(set(hs))) for l, hs in (heads or {}).items() if hs}
        self.mlps = tuple(sorted(set(mlps)))
        self.means = means
        # name -> what of the value is zeroed: the heads' rows, or all of it (...)
        self._off: dict[str, object] = {f"h.{l}.attn.heads": list(hs) for l, hs in self.heads.items()}
        for l in self.mlps:
            self._off[f"h.{l}.mlp.gelu"] = self._off[f"h.{l}.mlp.c_proj"] = ...

    @classmethod
    def of(cls, parts, config: GPT2Config) -> Ablation:
        """Parts as a user writes them, checked against the model: ValueError naming the bad one."""
        heads: dict[int, list[int]] = {}
        mlps = []
        where = f"this model has layers 0..{config.n_layer - 1} and heads 0..{config.n_head - 1}"
        for part in parts:
            m = re.fullmatch(r" *(attn) +([0-9]{1,6})\.([0-9]{1,6}) *| *(mlp) +([0-9]{1,6}) *", str(part))
            if m is None:
                raise ValueError(f"{str(part)[:40]!r} is not a part: write 'attn L.H' (layer L's head H) or "
                                 f"'mlp L' (layer L's MLP); {where}")
            layer = int(m[2] or m[5])
            head = int(m[3]) if m[1] else None
            if layer >= config.n_layer or (head is not None and head >= config.n_head):
                raise ValueError(f"{str(part).strip()!r} is not in this model: {where}")
            if head is None:
                mlps.append(layer)
            else:
                heads.setdefault(layer, []).append(head)
        return cls({l: tuple(hs) for l, hs in heads.items()}, tuple(mlps))

    @property
    def parts(self) -> list[str]:
        """The parts off, as ``of`` reads them, layer by layer."""
        out = []
        for l in sorted(set(self.heads) | set(self.mlps)):
            out += [f"attn {l}.{h}" for h in self.heads.get(l, ())] + ([f"mlp {l}"] if l in self.mlps else [])
        return out

    @property
    def mode(self) -> str:
        return "zero" if self.means is None else "mean"

    def apply(self, name: str, value: np.ndarray) -> np.ndarray:
        """``value`` as the forward pass goes on with it: zeroed (or its mean put) where a part is
        off. Heads: (H, T, hd) with the heads' rows replaced; the MLP's values: all of them."""
        off = self._off.get(name)
        if off is None:
            return value
        value = np.array(value, np.float32)  # a copy: the caller's array stays as it was
        if self.means is None:
            value[off] = 0
        elif off is ...:  # the MLP's (T, 4C) or (T, C) <- (4C,) or (C,) at every position
            value[...] = self.means[name]
        else:  # the heads' rows of (H, T, hd) <- their (hd,) means at every position
            value[off] = self.means[name][off][:, None, :]
        return value


class Averaging(Ablation):
    """A pass with every part on that keeps, for an ablation's parts, the mean of each value
    over the positions it reads: ``ablation()`` is then that ablation as mean ablation (each
    part's output replaced by its mean, as TransformerLens' mean ablation does)."""

    def __init__(self, off: Ablation):
        super().__init__(off.heads, off.mlps)
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}

    def apply(self, name: str, value: np.ndarray) -> np.ndarray:
        if name in self._off:
            axis = 1 if name.endswith(".attn.heads") else 0  # heads (H, T, hd); the MLP's (T, n)
            self.sums[name] = self.sums.get(name, 0) + np.asarray(value, np.float64).sum(axis)
            self.counts[name] = self.counts.get(name, 0) + value.shape[axis]
        return value

    def ablation(self) -> Ablation:
        """The parts switched off, each to its mean over the positions this pass read."""
        means = {n: (s / self.counts[n]).astype(np.float32) for n, s in self.sums.items()}
        return Ablation(self.heads, self.mlps, means)


NO_ABLATION = Ablation()


@dataclass
class Cache:
    """The attention values of one text, per layer: (H, S, hd). Values stay in the
    server; keys live wherever ``Weights`` keeps them."""

    values: list[np.ndarray] = field(default_factory=list)

    def length(self) -> int:
        return self.values[0].shape[1] if self.values else 0


# --- the forward pass -------------------------------------------------------------------

def attention(p: Weights, layer: int, x: np.ndarray, pos: np.ndarray, cache: Cache, trace: Trace = NO_TRACE,
              ablation: Ablation = NO_ABLATION) -> np.ndarray:
    c = p.config
    T, H, hd = x.shape[0], c.n_head, c.head_dim
    qkv = p.linear(f"h.{layer}.attn.c_attn", x)  # (T, C) -> (T, 3C)
    q, k, v = (a.reshape(T, H, hd).transpose(1, 0, 2) for a in np.split(qkv, 3, axis=-1))  # 3 x (H, T, hd)
    start = int(pos[0])
    # New tokens take the place of anything cached at their positions (after a step back).
    cache.values[layer] = np.concatenate([cache.values[layer][:, :start], v], axis=1)  # (H, S, hd)
    scores = p.attention_scores(layer, q, k, pos)  # (H, T, S)
    w = softmax(scores / np.sqrt(hd))  # the causal mask is already in scores as -inf
    out = (w @ cache.values[layer]).astype(np.float32)  # (H, T, S) @ (H, S, hd) -> (H, T, hd)
    out = ablation.apply(f"h.{layer}.attn.heads", out)  # a head switched off mixes nothing
    y = p.linear(f"h.{layer}.attn.c_proj", out.transpose(1, 0, 2).reshape(T, H * hd))  # merge heads: (T, C)
    # What the last token shows: its rows of (H, T, S), (H, T, hd) and (T, C).
    trace.record(f"h.{layer}.attn.scores", scores[:, -1] / np.sqrt(hd))
    trace.record(f"h.{layer}.attn.weights", w[:, -1])
    trace.record(f"h.{layer}.attn.heads", out[:, -1])
    trace.record(f"h.{layer}.attn.c_proj", y[-1])
    return y


def mlp(p: Weights, layer: int, x: np.ndarray, trace: Trace = NO_TRACE, ablation: Ablation = NO_ABLATION
        ) -> np.ndarray:
    # Switched off, no neuron fires and nothing is written, c_proj's bias included.
    h = ablation.apply(f"h.{layer}.mlp.gelu", gelu(p.linear(f"h.{layer}.mlp.c_fc", x)))  # (T, C) -> (T, 4C)
    y = ablation.apply(f"h.{layer}.mlp.c_proj", p.linear(f"h.{layer}.mlp.c_proj", h))  # (T, 4C) -> (T, C)
    trace.record(f"h.{layer}.mlp.gelu", h[-1])
    trace.record(f"h.{layer}.mlp.c_proj", y[-1])
    return y


def forward(p: Weights, ids: np.ndarray, start: int, cache: Cache, trace: Trace | None = None,
            ablation: Ablation = NO_ABLATION) -> np.ndarray:
    """Read tokens ``ids`` at positions start.. (earlier positions are in ``cache``) and
    return the final hidden states after ``ln_f``: (T,) -> (T, C). A ``trace`` records
    what the last token went through; an ``ablation`` switches parts off (every position
    it reads: the cache must have been read with the same ablation)."""
    c = p.config
    trace = NO_TRACE if trace is None else trace
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
        x = ablation.apply(f"h.{i}.resid", x)  # the residual entering block i: (T, C) (a patch puts a clean run's)
        trace.record(f"h.{i}.resid", x[-1])  # entering block i
        x = x + attention(p, i, layer_norm(x, *p.norm(f"h.{i}.ln_1"), c.eps), pos, cache, trace, ablation)
        x = x + mlp(p, i, layer_norm(x, *p.norm(f"h.{i}.ln_2"), c.eps), trace, ablation)
    x = ablation.apply("ln_f.resid", x)  # after the last block, before ln_f
    trace.record("ln_f.resid", x[-1])
    return layer_norm(x, *p.norm("ln_f"), c.eps)


# --- numpy's weights ---------------------------------------------------------------------

class NumpyWeights:
    """The ordinary way: every product is numpy against weights held in memory, and the
    text's keys in memory too (one NumpyWeights a text)."""

    def __init__(self, ckpt: Checkpoint):
        self.config = ckpt.config
        self.params = ckpt.params
        self.untrained = None  # numpy can't say which rows were never trained: the views say so
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

    def token_logits(self, x, ids):
        return self.params["wte.weight"][np.asarray(ids, np.int64)] @ x  # (n, C) @ (C,) -> (n,)

    def row(self, name, i):
        if name not in ("wte", "wpe"):
            raise ValueError(f"row() reads an embedding (wte, wpe), not {name!r}")
        return self.params[f"{name}.weight"][i].copy()

    def token_rows(self, ids):
        return self.params["wte.weight"][np.asarray(ids, np.int64)].copy()

    def cosine_all(self, v):
        w = self.params["wte.weight"].astype(np.float64)
        v = np.asarray(v, np.float64)
        return (w @ v) / np.maximum(np.linalg.norm(w, axis=1) * np.linalg.norm(v), 1e-30)


class Reference:
    """The numpy GPT-2: ``logits(ids)`` for a whole prompt, or incremental decode."""

    def __init__(self, ckpt: Checkpoint):
        self.ckpt = ckpt
        self.weights = NumpyWeights(ckpt)
        self.cache = Cache()

    def logits(self, ids) -> np.ndarray:
        """Full logits for every position of a fresh prompt: (T,) -> (T, V)."""
        self.weights = NumpyWeights(self.ckpt)
        self.cache = Cache()
        return self.weights.logits(forward(self.weights, np.asarray(ids), 0, self.cache))

    def step(self, ids, start: int) -> np.ndarray:
        """Read ids at positions start.. with the KV cache; logits of the last one: (V,)."""
        h = forward(self.weights, np.asarray(ids), start, self.cache)
        return self.weights.logits(h[-1])

    def greedy(self, ids, n: int) -> list[int]:
        self.weights, self.cache = NumpyWeights(self.ckpt), Cache()
        ids = list(ids)
        logits, out = self.step(ids, 0), []
        for _ in range(n):
            t = int(np.argmax(logits))
            out.append(t)
            logits = self.step([t], len(ids) + len(out) - 1)
        return out
