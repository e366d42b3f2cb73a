"""The checks a lesson's steps name (``lab.check``): each computes its evidence from the model on
the learner's prompt and fills its claim from the numbers, saying plainly when it does not hold.

- prefill vs decode: ``prefill_cost``, ``decode_cost``;
- temperature and top-k, over every token's probability: ``top_k_mass``, ``temperature``, ``greedy``;
- the copying head: ``copies`` (the model answers the token to copy), ``copying_head`` (found by
  its attention), ``head_lead`` (its share of the lead), ``head_off`` (ablation), ``head_writes``
  (what it writes, read through the token vectors), ``head_patch`` (activation patching);
- context changes meaning: ``position_only``, ``meaning_apart``;
- save what clicked: ``decided``, ``replays``.
"""

from __future__ import annotations

import numpy as np

from puffergpt.lens import contexts, inside, patching
from puffergpt.lens.attribution import Reading, attribution_of, head_writes, label
from puffergpt.lens.lab import Lab, check, say, tok, verdict
from puffergpt.model import tokenizer
from puffergpt.model.reference import Ablation
from puffergpt.model.sampling import Sampling, distribution, pick, probabilities
from puffergpt.model.session import Run
from puffergpt.texts.text import Text, TextError, opened

PRODUCTS = ("embed", "linear", "attention_scores", "top_k", "top_k_many", "logits", "row", "token_rows", "cosine_all")


class Counted:
    """Weights that count the products the forward pass asks of them (each a search or a fetch on
    the search engine; numpy makes no requests, so this is what both have in common)."""

    def __init__(self, weights):
        self._p, self.calls = weights, 0

    def __getattr__(self, name):
        got = getattr(self._p, name)
        if name not in PRODUCTS:
            return got

        def counted(*args, **kwargs):
            self.calls += 1
            return got(*args, **kwargs)
        return counted


def per_token(lab: Lab) -> int:
    return 1 + 5 * lab.config.n_layer + 1  # the embeddings' fetch, five products a block, the top-k search


def _steps(lab: Lab) -> list[dict]:
    """Two tokens written at temperature 0 on a text of its own: what each read and cost."""
    if "steps" not in lab.found:
        run = lab.open_run()
        counted = Counted(run.weights)
        text, out = Text(Run(counted, run.session)), []
        try:
            text.append(lab.ids)
            for step in text.generate(2, Sampling(0.0, 10)):
                out.append({"read": step.read, "products": counted.calls, "requests": len(step.requests),
                            "token": tok(step.token_id), "keys": text.cache.length()})
                lab.requests += step.requests
                counted.calls = 0
        finally:
            text.close()
        lab.found["steps"] = out
    return lab.found["steps"]


@check("prefill_cost")
def prefill_cost(lab: Lab) -> dict:
    first, n, want = _steps(lab)[0], len(lab.ids), per_token(lab)
    holds = first["read"] == n and first["products"] == want
    layers = lab.config.n_layer
    claim = (f"Reading your {n}-token prompt took {first['products']} products (searches and fetches): 1 fetch of the "
             f"embeddings, 5 in each of the {layers} blocks, 1 top-k search; as many as one token costs, because all "
             f"{n} tokens go through each matrix together (prefill)")
    if not holds:
        claim = (f"Reading your {n}-token prompt read {first['read']} tokens and took {first['products']} products, "
                 f"not the {want} of one batched pass")
    return verdict(claim, holds, tokens=n, read=first["read"], products=first["products"], per_token=want,
                   requests=first["requests"])


@check("decode_cost")
def decode_cost(lab: Lab) -> dict:
    first, second = _steps(lab)
    holds = second["read"] == 1 and second["products"] == first["products"] and second["keys"] == first["keys"] + 1
    claim = (f"The next token ({say(second['token']['token_id'])}) read 1 token, the one just written, and took "
             f"{second['products']} products, the same as the whole prompt: the keys and values of the "
             f"{first['keys']} positions read before were kept (the KV cache), and it now holds {second['keys']}")
    if not holds:
        claim = (f"The next token read {second['read']} tokens and took {second['products']} products against the "
                 f"prompt's {first['products']}: the cache did not spare the work")
    return verdict(claim, holds, prefill=first, decode=second)


def _probs(lab: Lab) -> np.ndarray:
    return probabilities(lab.final()[1], 1.0)  # (V,): every token's probability at temperature 1


@check("top_k_mass")
def top_k_mass(lab: Lab, k: int = 40) -> dict:
    p = np.sort(_probs(lab))[::-1]
    mass, top = float(p[:k].sum()), lab.top(1)[0]
    holds = mass >= 0.5
    v = lab.config.n_vocab
    claim = (f"Over all {v:,} tokens, the best ({top['text']!r}) has {p[0]:.1%}; the {k} best hold {mass:.1%} of the "
             f"probability, so top-k {k} leaves out only {1 - mass:.1%}, shared by {v - k:,} tokens")
    if not holds:
        claim = (f"Here the model is unsure: the {k} best tokens hold only {mass:.1%} of the probability, so top-k "
                 f"{k} leaves out {1 - mass:.1%}, most of what it might say (the best, {top['text']!r}, has "
                 f"{p[0]:.1%})")
    return verdict(claim, holds, k=k, mass=mass, top=top, top_prob=float(p[0]),
                   tokens_for_half=int(np.searchsorted(np.cumsum(p), 0.5) + 1), n_vocab=v)


@check("temperature")
def temperature(lab: Lab, low: float = 0.5, high: float = 2.0) -> dict:
    logits = lab.final()[1]
    best = int(np.argmax(logits))
    at = {t: float(probabilities(logits, t)[best]) for t in (low, 1.0, high)}
    holds = at[low] > at[1.0] > at[high]
    claim = (f"Temperature divides every logit before the softmax: {say(best)} has {at[1.0]:.1%} at temperature 1, "
             f"{at[low]:.1%} at {low:g} (sharper) and {at[high]:.1%} at {high:g} (flatter)")
    if not holds:
        claim = (f"{say(best)} has {at[low]:.1%} at temperature {low:g}, {at[1.0]:.1%} at 1 and {at[high]:.1%} at "
                 f"{high:g}: the model is so sure (or so tied) that temperature hardly moves it")
    return verdict(claim, holds, token=tok(best), probs={str(t): v for t, v in at.items()})


@check("greedy")
def greedy(lab: Lab, draws: int = 20, k: int = 40) -> dict:
    logits = lab.final()[1]
    drawn = {t: [int(pick(distribution(logits, Sampling(t, k)), np.random.default_rng(s))) for s in range(draws)]
             for t in (0.0, 1.0)}
    zero, one = set(drawn[0.0]), set(drawn[1.0])
    holds = len(zero) == 1
    claim = (f"At temperature 0, {draws} draws with {draws} seeds all gave {say(drawn[0.0][0])}: greedy ignores the "
             f"seed; at temperature 1 the same seeds gave {len(one)} different token{'s' if len(one) != 1 else ''}")
    return verdict(claim, holds, draws=draws, at_0=[tok(i) for i in sorted(zero)], at_1=[tok(i) for i in sorted(one)])


# --- the copying head ---------------------------------------------------------------------

def copy_target(ids: list[int]) -> tuple[int, int] | None:
    """Where an induction head would copy from: the position j after the earlier occurrence whose
    tokens before it match the end of the prompt longest (ties: the latest). -> (j, matched) or None"""
    T, best = len(ids), None
    for j in range(1, T):
        n = 0
        while n < j and ids[j - 1 - n] == ids[T - 1 - n]:
            n += 1
        if n and (best is None or n >= best[1]):
            best = (j, n)
    return best


def _target(lab: Lab) -> int:
    """The position to copy from, or TextError saying why there is none."""
    got = copy_target(lab.ids)
    if got is None:
        raise TextError(f"your prompt's last token {say(lab.ids[-1])} does not occur earlier: there is nothing to "
                        "copy, so the copying story can't be tested here (try the starter)")
    return got[0]


@check("copies")
def copies(lab: Lab) -> dict:
    j = _target(lab)
    logits, want = lab.final()[1], lab.ids[j]
    best = int(np.argmax(logits))
    rank = int((logits > logits[want]).sum())
    after = tokenizer.decode(lab.ids[max(0, j - 3):j])
    lab.found["target"] = j
    ev = dict(position=j, target=tok(want), answer=tok(best), target_rank=rank, target_logit=float(logits[want]),
              answer_logit=float(logits[best]))
    if best == want:
        return verdict(f"The model answers {say(want)}, the token that followed the earlier {after!r} (position {j}): "
                       f"it copies", True, **ev)
    return verdict(f"The model answers {say(best)}, not {say(want)}, the token that followed the earlier {after!r} "
                   f"(position {j}): the copying story does not hold on this prompt. {say(want)} is its choice "
                   f"number {rank + 1} (logit {logits[want]:.2f} against {logits[best]:.2f})", False, **ev)


def _head(lab: Lab) -> tuple[int, int, int]:
    """(layer, head, target position): the copying head found by ``copying_head``, found now if not yet."""
    if "head" not in lab.found:
        copying_head(lab)
    return (*lab.found["head"], lab.found["target"])


@check("copying_head")
def copying_head(lab: Lab, share: float = 0.3) -> dict:
    j = lab.found.get("target") or _target(lab)
    lab.found["target"] = j
    w = np.stack(lab.final()[0].layers("attn.weights"))[:, :, j]  # (L, H): each head's weight on position j
    order = np.argsort(-w, axis=None, kind="stable")
    (l, h), (l2, h2) = (np.unravel_index(i, w.shape) for i in order[:2])
    l, h = int(l), int(h)
    lab.found["head"] = (l, h)
    ev = dict(layer=l, head=h, position=j, weight=float(w[l, h]), runner_up={"layer": int(l2), "head": int(h2),
              "weight": float(w[l2, h2])}, on_target=np.round(w, 6).tolist())
    if w[l, h] >= share:
        return verdict(f"Head L{l} H{h} puts {w[l, h]:.0%} of the last token's attention on position {j} "
                       f"({say(lab.ids[j])}), the token to copy: more than any other head (next, L{l2} H{h2}: "
                       f"{w[l2, h2]:.0%})", True, **ev)
    return verdict(f"No head puts even {share:.0%} of the last token's attention on position {j} ({say(lab.ids[j])}): "
                   f"the most is L{l} H{h} with {w[l, h]:.0%}, so no head looks at the token to copy", False, **ev)


@check("head_lead")
def head_lead(lab: Lab) -> dict:
    l, h, j = _head(lab)
    trace, logits = lab.final()
    want = lab.ids[j]
    rival = next(int(i) for i in np.argsort(-logits, kind="stable") if int(i) != want)
    with lab.opened() as p:
        got = attribution_of(p, trace, [want, rival], np.asarray(p.token_rows(np.asarray([want, rival])), np.float64))
    parts = got["versus"]["parts"]
    mine = next(x["value"] for x in parts if x["kind"] == "attn" and (x["layer"], x["head"]) == (l, h))
    top = max(parts, key=lambda x: x["value"])
    lead = float(logits[want] - logits[rival])
    ev = dict(layer=l, head=h, token=tok(want), versus=tok(rival), lead=lead, share=mine, largest=label(top),
              largest_value=top["value"], parts=[{"part": label(x), "value": x["value"]} for x in parts])
    holds = label(top) == f"L{l} H{h}"
    claim = (f"Of the lead of {say(want)} over {say(rival)} ({lead:+.2f}), head L{l} H{h} adds {mine:+.2f}, the most "
             f"of any of the {len(parts)} parts")
    if not holds:
        claim = (f"Of the lead of {say(want)} over {say(rival)} ({lead:+.2f}), head L{l} H{h} adds {mine:+.2f}, but "
                 f"{label(top)} adds more ({top['value']:+.2f}): the head is not what decides it here")
    return verdict(claim, holds, **ev)


@check("head_off")
def head_off(lab: Lab) -> dict:
    l, h, j = _head(lab)
    want, before = lab.ids[j], lab.final()[1]
    with lab.opened() as p:
        _, x = lab.run(p, ablation=Ablation({l: (h,)}))
        after = np.asarray(p.logits(x), np.float64)
    was, now = int(np.argmax(before)), int(np.argmax(after))
    ev = dict(layer=l, head=h, target=tok(want), answer_before=tok(was), answer_after=tok(now),
              target_logit_before=float(before[want]), target_logit_after=float(after[want]),
              target_rank_after=int((after > after[want]).sum()))
    if was != want:
        return verdict(f"The model does not answer {say(want)} even with every head on (it answers {say(was)}), so "
                       f"switching L{l} H{h} off can't show that the copy needs it ({say(want)}'s logit "
                       f"{before[want]:.2f} -> {after[want]:.2f})", False, **ev)
    if now != want:
        return verdict(f"With L{l} H{h} switched off, the model answers {say(now)}, not {say(want)}: the copy needs "
                       f"that head ({say(want)}'s logit {before[want]:.2f} -> {after[want]:.2f})", True, **ev)
    return verdict(f"With L{l} H{h} switched off the model still answers {say(want)} (logit {before[want]:.2f} -> "
                   f"{after[want]:.2f}): other parts copy too, so the head is not needed for it here", False, **ev)


@check("head_writes")
def head_writes_check(lab: Lab, within: int = 10) -> dict:
    l, h, j = _head(lab)
    trace, want = lab.final()[0], lab.ids[j]
    with lab.opened() as p:
        writes, _ = head_writes(p, l, trace[f"h.{l}.attn.heads"])  # (H, C): one search
        read = Reading(p, trace)
        w = writes[h]
        scores = np.asarray(p.logits(((w - w.mean()) / read.s * read.g).astype(np.float32)), np.float64)  # (V,)
    rank = int((scores > scores[want]).sum())
    best = [tok(i) for i in np.argsort(-scores, kind="stable")[:5]]
    ev = dict(layer=l, head=h, target=tok(want), rank=rank, promotes=best)
    if rank < within:
        return verdict(f"What L{l} H{h} writes, read through the token vectors, ranks {say(want)} number {rank + 1} "
                       f"of {len(scores):,} tokens: the head writes the token it looks at", True, **ev)
    return verdict(f"What L{l} H{h} writes ranks {say(want)} only number {rank + 1} of {len(scores):,}; it promotes "
                   f"{', '.join(repr(b['text']) for b in best[:3])}: it does not write the token it looks at", False,
                   **ev)


REPLACEMENTS = [" 5", " 1", " 6", " 8", " 2", " 4", " 0", " 9", " 3", " 7"]


@check("head_patch")
def head_patch(lab: Lab, share: float = 0.3) -> dict:
    l, h, j = _head(lab)
    want = lab.ids[j]
    other = next(i for i in (tokenizer.encode(r)[0] for r in REPLACEMENTS) if i not in lab.ids)
    corrupt = list(lab.ids)
    corrupt[j] = other
    asked = patching.Asked(lab.ids, corrupt, want, other, "heads")
    got = patching.patch_one(lab.open_run, lab.config, asked, l, head=h)
    lab.requests += got["requests"]
    r = got["restored"]
    ev = dict(layer=l, head=h, corrupt=tokenizer.decode(corrupt), answer=tok(want), wrong=tok(other),
              clean_diff=got["clean_diff"], corrupt_diff=got["corrupt_diff"], restored=r)
    if r >= share:
        return verdict(f"Copying L{l} H{h}'s output at the last position from your prompt into one where {say(want)} "
                       f"is {say(other)} restores {r:.0%} of the lead of {say(want)} over {say(other)}: that head "
                       "carries the answer", True, **ev)
    return verdict(f"Copying L{l} H{h}'s output from your prompt into one where {say(want)} is {say(other)} restores "
                   f"only {r:.0%} of the lead: the answer travels some other way", False, **ev)


# --- context changes meaning --------------------------------------------------------------

def _contexts(lab: Lab, word: str) -> dict:
    """The prompt's lines as contexts of ``word`` (or of the first line's last token, where a
    line lacks it): the contexts view, computed once."""
    if "contexts" not in lab.found:
        lines = [x for x in lab.prompt.split("\n") if x.strip()]
        if len(lines) != 3:
            raise TextError(f"this lesson reads three lines, one context each (the first two meaning the same, the "
                            f"third another thing); your prompt has {len(lines)}")
        if not all(word in x for x in lines):
            word = tokenizer.token_text(tokenizer.encode(lines[0])[-1])
        got = contexts.contexts(lab.open_run, lab.config, word, lines, 1)
        lab.requests += got["requests"]
        lab.found["contexts"] = got
    return lab.found["contexts"]


@check("position_only")
def position_only(lab: Lab, word: str = " mole") -> dict:
    got = _contexts(lab, word)
    w, (p1, p2) = got["word"], got["positions"][:2]
    with lab.opened() as p:  # the vector entering block 0 is wte[word] + wpe[position], nothing else
        x1, x2 = (np.asarray(p.row("wte", w["token_id"]) + p.row("wpe", q), np.float64) for q in (p1, p2))
    mine = float(x1 @ x2 / (np.linalg.norm(x1) * np.linalg.norm(x2)))
    seen = got["layers"][0]["cosine"][0][1]
    holds = abs(mine - seen) < 1e-4
    ev = dict(word=w, positions=got["positions"], cosine=seen, from_rows=mine)
    if holds:
        return verdict(f"Entering block 0, {w['text']!r} is its token's row plus its position's row, nothing else: "
                       f"wte + wpe at positions {p1} and {p2} have cosine {mine:.4f}, as the view's {seen:.4f}"
                       + (" (the same position: the same vector)" if p1 == p2 else
                          ": whatever differs there is the position alone"), True, **ev)
    return verdict(f"Entering block 0 the view's cosine ({seen:.4f}) is not that of wte + wpe ({mine:.4f})", False,
                   **ev)


@check("meaning_apart")
def meaning_apart(lab: Lab, word: str = " mole") -> dict:
    got = _contexts(lab, word)
    first, last = got["layers"][0]["cosine"], got["layers"][-1]["cosine"]
    same, cross = last[0][1], max(last[0][2], last[1][2])
    holds = same > cross
    w = got["word"]["text"]
    ev = dict(word=got["word"], same_meaning=same, across=[last[0][2], last[1][2]],
              per_layer=[{"layer": e["layer"], "same": e["cosine"][0][1], "across": [e["cosine"][0][2],
                                                                                    e["cosine"][1][2]]}
                         for e in got["layers"]])
    if holds:
        return verdict(f"After the last block, {w!r} in the two same-meaning contexts has cosine {same:.3f}, and "
                       f"across meanings at most {cross:.3f} (entering block 0: {first[0][1]:.3f} and "
                       f"{max(first[0][2], first[1][2]):.3f}): context pulled the meanings apart", True, **ev)
    return verdict(f"After the last block, {w!r} in the two same-meaning contexts has cosine {same:.3f}, no closer "
                   f"than across meanings ({cross:.3f}): on these sentences the model did not separate the meanings",
                   False, **ev)


# --- save what clicked --------------------------------------------------------------------

@check("decided")
def decided(lab: Lab) -> dict:
    trace, logits = lab.final()
    with lab.opened() as p:
        lens = inside.lens(p, trace, 1)
    layer, best, n = inside.decided_layer(lens), int(np.argmax(logits)), lab.config.n_layer
    tops = [int(e["ids"][0]) for e in lens]
    ev = dict(token=tok(best), decided_layer=layer, lens_top1=[tok(i) for i in tops])
    if layer < n:
        return verdict(f"The logit lens shows {say(best)} as the top choice from layer {layer} on, of {n}: the model "
                       f"made up its mind before its last block", True, **ev)
    return verdict(f"{say(best)} becomes the top choice only after the last block: the lens's earlier layers said "
                   f"{', '.join(say(i) for i in tops[:-1])}", False, **ev)


@check("replays")
def replays(lab: Lab, k: int = 10, tolerance: float = 1e-3) -> dict:
    stored = lab.top(k)
    with opened(lab.open_run, lab.ids) as text:  # as replay reads it: one prefill, one top-k search
        with text.session.recording(extra=True) as requests:
            ids, logits = text.candidates(len(lab.ids), k)
    lab.requests += requests
    ids = [int(i) for i in ids]
    same = [c["token_id"] for c in stored] == list(ids)
    diff = max(abs(c["logit"] - v) for c, v in zip(stored, logits, strict=True))
    holds = same and diff <= tolerance
    claim = (f"The evidence an insight keeps, the {k} best next tokens and their logits, computed again on a text of "
             f"its own: the same tokens in the same order, every logit within {diff:.1e} (replay allows {tolerance:g})")
    if not holds:
        claim = (f"Computed again, the {k} best next tokens {'are the same' if same else 'differ'} and the logits move "
                 f"by up to {diff:.1e}, over the {tolerance:g} replay allows")
    return verdict(claim, holds, candidates=stored, max_abs_diff=diff, tolerance=tolerance)
