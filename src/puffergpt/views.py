"""Views of the model for a learner, each made of searches and counted: the embedding
views (``analogy``, ``neighbours``, ``embedding_map``) and a text's key namespace
(``kv``). Attention per layer and head, the logit lens and attribution are a text's
``inspect`` (``text.py``, ``inside.py``, ``attribution.py``).

Words are GPT-2 tokens (``one_token``); rows never trained are skipped and said so
(``untrained.py``); a token is shown as text, with its bytes where they are not whole
UTF-8 (``tokenizer.token_dict``).
"""

from __future__ import annotations

import numpy as np

from puffergpt import inside, tokenizer
from puffergpt.reference import Products, layer_norm
from puffergpt.text import Text, TextBusy, TextError
from puffergpt.tokenizer import token_dict

MAX_MAP_WORDS = 24  # words an embedding map may place


def one_token(word: str) -> int:
    """The token id of a word that is one GPT-2 token, else a clear error naming its tokens."""
    if not isinstance(word, str) or not word:
        raise TextError("give a word (one GPT-2 token), not an empty string")
    ids = tokenizer.encode(word)
    if len(ids) != 1:
        pieces = " + ".join(repr(tokenizer.token_text(i)) for i in ids)
        hint = ""
        if not word.startswith(" ") and len(tokenizer.encode(" " + word)) == 1:
            hint = f"; with its leading space, {' ' + word!r} is one token (words inside a sentence carry one)"
        raise TextError(f"{word!r} is {len(ids)} GPT-2 tokens ({pieces}), not one{hint}")
    return ids[0]


def _check_k(k) -> int:
    try:
        return inside.check_k(k)
    except ValueError as e:
        raise TextError(str(e)) from None


UNKNOWN_UNTRAINED = ("this store was loaded by an older puffergpt, which did not record which token vectors were "
                     "never trained (they may rank as answers): run `puffergpt load` with the same options to "
                     "record them")


def _untrained(products: Products) -> frozenset[int] | None:
    """The ids of token vectors never trained (``untrained.py``); None when not recorded."""
    return products.untrained


def _best(sims: np.ndarray, k: int, exclude: set[int],
          untrained: frozenset[int] | None) -> tuple[list[dict], int | None]:
    """The k best answers, never the inputs nor an untrained row; and how many untrained
    rows ranked among them and were skipped (None when which rows are untrained is unknown)."""
    order = np.argsort(-sims, kind="stable")
    best, skipped = [], 0
    for i in map(int, order):
        if len(best) == k:
            break
        if i in exclude:
            continue
        if untrained is not None and i in untrained:
            skipped += 1
            continue
        best.append(i)
    return [{**token_dict(i), "score": float(sims[i])} for i in best], (None if untrained is None else skipped)


def _honesty(words: dict[str, int], untrained: frozenset[int] | None, skipped: int | None) -> dict:
    """What a view says about untrained rows: which input words are, how many answers were
    skipped, and a note a learner reads."""
    if untrained is None:
        return {"untrained_inputs": None, "untrained_skipped": None, "note": UNKNOWN_UNTRAINED}
    bad = [w for w, i in words.items() if i in untrained]
    notes = []
    if bad:
        notes.append(f"{', '.join(repr(w) for w in bad)} {'was' if len(bad) == 1 else 'were'} never trained: "
                     f"the model never saw {'it' if len(bad) == 1 else 'them'} in its training text, so "
                     f"{'its vector is' if len(bad) == 1 else 'their vectors are'} the one shared by every unseen "
                     f"token and {'says' if len(bad) == 1 else 'say'} nothing about the word; try a word the "
                     "model knows")
    if skipped:
        notes.append(f"{skipped} untrained token vector{'s' if skipped != 1 else ''} (all alike, never trained) "
                     f"ranked among the answers and {'were' if skipped != 1 else 'was'} skipped")
    return {"untrained_inputs": bad, "untrained_skipped": skipped, "note": "; ".join(notes) or None}


def analogy(products, a: str, b: str, c: str, k: int = 10) -> dict:
    """"a is to b as c is to ?": the k tokens most similar by cosine to wte[b] - wte[a] + wte[c]
    (a, b and c excluded, and rows never trained skipped). A fetch of three token vectors,
    then one search over all of them."""
    k = _check_k(k)
    ids = [one_token(w) for w in (a, b, c)]
    wa, wb, wc = products.token_rows(ids).astype(np.float64)
    sims = products.cosine_all((wb - wa + wc).astype(np.float32))
    results, skipped = _best(sims, k, set(ids), _untrained(products))
    return {"tokens": {n: {"text": tokenizer.token_text(i), "token_id": i} for n, i in zip("abc", ids, strict=True)},
            "results": results, **_honesty(dict(zip((a, b, c), ids, strict=True)), _untrained(products), skipped)}


def neighbours(products, word: str, k: int = 10) -> dict:
    """The k token vectors nearest by cosine to a word's (rows never trained skipped): a
    fetch, then one search."""
    k = _check_k(k)
    i = one_token(word)
    sims = products.cosine_all(products.token_rows([i])[0])
    results, skipped = _best(sims, k, {i}, _untrained(products))
    return {"token": {"text": tokenizer.token_text(i), "token_id": i}, "results": results,
            **_honesty({word: i}, _untrained(products), skipped)}


def embedding_map(products, words: list[str], residual: np.ndarray | None = None) -> dict:
    """A 2D map of some token vectors: the plane of their two principal components (signs
    fixed, so the same words give the same map), and the path of a residual stream
    (after ln_f, each scaled to the words' mean length) projected onto it. Says when the
    plane is degenerate (the second component explains under 1 %, or points fall on top
    of each other) and which words' vectors were never trained."""
    if not isinstance(words, list) or not 2 <= len(words) <= MAX_MAP_WORDS:
        raise TextError(f"give 2 to {MAX_MAP_WORDS} words to map")
    ids = [one_token(w) for w in words]
    rows = products.token_rows(ids).astype(np.float64)  # (n, C)
    mean = rows.mean(axis=0)
    _, sv, vt = np.linalg.svd(rows - mean, full_matrices=False)
    basis = vt[:2] * np.sign(vt[:2][np.arange(2), np.abs(vt[:2]).argmax(axis=1)])[:, None]  # (2, C)
    xy = (rows - mean) @ basis.T
    var = sv ** 2
    explained = [float(v) for v in (var[:2] / var.sum() if var.sum() > 0 else np.zeros(2))]
    bad = _untrained(products)
    out = {"points": [{"label": tokenizer.token_text(i), "token_id": i, "x": float(x), "y": float(y),
                       "untrained": None if bad is None else i in bad} for i, (x, y) in zip(ids, xy, strict=True)],
           "explained": explained, "path": [], **_degenerate(ids, xy, explained, bad)}
    if residual is not None:
        c = products.config
        g, b = products.norm("ln_f")
        scale = np.linalg.norm(rows, axis=1).mean()
        for l, r in enumerate(residual):
            v = layer_norm(r, g, b, c.eps).astype(np.float64)
            v = v / max(np.linalg.norm(v), 1e-30) * scale
            x, y = (v - mean) @ basis.T
            out["path"].append({"layer": l, "x": float(x), "y": float(y)})
    return out


def _degenerate(ids: list[int], xy: np.ndarray, explained: list[float], bad: frozenset[int] | None) -> dict:
    """Whether a map's plane can mislead, and a note saying why (and which words are untrained)."""
    notes = []
    spread = float(np.abs(xy).max()) if len(xy) else 0.0
    near = np.linalg.norm(xy[:, None] - xy[None], axis=-1) <= 1e-6 * max(spread, 1e-30)  # (n, n)
    same = [(a, b) for a in range(len(ids)) for b in range(a + 1, len(ids)) if near[a, b] and ids[a] != ids[b]]
    flat = len(explained) < 2 or explained[1] < 0.01
    if flat:
        notes.append(f"the second component explains {100 * explained[1]:.2g} % of the spread: the points lie on a "
                     f"line or a point, and the map's second axis means nothing")
    if same:
        notes.append(f"{len({i for p in same for i in p})} words fall on the same point (their vectors are the same)")
    if bad is None:
        notes.append(UNKNOWN_UNTRAINED)
    else:
        words = [tokenizer.token_text(i) for i in ids if i in bad]
        if words:
            notes.append(f"never trained (all share one vector): {', '.join(repr(w) for w in dict.fromkeys(words))}")
    return {"degenerate": flat or bool(same), "note": "; ".join(notes) or None}


def kv(text: Text) -> dict:
    """The text's key namespace as it is: which positions hold keys, which read wrote them
    (a prefill's batch, a decode step's one token), counted in the store. Not while the
    text generates (its keys change under the count)."""
    c = text.config
    with text.lock:
        if text.generating:
            raise TextBusy("this text is generating: look at its keys when it ends")
        counts = text.products.key_counts()
        return {"namespace": text.products.keys_ns, "layers": c.n_layer, "heads": c.n_head,
                "length": text.length, "read_upto": text.read_upto, "known": len(text.tokens),
                "documents": None if counts is None else int(sum(counts)), "per_layer": counts,
                "positions": [{"position": i, "token_id": tok, "text": tokenizer.token_text(tok),
                               "stored": i < text.read_upto, "written_by": text.written_by.get(i)}
                              for i, tok in enumerate(text.tokens)],
                "writes": list(text.writes)}


__all__ = ["analogy", "embedding_map", "kv", "neighbours", "one_token"]
