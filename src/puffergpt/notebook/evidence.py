"""Replay's second half: what an insight shows beyond its candidates (an attention head's
weights, a lens layer, an analogy, the attribution and its versus, a rerun with parts
switched off), recomputed with a model (``data_from_runs``) and compared item by item
(``compare_data``): each item that differs is named, with the stored value, the value now
and by how much."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from puffergpt.notebook.insight import TOLERANCE

if TYPE_CHECKING:
    from puffergpt.model.session import Run

WEIGHT_TOLERANCE = 1e-4  # an attention weight is a share in 0..1, stored to 6 decimals
SHOWN_DIFFERENCES = 5  # items that differ listed in a replay's answer (all are counted)

# The data each kind's replay recomputes: an insight whose data lacks one is replayed on its
# candidates only, and says so.
CHECKED = {"attention": ("layer", "head", "weights"), "lens": ("layer", "ids", "logits"),
           "analogy": ("terms", "ids", "scores"), "attribution": ("token_id", "logit", "parts"),
           "ablation": ("parts", "after")}

DataAt = Callable[[dict], dict]
"""data_at(evidence) -> the evidence's data recomputed now, in the shape it is stored in."""


def checkable(ev: dict) -> bool:
    need = CHECKED.get(ev["kind"])
    return bool(need) and set(need) <= set(ev.get("data") or {})


def data_from_runs(open_run: Callable[[], Run]) -> DataAt:
    """A data_at over any run (the engine's ``open``, or numpy's), through the inspector
    the playground uses: the text read again on a text of its own, then the view's searches."""
    from puffergpt.lens import attribution, inspector, views
    from puffergpt.texts.text import opened

    def data_at(ev: dict) -> dict:
        kind, d, p = ev["kind"], ev["data"], ev["position"]
        if kind == "analogy":
            with opened(open_run) as t:
                r = views.analogy(t.weights, *d["terms"], k=len(d["ids"]))
            return {"ids": [x["token_id"] for x in r["results"]], "scores": [x["score"] for x in r["results"]]}
        with opened(open_run, [*ev["prompt_ids"][:p], ev["token_id"]]) as t:
            t.candidates(p, 1)  # tokens[:p] read, as the page's text had them
            if kind == "ablation":
                got = inspector.ablate(t, p, d["parts"], open_run, len(d["after"]), d.get("mode", "zero"))
                return {"after": [{"token_id": int(i), "logit": float(v)} for i, v in zip(*got["after"], strict=True)]}
            c = t.config
            top = c.n_layer if kind == "lens" else c.n_layer - 1  # the lens has a row past the last block
            if not (d.get("layer", 0) <= top and d.get("head", 0) < c.n_head):
                raise ValueError(f"evidence data names layer {d.get('layer')}, head {d.get('head')}: this model has "
                                 f"layers 0..{c.n_layer - 1} and heads 0..{c.n_head - 1}")
            k = len(d["ids"]) if kind == "lens" else 1
            got, _, _ = inspector.inspect(t, p, k, explain=False)
            if kind == "attention":
                return {"weights": [float(w) for w in got["weights"][d["layer"], d["head"], :p]]}
            if kind == "lens":
                e = got["lens"][d["layer"]]
                return {"ids": [int(i) for i in e["ids"]], "logits": [float(v) for v in e["logits"]]}
            versus = (d.get("versus") or {}).get("token_id")
            with t.lock:
                return attribution.attribution(t.weights, got["trace"], d["token_id"], versus)

    return data_at


def _ranked(what: str, stored: list[tuple[int, float]], now: list[tuple[int, float]], tol: float) -> list[dict]:
    """Ranked (token id, value) lists: the same ids in the same order, each value within tol."""
    by_id = dict(now)
    out = []
    for r, (i, v) in enumerate(stored):
        d = abs(v - by_id[i]) if i in by_id else None
        here = now[r] if r < len(now) else (None, None)
        out.append({"item": f"{what} rank {r + 1}", "stored": {"token_id": i, "value": v},
                    "now": {"token_id": here[0], "value": here[1]}, "diff": d, "tolerance": tol,
                    "ok": here[0] == i and d is not None and d <= tol})
    return out


def _values(what: str, stored: Iterable[tuple[str, float]], now: dict[str, float], tol: float) -> list[dict]:
    """Named values: each within tol of the one of the same name now."""
    out = []
    for name, v in stored:
        d = abs(v - now[name]) if name in now else None
        out.append({"item": f"{what}{name}", "stored": v, "now": now.get(name), "diff": d, "tolerance": tol,
                    "ok": d is not None and d <= tol})
    return out


def _parts(what: str, stored: dict, now: dict, tol: float) -> list[dict]:
    from puffergpt.lens.attribution import label

    named = lambda a: {label(x): x["value"] for x in a["parts"]}  # noqa: E731
    items = _values(what, [("logit", stored["logit"])], {"logit": now["logit"]}, tol)
    if stored["token_id"] != now["token_id"]:
        items.append({"item": f"{what}token", "stored": stored["token_id"], "now": now["token_id"], "diff": None,
                      "tolerance": tol, "ok": False})
    return items + _values(what, named(stored).items(), named(now), tol)


def _items(kind: str, stored: dict, now: dict, tol: float) -> list[dict]:
    if kind == "attention":
        l, h = stored["layer"], stored["head"]
        w = stored["weights"]
        items = _values(f"layer {l} head {h}: weight at position ", ((str(j), x) for j, x in enumerate(w)),
                        {str(j): x for j, x in enumerate(now["weights"])}, WEIGHT_TOLERANCE)
        if len(now["weights"]) != len(w):
            items.append({"item": f"layer {l} head {h}: positions", "stored": len(w), "now": len(now["weights"]),
                          "diff": None, "tolerance": 0, "ok": False})
        return items
    if kind == "lens":
        return _ranked(f"lens layer {stored['layer']}", list(zip(stored["ids"], stored["logits"], strict=True)),
                       list(zip(now["ids"], now["logits"], strict=True)), tol)
    if kind == "analogy":
        return _ranked("analogy", list(zip(stored["ids"], stored["scores"], strict=True)),
                       list(zip(now["ids"], now["scores"], strict=True)), tol)
    if kind == "ablation":
        means = " (set to their means)" if stored.get("mode") == "mean" else ""
        return _ranked(f"with {', '.join(stored['parts'])} off{means}",
                       [(c["token_id"], c["logit"]) for c in stored["after"]],
                       [(c["token_id"], c["logit"]) for c in now["after"]], tol)
    items = _parts("attribution: ", stored, now, tol)
    if stored.get("versus") and now.get("versus"):
        items += _parts(f"versus token {stored['versus']['token_id']}: ", stored["versus"], now["versus"], tol)
    return items


def compare_data(ev: dict, now: dict, tolerance: float = TOLERANCE) -> dict:
    """The stored data against ``now`` (``data_at``'s): how many items were checked, whether all
    match, the largest difference, and the first that differ (item, stored, now, diff)."""
    items = _items(ev["kind"], ev["data"], now, tolerance)
    diffs = [x["diff"] for x in items if x["diff"] is not None]
    bad = [{k: v for k, v in x.items() if k != "ok"} for x in items if not x["ok"]]
    return {"kind": ev["kind"], "checked": len(items), "matches": not bad, "differing": len(bad),
            "max_abs_diff": float(np.max(diffs)) if diffs else None, "tolerance": tolerance,
            "weight_tolerance": WEIGHT_TOLERANCE if ev["kind"] == "attention" else None,
            "differences": bad[:SHOWN_DIFFERENCES]}
