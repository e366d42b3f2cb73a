"""Context changes meaning: one word in two or three prompts, compared layer by layer.

Entering block 0, a word's vector is its token's row of ``wte`` plus its position's row of
``wpe``: the same word in two prompts differs only by where it stands. Each block then adds
what attention brought from the words before it and what the MLP made of that. This view
reads each prompt up to the word's first occurrence (GPT-2 reads left to right: the tokens
after the word can't change its vector) in a forward pass of its own, with a ``Trace`` of the
word's position, and gives for each layer l = 0..n_layer (l < n_layer: the residual entering
block l; l = n_layer: the residual entering ln_f):

- ``cosine``: the cosine between the contexts' residual vectors at the word, (n, n);
- ``lens``: each context's logit lens there (``inside.lens``), its top-1 (``top``: top-k);

and each context's ``attention`` from the word's position, per layer and head (L, H, p + 1).

Made of searches: per prompt, one prefill of its tokens up to the word (a fetch and five
searches a layer) and one lens search, on products of its own, closed after; the requests are
counted and marked extra. ``puffergpt contexts`` and the page's route both call ``contexts``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from puffergpt.lens import inside, inspector, views
from puffergpt.model import tokenizer
from puffergpt.model.checkpoints import GPT2Config
from puffergpt.model.reference import Cache, Products, Trace, forward
from puffergpt.model.tokenizer import token_dict
from puffergpt.texts.text import TextError

MIN_PROMPTS, MAX_PROMPTS = 2, 3
SHOWN_TOKENS = 24  # tokens of a prompt an error lists


@dataclass(frozen=True)
class Asked:
    """What was asked, checked: the word's token, each prompt's tokens and the word's first
    position in each."""

    word_id: int
    ids: list[list[int]]
    positions: list[int]


def check(word: str, prompts, max_chars: int | None = None) -> Asked:
    """The one check of a contexts request, before anything is opened: a word of one token
    (``views.one_token``), 2 or 3 prompts, each holding it, and of at most ``max_chars``
    characters (an edge's bound: ``protocol.MAX_CONTEXT_CHARS``; None: none). A clear error
    names what is wrong."""
    word_id = views.one_token(word)
    if not isinstance(prompts, (list, tuple)) or not MIN_PROMPTS <= len(prompts) <= MAX_PROMPTS:
        n = len(prompts) if isinstance(prompts, (list, tuple)) else prompts
        raise TextError(f"give {MIN_PROMPTS} or {MAX_PROMPTS} prompts that each contain {word!r}, got {n!r}")
    ids, positions = [], []
    for i, prompt in enumerate(prompts, 1):
        if not isinstance(prompt, str) or not prompt.strip():
            raise TextError(f"prompt {i} is empty: give a sentence that contains {word!r}")
        if max_chars is not None and len(prompt) > max_chars:
            raise TextError(f"prompt {i} has {len(prompt)} characters, over {max_chars}: "
                            "a context is a sentence or two")
        got = tokenizer.encode(prompt)
        if word_id not in got:
            raise TextError(_missing(word, i, prompt, got))
        ids.append(got)
        positions.append(got.index(word_id))  # its first occurrence
    return Asked(word_id, ids, positions)


def _missing(word: str, i: int, prompt: str, ids: list[int]) -> str:
    shown = " + ".join(repr(tokenizer.token_text(t)) for t in ids[:SHOWN_TOKENS])
    more = f" + {len(ids) - SHOWN_TOKENS} more" if len(ids) > SHOWN_TOKENS else ""
    quoted = repr(prompt if len(prompt) <= 80 else prompt[:77] + "...")
    return (f"prompt {i} ({quoted}) does not contain the token {word!r}: its tokens are {shown}{more}. "
            "A word inside a sentence carries its leading space (' mole'); at the very start of a "
            "prompt it has none, and there it is often other tokens")


def contexts(open_products: Callable[[], Products], config: GPT2Config, word: str, prompts, k: int = 5) -> dict:
    """The word in each prompt, layer by layer (see the module's docstring): {"word_id",
    "positions", "layers": [{"layer", "cosine", "lens", "top"}], "word", "contexts",
    "attention", "k", "requests"}; ``requests`` are the store's requests, in order."""
    k = inspector.check_k(k)
    asked = check(word, prompts)
    for i, p in enumerate(asked.positions, 1):
        if p >= config.n_ctx:
            raise TextError(f"in prompt {i}, {word!r} is at position {p}, past the model's context of "
                            f"{config.n_ctx} tokens")
    reads = [_read(open_products, ids[: p + 1], k) for ids, p in zip(asked.ids, asked.positions, strict=True)]
    residual = np.stack([trace.residual for trace, _, _ in reads])  # (n, L + 1, C)
    layers = [{"layer": l, "cosine": cosines(residual[:, l]).tolist(),
               "lens": [int(lens[l]["ids"][0]) for _, lens, _ in reads],
               "top": [[{**token_dict(int(t)), "logit": float(v)} for t, v in zip(lens[l]["ids"], lens[l]["logits"],
                                                                                   strict=True)]
                       for _, lens, _ in reads]}
              for l in range(config.n_layer + 1)]
    return {"word_id": asked.word_id, "positions": asked.positions, "layers": layers,
            "word": token_dict(asked.word_id), "k": k,
            "contexts": [{"prompt": prompt, "position": p, "tokens": [token_dict(t) for t in ids]}
                         for prompt, ids, p in zip(prompts, asked.ids, asked.positions, strict=True)],
            "attention": [np.round(np.stack(trace.layers("attn.weights")), 6).tolist() for trace, _, _ in reads],
            "requests": [r for _, _, requests in reads for r in requests]}


def _read(open_products: Callable[[], Products], ids: list[int], k: int) -> tuple[Trace, list[dict], list]:
    """A prompt's tokens up to the word, read in products of their own (closed after), in a
    turn among the texts generating: the word's trace, its lens (n_layer + 1 entries of
    top-k) and the requests both cost, marked extra."""
    products = open_products()
    try:
        trace = Trace()
        with products.slot(), products.stepping(), products.recording(extra=True) as requests:
            forward(products, np.asarray(ids), 0, Cache(), trace)  # the trace is of the last token: the word
            lens = inside.lens(products, trace, k)  # one search, every layer a query
        return trace, lens, requests
    finally:
        products.close()


def cosines(x: np.ndarray) -> np.ndarray:
    """The cosine between every two rows: (n, C) -> (n, n), in float64."""
    x = np.asarray(x, np.float64)
    norms = np.linalg.norm(x, axis=1)
    return (x @ x.T) / np.maximum(np.outer(norms, norms), 1e-30)


def contract(got: dict) -> dict:
    """What ``puffergpt contexts --json`` prints: {"word_id", "positions", "layers": [{"layer",
    "cosine", "lens"}]} (docs/cli.md)."""
    return {"word_id": got["word_id"], "positions": got["positions"],
            "layers": [{"layer": e["layer"], "cosine": e["cosine"], "lens": e["lens"]} for e in got["layers"]]}


__all__ = ["MAX_PROMPTS", "MIN_PROMPTS", "check", "contexts", "contract", "cosines"]
