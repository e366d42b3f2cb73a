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

A cosine alone has no baseline: a ``control`` prompt, where the word means what it means in
prompt 1, gives the control pair (prompt 1, control) a line of its own (``layers[l]["control"]``),
so that a pair of different meanings is read against a pair of the same meaning. ``reading``
says in words what each line did from the embedding to ln_f, against the control's line where
there is one (``reading``); ``rarity`` marks a word seen rarely in training as the neighbours
view does (``views._rarity``); ``lens_note`` says why, where every lens row is punctuation or
one of the commonest tokens (``lens_note``).

Made of searches: per distinct prompt (up to the word), one prefill of its tokens (a fetch and
five searches a layer) and one lens search, in a run of its own, closed after; the requests
are counted and marked extra. ``puffergpt contexts`` and the page's route both call ``contexts``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from puffergpt.lens import inside, inspector, views
from puffergpt.model import tokenizer
from puffergpt.model.checkpoints import GPT2Config
from puffergpt.model.reference import Cache, Trace, forward
from puffergpt.model.session import Run
from puffergpt.model.token_counts import TokenCounts
from puffergpt.model.tokenizer import token_dict
from puffergpt.texts.text import TextError

MIN_PROMPTS, MAX_PROMPTS = 2, 3
SHOWN_TOKENS = 24  # tokens of a prompt an error lists
FLAT = 0.02  # a change of cosine, embedding to ln_f, smaller than this is read as flat
APART = 0.05  # a pair this far below the control's cosine entering ln_f is read as told apart
COMMONEST = 30  # a lens top-1 among this many most-seen tokens of training counts as filler


@dataclass(frozen=True)
class Asked:
    """What was asked, checked: the word's token, each prompt's tokens and the word's first
    position in each; the control prompt's (None: no control)."""

    word_id: int
    ids: list[list[int]]
    positions: list[int]
    control_ids: list[int] | None = None
    control_position: int | None = None


def check(word: str, prompts, max_chars: int | None = None, control: str | None = None) -> Asked:
    """The one check of a contexts request, before anything is opened: a word of one token
    (``views.one_token``), 2 or 3 prompts and the optional control prompt, each holding it, and
    of at most ``max_chars`` characters (an edge's bound: ``protocol.MAX_CONTEXT_CHARS``; None:
    none). A clear error names what is wrong."""
    word_id = views.one_token(word)
    if not isinstance(prompts, (list, tuple)) or not MIN_PROMPTS <= len(prompts) <= MAX_PROMPTS:
        n = len(prompts) if isinstance(prompts, (list, tuple)) else prompts
        raise TextError(f"give {MIN_PROMPTS} or {MAX_PROMPTS} prompts that each contain {word!r}, got {n!r}")
    ids = [_prompt(word, word_id, f"prompt {i}", prompt, max_chars) for i, prompt in enumerate(prompts, 1)]
    positions = [got.index(word_id) for got in ids]  # its first occurrence
    if control is None:
        return Asked(word_id, ids, positions)
    got = _prompt(word, word_id, "the control prompt", control, max_chars)
    return Asked(word_id, ids, positions, got, got.index(word_id))


def _prompt(word: str, word_id: int, name: str, prompt, max_chars: int | None) -> list[int]:
    """One prompt's tokens, or a clear error naming it (``name``: "prompt 2", "the control prompt")."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise TextError(f"{name} is empty: give a sentence that contains {word!r}")
    if max_chars is not None and len(prompt) > max_chars:
        raise TextError(f"{name} has {len(prompt)} characters, over {max_chars}: a context is a sentence or two")
    got = tokenizer.encode(prompt)
    if word_id not in got:
        raise TextError(_missing(word, name, prompt, got))
    return got


def _missing(word: str, name: str, prompt: str, ids: list[int]) -> str:
    shown = " + ".join(repr(tokenizer.token_text(t)) for t in ids[:SHOWN_TOKENS])
    more = f" + {len(ids) - SHOWN_TOKENS} more" if len(ids) > SHOWN_TOKENS else ""
    quoted = repr(prompt if len(prompt) <= 80 else prompt[:77] + "...")
    return (f"{name} ({quoted}) does not contain the token {word!r}: its tokens are {shown}{more}. "
            "A word inside a sentence carries its leading space (' mole'); at the very start of a "
            "prompt it has none, and there it is often other tokens")


def contexts(open_run: Callable[[], Run], config: GPT2Config, word: str, prompts, k: int = 5,
             control: str | None = None, counts: TokenCounts | None = None) -> dict:
    """The word in each prompt, layer by layer (see the module's docstring): {"word_id",
    "positions", "layers": [{"layer", "cosine", "lens", "top"(, "control")}], "word", "contexts",
    "control", "attention", "rarity", "reading", "lens_note", "k", "requests"}; ``requests`` are
    the store's requests, in order. ``counts``: the model's token counts (None: unknown)."""
    k = inspector.check_k(k)
    asked = check(word, prompts, control=control)
    named = [(f"prompt {i}", ids, p) for i, (ids, p) in enumerate(zip(asked.ids, asked.positions, strict=True), 1)]
    if control is not None:
        named.append(("the control prompt", asked.control_ids, asked.control_position))
    for name, _, p in named:
        if p >= config.n_ctx:
            raise TextError(f"in {name}, {word!r} is at position {p}, past the model's context of "
                            f"{config.n_ctx} tokens")
    prefixes = [tuple(ids[: p + 1]) for _, ids, p in named]
    reads = {pre: _read(open_run, list(pre), k) for pre in dict.fromkeys(prefixes)}  # each distinct one once
    per = [reads[pre] for pre in prefixes]  # (trace, lens, requests) of each prompt, the control last
    residual = np.stack([trace.residual for trace, _, _ in per])  # (n [+ 1], L + 1, C)
    n = len(prompts)
    layers = [_layer(l, residual[:, l], [lens[l] for _, lens, _ in per], n, counts) for l in range(config.n_layer + 1)]
    return {"word_id": asked.word_id, "positions": asked.positions, "layers": layers,
            "word": token_dict(asked.word_id), "k": k,
            "contexts": [_context(prompt, ids, p) for prompt, ids, p in zip(prompts, asked.ids, asked.positions,
                                                                           strict=True)],
            "control": None if control is None else {**_context(control, asked.control_ids, asked.control_position),
                                                     "with": 0},
            "attention": [np.round(np.stack(trace.layers("attn.weights")), 6).tolist() for trace, _, _ in per[:n]],
            "rarity": rarity(word, asked.word_id, counts),
            "reading": reading(layers, n, word), "lens_note": lens_note(layers, n, counts, config.n_layer),
            "requests": [r for _, _, requests in reads.values() for r in requests]}


def _context(prompt: str, ids: list[int], p: int) -> dict:
    return {"prompt": prompt, "position": p, "tokens": [token_dict(t) for t in ids]}


def _layer(l: int, x: np.ndarray, lens: list[dict], n: int, counts: TokenCounts | None) -> dict:
    """Layer l's entry from the prompts' vectors x (n [+ 1 control], C) and their lens entries:
    the cosine between the n contexts, their lens top-1 and top-k; with a control (the last row),
    its cosine with context 1."""
    cos = cosines(x)  # (m, m)
    entry = {"layer": l, "cosine": cos[:n, :n].tolist(), "lens": [int(e["ids"][0]) for e in lens[:n]],
             "top": [[_seen(int(t), counts) | {"logit": float(v)} for t, v in zip(e["ids"], e["logits"], strict=True)]
                     for e in lens[:n]]}
    if len(x) > n:
        entry["control"] = float(cos[0, n])
    return entry


def _seen(t: int, counts: TokenCounts | None) -> dict:
    """A token as the page shows it, with how often training saw it (None: unknown) and whether
    that is rarely (``RARE_BELOW``), as the neighbours view marks its rows."""
    return {**token_dict(t), "count": None if counts is None else counts.of(t),
            "rare": None if counts is None else counts.rare(t)}


def rarity(word: str, word_id: int, counts: TokenCounts | None) -> dict:
    """The word's training count and mark, by the neighbours view's one rule (``views._rarity``):
    {"count", "rare", "rare_below", "counts_known", "note"}."""
    r = views._rarity({word: word_id}, [], counts)
    return {**_seen(word_id, counts), "rare_below": r["rare_below"], "counts_known": r["counts_known"],
            "note": r["rare_note"]}


def _pairs(n: int) -> list[tuple[int, int]]:
    return [(a, b) for a in range(n) for b in range(a + 1, n)]


def _trend(c0: float, c1: float) -> str:
    way = "flat" if abs(c1 - c0) < FLAT else "rising" if c1 > c0 else "falling"
    return f"{c0:.4f} at the embedding, {c1:.4f} entering ln_f: {way} ({c1 - c0:+.4f})"


def _against(c: float, control: float) -> str:
    """A pair's last cosine read against the control's."""
    gap = control - c
    if gap >= APART:
        return (f"it ends {gap:.4f} below the control: the blocks set the word apart in these two contexts more "
                "than in two of the same sense: the model reads the word differently in them")
    if gap <= -APART:
        return (f"it ends {-gap:.4f} above the control: more alike than two of the same sense, so the control's "
                "sentences differ in more than the word's sense (their other words, the word's position): "
                "try a closer control")
    return (f"it ends within {APART} of the control ({-gap:+.4f}): by this measure the model reads the word no "
            "differently here than in two of the same sense")


def reading(layers: list[dict], n: int, word: str) -> list[str]:
    """What each line did from the embedding to ln_f, in words, from the numbers: each pair's
    trend read against the control's (where there is one), then what a rise and a fall mean."""
    first, last = layers[0], layers[-1]
    has_control = "control" in first
    lines, moves = [], []
    if has_control:
        lines.append(f"control (1 and the control prompt, {word!r} in the same sense): "
                     f"{_trend(first['control'], last['control'])}")
        moves.append(last["control"] - first["control"])
    for a, b in _pairs(n):
        c0, c1 = first["cosine"][a][b], last["cosine"][a][b]
        lines.append(f"{a + 1}·{b + 1}: {_trend(c0, c1)}" + (f"; {_against(c1, last['control'])}" if has_control
                                                              else ""))
        moves.append(c1 - c0)
    if any(m >= FLAT for m in moves):
        lines.append("A rising line: the blocks added to the word something its contexts share, more than what sets "
                     "them apart. At the embedding the vectors differ only by position (wpe), and every vector the "
                     "blocks write shares a few large directions, so a rise alone does not say the contexts mean the "
                     "same: " + ("read it against the control's line." if has_control else "compare a control."))
    if any(m <= -FLAT for m in moves):
        lines.append("A falling line: the blocks added different things to the word in each context (what attention "
                     "brought from the words before it, and what the MLP made of that).")
    if not has_control:
        lines.append("No control: a cosine alone has no baseline. Give a control prompt, where the word means what it "
                     "means in prompt 1, before reading a fall as two meanings.")
    return lines


def lens_note(layers: list[dict], n: int, counts: TokenCounts | None, n_layer: int) -> str | None:
    """Why the lens rows say little, where from layer 1 on every context's top-1 is punctuation
    or among the COMMONEST tokens seen in training; None where any is not."""
    tops = list(dict.fromkeys(t for e in layers[1:] for t in e["lens"][:n]))
    ranked = _ranks(counts, tops)
    if not tops or not all(_punctuation(t) or ranked.get(t, COMMONEST + 1) <= COMMONEST for t in tops):
        return None
    shown = ", ".join(repr(tokenizer.token_text(t)) + (f" (seen {counts.of(t):,} times, rank {ranked[t]})"
                                                       if t in ranked else "") for t in tops)
    what = "punctuation or one of the tokens training saw most" if counts is not None else "punctuation"
    return (f"From layer 1 on, every context's lens top-1 is {what}: {shown}. The lens reads what the model "
            f"would write next, not what the word means, and a small model ({n_layer} layers) writes what most "
            "often comes next in its training text, whatever the word. Read where the contexts' lists part below "
            "the top-1, and the cosines.")


def _punctuation(t: int) -> bool:
    return not any(ch.isalnum() for ch in tokenizer.token_text(t))


def _ranks(counts: TokenCounts | None, ids: list[int]) -> dict[int, int]:
    """Each id's rank among the tokens training saw most (1: the most), for those seen; {} unknown."""
    if counts is None:
        return {}
    return {t: int((counts.counts > counts.of(t)).sum()) + 1 for t in ids if counts.of(t)}


def _read(open_run: Callable[[], Run], ids: list[int], k: int) -> tuple[Trace, list[dict], list]:
    """A prompt's tokens up to the word, read in a run of their own (closed after), in a
    turn among the texts generating: the word's trace, its lens (n_layer + 1 entries of
    top-k) and the requests both cost, marked extra."""
    run = open_run()
    weights, session = run.weights, run.session
    try:
        trace = Trace()
        with session.slot(), session.stepping(), session.recording(extra=True) as requests:
            forward(weights, np.asarray(ids), 0, Cache(), trace)  # the trace is of the last token: the word
            lens = inside.lens(weights, trace, k)  # one search, every layer a query
        return trace, lens, requests
    finally:
        session.close()


def cosines(x: np.ndarray) -> np.ndarray:
    """The cosine between every two rows: (n, C) -> (n, n), in float64."""
    x = np.asarray(x, np.float64)
    norms = np.linalg.norm(x, axis=1)
    return (x @ x.T) / np.maximum(np.outer(norms, norms), 1e-30)


def contract(got: dict) -> dict:
    """What ``puffergpt contexts --json`` prints: {"word_id", "positions", "layers": [{"layer",
    "cosine", "lens"}]}; with a control, "control_position" and each layer's "control" (its cosine
    with context 1) too (docs/cli.md)."""
    keys = ("layer", "cosine", "lens", "control")
    out = {"word_id": got["word_id"], "positions": got["positions"],
           "layers": [{key: e[key] for key in keys if key in e} for e in got["layers"]]}
    if got["control"] is not None:
        out["control_position"] = got["control"]["position"]
    return out


__all__ = ["MAX_PROMPTS", "MIN_PROMPTS", "check", "contexts", "contract", "cosines", "lens_note", "rarity",
           "reading"]
