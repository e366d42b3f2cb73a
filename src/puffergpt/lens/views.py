"""Views of the model for a learner, each made of searches and counted: the embedding
views (``analogy``, ``neighbours``, ``embedding_map``) and a text's key namespace
(``kv``). Attention per layer and head, the logit lens and attribution are a text's
``inspect`` (``text.py``, ``inside.py``, ``attribution.py``).

Words are GPT-2 tokens (``one_token``); rows never trained are skipped and said so
(``untrained.py``); rows seen fewer than ``RARE_BELOW`` times in training are marked and said
so, where the model's token counts are known (``token_counts.py``, ``_rarity``); a token is
shown as text, with its bytes where they are not whole UTF-8 (``tokenizer.token_dict``).
"""

from __future__ import annotations

import numpy as np

from puffergpt.lens import inside
from puffergpt.model import tokenizer
from puffergpt.model.reference import Weights, layer_norm
from puffergpt.model.token_counts import RARE_BELOW, UNKNOWN, TokenCounts, frequency_axis
from puffergpt.model.tokenizer import token_dict
from puffergpt.texts.text import Text, TextBusy, TextError

MAX_MAP_WORDS = 24  # words an embedding map may place
# The analogies the demo model's card tries (a : b :: c : want), over common words: the card
# (``scripts/train_demo.py``) and the page's score (``card_analogies``) both read them here.
CARD_ANALOGIES = [
    (" man", " king", " woman", " queen"), (" man", " woman", " boy", " girl"),
    (" he", " she", " his", " her"), (" brother", " sister", " father", " mother"),
    (" son", " daughter", " father", " mother"), (" boy", " girl", " brother", " sister"),
    (" husband", " wife", " king", " queen"), (" dog", " dogs", " cat", " cats"),
    (" tree", " trees", " bird", " birds"), (" car", " cars", " house", " houses"),
    (" child", " children", " man", " men"), (" big", " bigger", " small", " smaller"),
    (" good", " better", " bad", " worse"), (" long", " longer", " short", " shorter"),
    (" walk", " walked", " jump", " jumped"), (" go", " went", " come", " came"),
    (" see", " saw", " take", " took"), (" run", " running", " swim", " swimming"),
    (" hot", " cold", " up", " down"), (" day", " night", " summer", " winter"),
    (" France", " French", " Germany", " German"), (" England", " English", " Spain", " Spanish"),
    (" one", " two", " three", " four"), (" first", " second", " third", " fourth"),
    (" January", " February", " March", " April"), (" Monday", " Tuesday", " Wednesday", " Thursday"),
    (" happy", " unhappy", " kind", " unkind"), (" quick", " quickly", " slow", " slowly"),
]


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


def _untrained(weights: Weights) -> frozenset[int] | None:
    """The ids of token vectors never trained (``untrained.py``); None when not recorded."""
    return weights.untrained


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


def _rarity(words: dict[str, int], results: list[dict], counts: TokenCounts | None) -> dict:
    """The one rule for rare rows: each answer gets its training ``count`` and ``rare`` (seen
    fewer than RARE_BELOW times), the input words seen so rarely are named, and a note says why
    it matters. Unknown counts are said to be unknown, never guessed."""
    if counts is None:
        for r in results:
            r["count"] = r["rare"] = None
        return {"rare_below": RARE_BELOW, "counts_known": False, "rare_inputs": None, "rare_results": None,
                "rare_note": UNKNOWN}
    for r in results:
        r["count"] = counts.of(r["token_id"])
        r["rare"] = r["count"] < RARE_BELOW
    rare_in = {w: counts.of(i) for w, i in words.items() if counts.rare(i)}
    n = sum(r["rare"] for r in results)
    notes = [f"{w!r} was seen {c} time{'s' if c != 1 else ''} in training: its vector barely moved from where it "
             f"started, so what lies near it says little about the word" for w, c in rare_in.items()]
    if n:
        notes.append(f"{n} of the {len(results)} answers {'was' if n == 1 else 'were'} seen fewer than {RARE_BELOW} "
                     f"times in training (marked, with the count): such a vector barely moved from where it "
                     f"started, and sits near the other rare ones for no reason the text gives")
    return {"rare_below": RARE_BELOW, "counts_known": True, "rare_inputs": list(rare_in), "rare_results": n,
            "rare_note": "; ".join(notes) or None}


def analogy(weights, a: str, b: str, c: str, k: int = 10, counts: TokenCounts | None = None) -> dict:
    """"a is to b as c is to ?": the k tokens most similar by cosine to wte[b] - wte[a] + wte[c]
    (a, b and c excluded, and rows never trained skipped; with the model's ``counts``, rows seen
    rarely marked: ``_rarity``). A fetch of three token vectors, then one search over all of them."""
    k = _check_k(k)
    ids = [one_token(w) for w in (a, b, c)]
    wa, wb, wc = weights.token_rows(ids).astype(np.float64)
    sims = weights.cosine_all((wb - wa + wc).astype(np.float32))
    results, skipped = _best(sims, k, set(ids), _untrained(weights))
    words = dict(zip((a, b, c), ids, strict=True))
    return {"tokens": {n: {"text": tokenizer.token_text(i), "token_id": i} for n, i in zip("abc", ids, strict=True)},
            "results": results, **_honesty(words, _untrained(weights), skipped), **_rarity(words, results, counts)}


def neighbours(weights, word: str, k: int = 10, counts: TokenCounts | None = None) -> dict:
    """The k token vectors nearest by cosine to a word's (rows never trained skipped, rows seen
    rarely marked): a fetch, then one search."""
    k = _check_k(k)
    i = one_token(word)
    sims = weights.cosine_all(weights.token_rows([i])[0])
    results, skipped = _best(sims, k, {i}, _untrained(weights))
    return {"token": {"text": tokenizer.token_text(i), "token_id": i}, "results": results,
            **_honesty({word: i}, _untrained(weights), skipped), **_rarity({word: i}, results, counts)}


def card_analogies(weights, counts: TokenCounts | None = None) -> dict:
    """How many of the demo model card's analogies (``CARD_ANALOGIES``) the model gets right
    with the search ``analogy`` does (the page's): the top answer is the wanted word. An entry
    whose words are not single trained tokens is not tried (as the card counts). One fetch and
    one search an entry tried."""
    bad = _untrained(weights) or frozenset()
    out = []
    for a, b, c, want in CARD_ANALOGIES:
        ids = [tokenizer.encode(w) for w in (a, b, c, want)]
        if any(len(x) != 1 or x[0] in bad for x in ids):
            continue
        got = analogy(weights, a, b, c, 3, counts)["results"]
        out.append({"a": a, "b": b, "c": c, "want": want, "answers": [r["text"] for r in got],
                    "ok": got[0]["token_id"] == ids[3][0]})
    return {"right": sum(x["ok"] for x in out), "tried": len(out), "listed": len(CARD_ANALOGIES), "results": out}


def embedding_map(weights, words: list[str], residual: np.ndarray | None = None,
                  counts: TokenCounts | None = None) -> dict:
    """A 2D map of some token vectors: the plane of their two principal components (signs
    fixed, so the same words give the same map), and the path of a residual stream
    (after ln_f, each scaled to the words' mean length) projected onto it. Says when the
    plane is degenerate (the second component explains under 1 %, or points fall on top
    of each other) and which words' vectors were never trained; with the model's ``counts``,
    how its first axis correlates with how often each word was seen (``axis_frequency``)."""
    if not isinstance(words, list) or not 2 <= len(words) <= MAX_MAP_WORDS:
        raise TextError(f"give 2 to {MAX_MAP_WORDS} words to map")
    ids = [one_token(w) for w in words]
    rows = weights.token_rows(ids).astype(np.float64)  # (n, C)
    mean = rows.mean(axis=0)
    _, sv, vt = np.linalg.svd(rows - mean, full_matrices=False)
    basis = vt[:2] * np.sign(vt[:2][np.arange(2), np.abs(vt[:2]).argmax(axis=1)])[:, None]  # (2, C)
    xy = (rows - mean) @ basis.T
    var = sv ** 2
    explained = [float(v) for v in (var[:2] / var.sum() if var.sum() > 0 else np.zeros(2))]
    bad = _untrained(weights)
    out = {"points": [{"label": tokenizer.token_text(i), "token_id": i, "x": float(x), "y": float(y),
                       "untrained": None if bad is None else i in bad,
                       "count": None if counts is None else counts.of(i),
                       "rare": None if counts is None else counts.rare(i)} for i, (x, y) in zip(ids, xy, strict=True)],
           "explained": explained, "path": [], **_degenerate(ids, xy, explained, bad),
           **_axis_note(counts, ids, xy[:, 0])}
    if residual is not None:
        c = weights.config
        g, b = weights.norm("ln_f")
        scale = np.linalg.norm(rows, axis=1).mean()
        for l, r in enumerate(residual):
            v = layer_norm(r, g, b, c.eps).astype(np.float64)
            v = v / max(np.linalg.norm(v), 1e-30) * scale
            x, y = (v - mean) @ basis.T
            out["path"].append({"layer": l, "x": float(x), "y": float(y)})
    return out


def _axis_note(counts: TokenCounts | None, ids: list[int], x: np.ndarray) -> dict:
    """What the map's first axis correlates with when that is frequency: Pearson's r of axis 1
    with log(1 + count) over the words, and a sentence saying so."""
    if counts is None:
        return {"axis_frequency": None, "axis_note": UNKNOWN}
    f = frequency_axis(counts, ids, x)
    if f is None:
        return {"axis_frequency": None, "axis_note": None}
    r = f["pearson"]
    say = (f"the first axis is largely how often a word was seen in training: its correlation with log(1 + count) "
           f"is r = {r:+.2f} over these {f['words']} words, so left and right mostly mean rare and frequent"
           if f["is_frequency"] else
           f"the first axis correlates with how often a word was seen in training at only r = {r:+.2f} "
           f"(log(1 + count), {f['words']} words)")
    return {"axis_frequency": f, "axis_note": say}


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
        counts = text.session.key_counts()
        return {"namespace": text.session.keys_ns, "layers": c.n_layer, "heads": c.n_head,
                "length": text.length, "read_upto": text.read_upto, "known": len(text.tokens),
                "documents": None if counts is None else int(sum(counts)), "per_layer": counts,
                "positions": [{"position": i, "token_id": tok, "text": tokenizer.token_text(tok),
                               "stored": i < text.read_upto, "written_by": text.written_by.get(i)}
                              for i, tok in enumerate(text.tokens)],
                "writes": list(text.writes)}


__all__ = ["CARD_ANALOGIES", "analogy", "card_analogies", "embedding_map", "kv", "neighbours", "one_token"]
