"""The edges' protocol, defined once: what a request may ask (the limits) and what an
answer looks like (the JSON of a step, a text, an inspection, an ablation, a view), for
the server (the page's ``static/*.js`` reads it), MCP and the CLI.

The numbers in it come computed: a step's probabilities from ``Step.candidates`` (the
softmax is ``sampling.probabilities``), an inspection's from ``inspector.py``. Here they
are only put in shape: rounded for the wire, counted, tokens written as text. The edges
render this JSON and compute nothing of the model's.

Limits a request is held to, whichever edge it comes through:

    MAX_PROMPT_CHARS   a prompt to continue, text appended, a prompt to compare or tokenize
    MAX_NEW_TOKENS     new tokens one request may ask for (a server may allow fewer)
    MAX_CONTEXT_CHARS  one prompt of the contexts view (``lens/contexts.py``): a sentence or two

The bounds a layer below enforces itself stay there, and the edges import them from it:
``lens.inside.MAX_VIEW_K`` (tokens a view may ask for), ``lens.contexts.MAX_PROMPTS``,
``lens.views.MAX_MAP_WORDS``, ``texts.text.MAX_PROMPT_IDS``.
"""

from __future__ import annotations

import numpy as np

from puffergpt import settings
from puffergpt.lens import attribution, inside
from puffergpt.model import sampling, tokenizer
from puffergpt.texts.text import Step, Text

MAX_PROMPT_CHARS = 16 * 1024
MAX_NEW_TOKENS = settings.default("max_new_tokens")  # a request's most; a server's default bound (serve's table)
MAX_CONTEXT_CHARS = 500  # bounds the contexts view's prefills and the attention it sends back


# --- the parts every answer is made of -----------------------------------------------------

token_json = tokenizer.token_dict  # a token as text, with bytes_hex for a byte piece

part_label = attribution.label  # a part as the page names it: embed, L2 H5, L2 attn bias, L2 MLP, ln_f bias


def request_json(r) -> dict:
    """One store request as the waterfall reads it, with its cost at turbopuffer's rates."""
    d = r.to_json()
    d["cost_usd"] = r.cost_usd()
    return d


def view_json(got: dict, requests: list) -> dict:
    """A view (analogy, neighbours, map, contexts, the KV cache, an output search) and the
    requests it cost."""
    return {**got, "requests": [request_json(r) for r in requests]}


def round_trips(requests: list) -> int:
    return sum(r.round_trips for r in requests)


def candidates_json(ids, logits) -> list[dict]:
    return [{"rank": i, **token_json(int(t)), "logit": float(v)} for i, (t, v) in enumerate(zip(ids, logits,
                                                                                               strict=True))]


def verdict_json(lens: list[dict]) -> dict:
    """What the lens decided: the first layer from which its top-1 stays, and that top-1."""
    return {"decided_layer": inside.decided_layer(lens), "final_top1": token_json(inside.final_top1(lens))}


def lens_json(entries: list[dict], chosen: int | None) -> list[dict]:
    """The logit lens, a layer an entry: its top tokens as text, and the rank of ``chosen``."""
    return [{"layer": e["layer"],
             "top": [{**token_json(int(i)), "logit": float(v)} for i, v in zip(e["ids"], e["logits"], strict=True)],
             "chosen_rank": None if chosen is None else inside.rank_of(e, chosen)} for e in entries]


# --- an inspection, an attribution, an ablation --------------------------------------------

def explained_json(got: dict) -> dict:
    """The attribution and its versus (each part labelled) and the neurons (most active; most
    pushing when asked, else None), tokens as text."""
    a, v = got["attribution"], got["attribution"]["versus"]

    def labelled(parts: list[dict]) -> list[dict]:
        return [{**part, "label": part_label(part)} for part in parts]

    def neurons(layers: list[list[dict]]) -> list[list[dict]]:
        return [[{**n, "promotes": [{**t, "token": token_json(t["token_id"])} for t in n["promotes"]]}
                 for n in layer] for layer in layers]

    return {"attribution": {"token_id": a["token_id"], "token": token_json(a["token_id"]), "logit": a["logit"],
                            "parts": labelled(a["parts"]),
                            "versus": {"token_id": v["token_id"], "token": token_json(v["token_id"]),
                                       "logit": v["logit"], "parts": labelled(v["parts"])}},
            "neurons": neurons(got["neurons"]), "pushing": None if got["pushing"] is None else neurons(got["pushing"])}


def inspect_json(got: dict, text: Text, p: int, requests: list, recomputed: bool) -> dict:
    """The view from the token at p - 1 (``inspector.inspect``): attention and its raw scores
    over the tokens 0..p-1, the lens, and the attribution when it was asked for."""
    nxt = text.tokens[p] if p < len(text.tokens) and p < text.length else None
    d = {"position": p, "query_position": p - 1, "predicts_token": None if nxt is None else token_json(nxt),
         "tokens": [{"position": i, **token_json(t)} for i, t in enumerate(text.tokens[:p])],
         "attention": np.round(got["weights"][:, :, :p], 6).tolist(),
         "scores": np.round(got["scores"][:, :, :p], 5).tolist(), "lens": lens_json(got["lens"], nxt),
         "lens_k": got["k"], **verdict_json(got["lens"]),
         "requests": [request_json(r) for r in requests], "recomputed": recomputed}
    if "attribution" in got:
        d |= explained_json(got)
    return d


def ablation_json(got: dict) -> dict:
    """A step run again with parts switched off (``inspector.ablate``): the candidates before and
    after, the model's top choice in each, and where the token at the position went."""
    (before, before_logits), (after, after_logits) = got["before"], got["after"]
    chosen = got["chosen"]

    def rank(ids) -> int | None:
        hit = [i for i, t in enumerate(ids) if int(t) == chosen]
        return hit[0] if hit else None

    return {"position": got["position"], "parts": got["parts"], "mode": got["mode"],
            "chosen": None if chosen is None else token_json(chosen),
            "before": candidates_json(before, before_logits), "after": candidates_json(after, after_logits),
            "top1_before": token_json(int(before[0])), "top1_after": token_json(int(after[0])),
            "changed": int(before[0]) != int(after[0]),
            "chosen_rank_before": None if chosen is None else rank(before),
            "chosen_rank_after": None if chosen is None else rank(after),
            "requests": [request_json(r) for r in got["requests"]]}


# --- a step's probabilities over every token, what a head writes --------------------------

def probabilities_json(step: Step, n_vocab: int, requests: list) -> dict:
    """A step's candidates with their probabilities over the whole vocabulary (``probabilities.normalise``)."""
    cands = step.candidates()
    return {"position": step.position, "temperature": step.temperature, "n_vocab": n_vocab,
            "candidates": [{"rank": i, **c} for i, c in enumerate(cands)],
            "normalisers": [[t, n] for t, n in sorted(step.normalisers.items())],
            "mass": sum(c["p_all"] for c in cands), "requests": [request_json(r) for r in requests]}


def writes_json(got: dict, tokens: list[int], requests: list) -> dict:
    """What a head writes (``inspector.head_writes``), tokens as text."""
    return {**got, "token": token_json(got["token_id"]),
            "sources": [{**s, "token": token_json(tokens[s["position"]]),
                         "top": [{**token_json(t), "score": v} for t, v in s["top"]]} for s in got["sources"]],
            "requests": [request_json(r) for r in requests]}


# --- a step and a text ---------------------------------------------------------------------

def step_inspect_json(step: Step) -> dict:
    """What a generation asked to see of each token (``inspect``): attention and the lens."""
    got = step.inspect
    return {"attention": np.round(got["weights"][:, :, :step.position], 6).tolist(),
            "lens": lens_json(got["lens"], step.token_id), **verdict_json(got["lens"])}


def step_json(step: Step, full: bool = True) -> dict:
    """A step as the page, the server's stream and MCP read it; ``full``: with its candidates
    (at the step's temperature and at 1) and its requests one by one."""
    d = {"position": step.position, **token_json(step.token_id), "phase": step.phase,
         "read": step.read, "ms": round(step.ms, 3), "temperature": step.temperature,
         "requests": len(step.requests), "cost_usd": sum(r.cost_usd() for r in step.requests),
         "round_trips": round_trips(step.requests)}
    if full:
        d["candidates"] = [{"rank": i, **c} for i, c in enumerate(step.candidates())]
        d["probs_t1"] = [c["prob"] for c in step.candidates(1.0)]
        d["request_log"] = [request_json(r) for r in step.requests]
    if step.controls is not None:  # what its candidates are after (a reopen computes them again with these)
        d["controls"] = sampling.controls_json(step.controls.sampling)
    if step.inspect is not None:
        d |= step_inspect_json(step)
    return d


def step_line(step: Step) -> dict:
    """A step as ``generate --json`` prints it, a line a token (docs/cli.md): the same
    candidates and counts as ``step_json``, fewer fields; with ``--inspect``, its attention
    (each weight rounded to 6 decimals), its lens as token ids, the lens's verdict, and the
    attribution and neurons as the inspector gave them."""
    d = {"position": step.position, "token_id": step.token_id, "text": step.text,
         "candidates": step.candidates(), "requests": len(step.requests),
         "round_trips": round_trips(step.requests), "ms": round(step.ms, 3)}
    if step.inspect is not None:
        got = step.inspect
        d["attention"] = [[[round(float(w), 6) for w in head[: step.position]] for head in layer]
                          for layer in got["weights"]]
        d["lens"] = [[{"token_id": int(i), "logit": float(v)} for i, v in zip(e["ids"], e["logits"], strict=True)]
                     for e in got["lens"]]
        d |= verdict_json(got["lens"])
        if "attribution" in got:
            d["attribution"], d["neurons"] = got["attribution"], got["neurons"]
    return d


def text_json(t: Text, full: bool = True) -> dict:
    """A text: its tokens (each generated one with the probability it was chosen with) and
    its steps, without their attention and lens (an inspection carries those)."""
    return {"id": t.id, "length": t.length, "known": len(t.tokens), "read_upto": t.read_upto,
            "tokens": [{"position": i, **token_json(tok), "generated": i in t.steps,
                        "prob": _chosen_prob(t.steps.get(i))} for i, tok in enumerate(t.tokens)],
            "steps": {str(p): {k: v for k, v in step_json(s, full).items() if k not in ("attention", "lens")}
                      for p, s in sorted(t.steps.items())}}


def _chosen_prob(step: Step | None) -> float | None:
    if step is None:
        return None
    probs = dict(zip(map(int, step.ids), (c["prob"] for c in step.candidates()), strict=True))
    return probs.get(step.token_id, 0.0)


__all__ = ["MAX_CONTEXT_CHARS", "MAX_NEW_TOKENS", "MAX_PROMPT_CHARS", "ablation_json", "candidates_json",
           "explained_json", "inspect_json", "lens_json", "part_label", "request_json", "round_trips",
           "step_inspect_json", "step_json", "step_line", "text_json", "token_json", "verdict_json", "view_json"]
