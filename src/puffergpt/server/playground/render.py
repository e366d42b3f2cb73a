"""The playground API's JSON: a text, its steps, an inspection, a request, as the page
(``static/*.js``) reads them. Shapes only: what is in them is computed by the
application layer (``text.py``, ``inside.py``, ``views.py``)."""

from __future__ import annotations

import json

import numpy as np

from puffergpt.lens import attribution, inside
from puffergpt.model import tokenizer
from puffergpt.texts.text import Step, Text


def request_json(r) -> dict:
    d = r.to_json()
    d["cost_usd"] = r.cost_usd()
    return d


token_json = tokenizer.token_dict  # a token as text, with bytes_hex for a byte piece


part_label = attribution.label  # a part as the page names it: embed, L2 H5, L2 attn bias, L2 MLP, ln_f bias


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


def candidates_json(ids, logits) -> list[dict]:
    return [{"rank": i, **token_json(int(t)), "logit": float(v)} for i, (t, v) in enumerate(zip(ids, logits,
                                                                                               strict=True))]


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


def lens_json(entries: list[dict], chosen: int | None) -> list[dict]:
    """The logit lens, a layer an entry: its top tokens as text, and the rank of ``chosen``."""
    return [{"layer": e["layer"],
             "top": [{**token_json(int(i)), "logit": float(v)} for i, v in zip(e["ids"], e["logits"], strict=True)],
             "chosen_rank": None if chosen is None else inside.rank_of(e, chosen)} for e in entries]


def inspect_json(got: dict, text: Text, p: int, requests: list, recomputed: bool) -> dict:
    nxt = text.tokens[p] if p < len(text.tokens) and p < text.length else None
    d = {"position": p, "query_position": p - 1, "predicts_token": None if nxt is None else token_json(nxt),
         "tokens": [{"position": i, **token_json(t)} for i, t in enumerate(text.tokens[:p])],
         "attention": np.round(got["weights"][:, :, :p], 6).tolist(),
         "scores": np.round(got["scores"][:, :, :p], 5).tolist(), "lens": lens_json(got["lens"], nxt),
         "lens_k": got["k"], "decided_layer": inside.decided_layer(got["lens"]),
         "final_top1": token_json(inside.final_top1(got["lens"])),
         "requests": [request_json(r) for r in requests], "recomputed": recomputed}
    if "attribution" in got:
        d |= explained_json(got)
    return d


def step_inspect_json(step: Step) -> dict:
    got = step.inspect
    return {"attention": np.round(got["weights"][:, :, :step.position], 6).tolist(),
            "lens": lens_json(got["lens"], step.token_id), "decided_layer": inside.decided_layer(got["lens"]),
            "final_top1": token_json(inside.final_top1(got["lens"]))}


def step_json(step: Step, full: bool = True) -> dict:
    d = {"position": step.position, **token_json(step.token_id), "phase": step.phase,
         "read": step.read, "ms": round(step.ms, 3), "temperature": step.temperature,
         "requests": len(step.requests), "cost_usd": sum(r.cost_usd() for r in step.requests),
         "round_trips": sum(r.round_trips for r in step.requests)}
    if full:
        d["candidates"] = [{"rank": i, **c} for i, c in enumerate(step.candidates())]
        d["probs_t1"] = [c["prob"] for c in step.candidates(1.0)]
        d["request_log"] = [request_json(r) for r in step.requests]
    if step.inspect is not None:
        d |= step_inspect_json(step)
    return d


def text_json(t: Text, full: bool = True) -> dict:
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


def sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n"
