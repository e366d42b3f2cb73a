"""The next token from an approximate index, measured against exact (issue 35).

Loretz and Hochreiter ("Accelerating LLM Inference via Vector Index Based Output Embeddings")
replace a model's output layer with a nearest-neighbour search over the token vectors through an
approximate index (HNSW). puffergpt's output search is exact by default: every wte row scored
(``SearchWeights.top_k``). ``--output-search approximate`` asks the store's HNSW index instead
(``SearchWeights.top_k_approximate``: which rows come back is approximate, each one's logit is
exact). Here both are run on the same hidden states, side by side:

- ``compare``: one position, both searches, what the index missed (the view and the bench);
- ``measure``: every position of a text, the searches' times, recall@k against exact and how
  often the greedy token changes (``puffergpt bench --output-search TEXT``).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from puffergpt.model import tokenizer
from puffergpt.model.reference import Cache, NumpyWeights, forward
from puffergpt.stores.base import NoIndex
from puffergpt.texts.text import Text, TextBusy, TextError

K = 40  # the top k compared: sampling's default top-k


def compare(weights, x: np.ndarray, k: int = K, ef: int | None = None) -> dict:
    """Both output searches for one hidden state x (C,): each one's ids and logits (best first)
    and ms, the exact top k the index missed, recall@k, whether the greedy token is the same."""
    t = time.perf_counter()
    e_ids, e_logits = weights.top_k_many(np.asarray(x)[None], k, kind="wte.top_k")[0]
    exact_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    a_ids, a_logits = weights.top_k_approximate(np.asarray(x), k, ef)
    approx_ms = (time.perf_counter() - t) * 1e3
    found = set(a_ids.tolist())
    return {
        "exact": {"ids": e_ids.tolist(), "logits": [float(v) for v in e_logits], "ms": exact_ms},
        "approximate": {"ids": a_ids.tolist(), "logits": [float(v) for v in a_logits], "ms": approx_ms},
        "missed": [int(i) for i in e_ids if int(i) not in found],
        "recall": recall(a_ids, e_ids),
        "same_greedy": bool(len(a_ids) and len(e_ids) and a_ids[0] == e_ids[0]),
    }


def at(text: Text, p: int, k: int = K, ef: int | None = None) -> tuple[dict, list]:
    """The learner's view: both output searches for the token at position p, from the hidden
    state at p - 1 (read first where it must be), tokens shown as text; the requests are marked
    extra; ``ef``: the index's search list (None: the one it was built with). Where the store has
    no index, ``available`` is False and ``why`` says which command builds it. -> (view, requests)"""
    with text.lock:
        if text.generating:
            raise TextBusy("this text is generating: compare the searches when it ends")
        if not 1 <= p <= text.length:
            raise TextError(f"position {p}: the searches predict a token at 1 to {text.length}")
        try:
            index = text.weights.engine.output_index()
        except NoIndex as e:
            return {"available": False, "why": str(e), "position": p, "k": k}, []
        with text.session.recording(extra=True) as requests:
            got = compare(text.weights, text.hidden_at(p - 1), k, ef)
    rank = {t: i for i, t in enumerate(got["exact"]["ids"])}
    for side in ("exact", "approximate"):
        got[side]["tokens"] = [tokenizer.token_dict(t) for t in got[side]["ids"]]
    got["exact"]["rows"] = text.weights.config.n_vocab  # every row scored
    got["approximate"]["rows"] = None  # the store does not say how many rows its graph search scored
    got["missed"] = [{"rank": rank[t], "token": tokenizer.token_dict(t), "logit": got["exact"]["logits"][rank[t]]}
                     for t in got["missed"]]
    index = {key: index[key] for key in ("kind", "database", "m", "ef_construction", "ef", "rows", "distinct")
             if key in index} | {"ef_used": ef or index["ef"]}
    return {"available": True, "position": p, "k": k, "n_vocab": text.weights.config.n_vocab,
            "token": tokenizer.token_dict(text.tokens[p]) if p < text.length else None, "index": index,
            **got}, requests


def choose(text: Text, how: str) -> None:
    """How the text's next tokens are found from now on (the page's setting): "exact", or
    "approximate" where the store has the index (else a TextError naming the command)."""
    with text.lock:
        if text.generating:
            raise TextBusy("this text is generating: change the output search when it ends")
        if how == "approximate":
            try:
                text.weights.engine.output_index()
            except NoIndex as e:
                raise TextError(f"output_search: {e}") from None
        text.weights.output_search = how


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    """|found ∩ exact| / |exact|: the share of the true top k the index returned."""
    return len(set(np.asarray(found).tolist()) & set(np.asarray(exact).tolist())) / max(len(exact), 1)


def hidden_states(ckpt, ids: list[int]) -> np.ndarray:
    """The final hidden states (after ln_f) at every position of ids, by numpy, in windows of the
    model's context: the same inputs for both searches. (T,) -> (T, C)"""
    p, n_ctx, out = NumpyWeights(ckpt), ckpt.config.n_ctx, []
    for s in range(0, len(ids), n_ctx):
        out.append(forward(p, np.asarray(ids[s:s + n_ctx]), 0, Cache()))
    return np.concatenate(out)


def measure(weights, xs: np.ndarray, k: int = K, ef: int | None = None) -> dict:
    """Both output searches at every hidden state of xs (T, C), taking turns (exact, then
    approximate, position by position) so that a noisy machine hurts both alike."""
    got = [compare(weights, x, k, ef) for x in xs]
    exact = [g["exact"]["ms"] for g in got]
    approx = [g["approximate"]["ms"] for g in got]
    changes = sum(not g["same_greedy"] for g in got)
    return {
        "positions": len(got), "k": k,
        "exact_ms": statistics.median(exact), "approximate_ms": statistics.median(approx),
        "speedup": statistics.median(exact) / max(statistics.median(approx), 1e-9),
        "recall": statistics.fmean(g["recall"] for g in got), "recall_min": min(g["recall"] for g in got),
        "greedy_changes": changes, "greedy_changes_per_1000": 1000 * changes / max(len(got), 1),
    }


def table(rows: list[dict]) -> str:
    """The bench's lines: one a backend (and model)."""
    head = (f"{'model':<10} {'backend':<10} {'positions':>9} {'exact ms':>9} {'approx ms':>9} {'speedup':>8} "
            f"{'recall@' + str(rows[0]['k'] if rows else K):>9} {'min':>5} {'greedy changes/1000':>20} {'index s':>8}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['model']:<10} {r['backend']:<10} {r['positions']:>9} {r['exact_ms']:>9.2f} "
                     f"{r['approximate_ms']:>9.2f} {r['speedup']:>7.1f}x {r['recall']:>9.3f} {r['recall_min']:>5.2f} "
                     f"{r['greedy_changes_per_1000']:>20.1f} {r['index_s']:>8.1f}")
    return "\n".join(lines)
