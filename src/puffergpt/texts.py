"""The application layer: what the CLI, the server and the bench all call.

The edges parse and render; everything in between lives here, once:

- ``Texts``: the open texts of one engine (a bound, idle expiry, closing drops keys);
- ``opened``: a text that is closed, with its namespace of keys, on any exit;
- ``complete``: the one path that reads a prompt and writes tokens (``generate``,
  ``/v1/completions``, Compare and bench);
- ``Usage``: requests, sequential round trips, bytes and cost of some steps;
- the learning views, each made of searches: ``analogy``, ``neighbours``,
  ``embedding_map`` and ``kv`` here; attention per layer and head and the logit lens
  are ``Text.inspect`` (``text.py``, ``inside.py``).

What a text keeps for the views is bounded (``text.py``): a step keeps at most
``KEEP_CANDIDATES`` candidates, and a text the attention and lens of at most
``KEEP_INSPECTED`` positions; any other is recomputed on demand (one decode step's
requests plus one lens request, counted and marked ``extra`` in its request log).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from puffergpt import inside, tokenizer
from puffergpt.reference import Products, layer_norm
from puffergpt.sampling import Sampling
from puffergpt.text import Step, Text, TextError, check_generation

log = logging.getLogger("puffergpt")

MAX_MAP_WORDS = 24


# --- texts: open, find, close ---------------------------------------------------------

class Texts:
    """The open texts of one engine: a bound on how many, and expiry when idle."""

    def __init__(self, open_products: Callable[[], Products], max_open: int = 32, idle_s: float = 1800):
        self.open_products = open_products
        self.max_open = max_open
        self.idle_s = idle_s
        self._texts: dict[str, Text | None] = {}
        self._lock = threading.Lock()

    def create(self, ids: list[int]) -> Text:
        self.expire()
        with self._lock:
            if len(self._texts) >= self.max_open:
                raise TextError(f"{self.max_open} texts are open already: close one first")
            self._texts[placeholder := f"opening-{uuid.uuid4().hex}"] = None  # holds the place while it opens
        try:
            text = Text(self.open_products())  # store I/O: outside the registry's lock
        finally:
            with self._lock:
                self._texts.pop(placeholder, None)
        with self._lock:
            self._texts[text.id] = text
        try:
            text.append(ids)
        except TextError:
            self.close(text.id)
            raise
        return text

    def get(self, text_id: str) -> Text:
        with self._lock:
            text = self._texts.get(text_id) if not text_id.startswith("opening-") else None
        if text is None:
            raise KeyError(f"no open text {text_id!r} (closed, expired, or never opened)")
        text.last_used = time.monotonic()
        return text

    def close(self, text_id: str) -> None:
        with self._lock:
            text = self._texts.get(text_id)
        if text is None:
            raise KeyError(f"no open text {text_id!r} (closed, expired, or never opened)")
        with text.lock:
            text.close()  # if dropping its namespace fails, the text stays listed, to close again
        with self._lock:
            self._texts.pop(text_id, None)

    def expire(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        with self._lock:
            old = [i for i, t in self._texts.items() if t is not None and not t.generating and now - t.last_used > self.idle_s]
        closed = []
        for i in old:
            try:
                self.close(i)
                closed.append(i)
            except Exception as e:  # one text that can't close must not keep the others open
                log.warning("could not close idle text %s: %s", i, e)
        return closed

    def __len__(self) -> int:
        return len(self._texts)

    def close_all(self) -> None:
        for i in [i for i, t in list(self._texts.items()) if t is not None]:
            try:
                self.close(i)
            except Exception as e:
                log.warning("could not close text %s: %s", i, e)


@contextlib.contextmanager
def opened(open_products: Callable[[], Products], ids: list[int] = ()) -> Iterator[Text]:
    """A text of its own, closed (and its namespace of keys dropped) however the block ends."""
    text = Text(open_products())
    try:
        if ids:
            text.append(list(ids))
        yield text
    finally:
        text.close()


def complete(open_products: Callable[[], Products], ids: list[int], n: int, s: Sampling,
             should_stop: Callable[[], bool] | None = None, inspect: int = 0,
             full: bool = False, echo: bool = False, explain: bool = False) -> Iterator[Step]:
    """Read ``ids`` and write up to ``n`` tokens in a text of its own, closed at the end.
    ``full``: each token scores the whole vocabulary (exact log-probabilities, ``Step.logz``);
    ``echo``: first a step (phase "prompt") for each prompt token, scored the same way;
    ``explain`` (with ``inspect``): each token's attribution and the MLP's top neurons.

    Drive it to its end or call its ``close()`` from the thread that runs it: never leave
    an unfinished one to the garbage collector, whose finaliser would take the store's
    lock from whatever thread it runs in."""
    with opened(open_products) as text:
        text.check_tokens(list(ids))
        check_generation(text.config, s, len(ids), n)
        text.append(list(ids))
        if echo:
            yield from text.score_prompt()
        yield from text.generate(n, s, should_stop=should_stop, inspect=inspect, full=full, explain=explain)


# --- the model, for a newcomer ---

STARTERS = {
    # GPT-2 small: recall, copying a repetition (the attention panel shows induction heads), counting.
    "gpt2": [{"kind": "Recall a fact", "prompt": "The capital of France is"},
             {"kind": "Copy a repetition", "prompt": "Mr and Mrs Dursley of number four, Privet Drive. Mr and Mrs Dursley of number"},
             {"kind": "Continue a count", "prompt": "1, 2, 3, 4, 5,"}],
    # The demo model learnt WordNet's glosses, fortunes and the copying drill it was given
    # (its model card): prompts in those shapes. The copy prompt answers " 3" at temperature 0.
    "demo": [{"kind": "Define a word", "prompt": "happy (adjective):"},
             {"kind": "Copy a repetition", "prompt": "a = 7\nb = 3\nc = 9\na = 7\nb ="},
             {"kind": "Continue a sentence", "prompt": "He said that she"}],
}


def starters(model: str) -> list[dict]:
    return STARTERS.get(model, STARTERS["gpt2"])


# The embedding panel's first words: ones the model trained (an untrained row ties with
# every other and would teach nothing). The demo's analogy is one its card names as right.
EMBEDDING_WORDS = {
    "gpt2": {"neighbours": " king", "analogy": [" man", " king", " woman"],
             "map": [" king", " queen", " man", " woman", " Paris", " France", " London", " England"]},
    "demo": {"neighbours": " house", "analogy": [" he", " she", " his"],
             "map": [" one", " two", " three", " four", " he", " she", " his", " her", " up", " down", " hot", " cold"]},
}


def embedding_words(model: str) -> dict:
    return EMBEDDING_WORDS.get(model, EMBEDDING_WORDS["gpt2"])


def about(model: str, c) -> dict:
    shape = f"{c.n_layer} layers, width {c.n_embd}, {c.n_head} heads, context {c.n_ctx}, vocabulary {c.n_vocab:,}"
    if model == "demo":
        return {"name": "demo", "is_demo": True, "shape": shape,
                "description": "the demo model that ships with puffergpt: GPT-2's architecture and tokenizer, "
                               "4 layers of width 192 trained for half an hour on 2 CPU cores on WordNet's glosses, "
                               "fortunes and Python's docs (English perplexity about 800; it writes dictionary-like "
                               "phrases, soon loops at temperature 0, and has no induction head; its model card says more)",
                "how_to_get_gpt2": "run `puffergpt serve --model gpt2` (or `make run MODEL=gpt2`) on a machine that can "
                                   "reach the Hugging Face hub once, or `--model PATH` to a local copy in Hugging Face layout"}
    return {"name": model, "is_demo": False, "shape": shape, "description": f"{model}: {shape}", "how_to_get_gpt2": None}


# --- what it cost ---------------------------------------------------------------------

@dataclass
class Usage:
    """Totals over some steps: what they read and wrote, and the requests behind it."""

    tokens: int = 0
    requests: int = 0
    round_trips: int = 0  # sequential: each waits for the one before (concurrent writes don't)
    bytes: int = 0  # bytes of documents scanned, written or fetched
    ms: float = 0.0
    cost_usd: float = 0.0

    @classmethod
    def of(cls, steps: list[Step], tokens: int | None = None) -> "Usage":
        reqs = [r for st in steps for r in st.requests]
        return cls(len(steps) if tokens is None else tokens, len(reqs), sum(r.round_trips for r in reqs),
                   sum(r.bytes for r in reqs), round(sum(st.ms for st in steps), 1), sum(r.cost_usd() for r in reqs))

    @classmethod
    def phases(cls, steps: list[Step], prompt_tokens: int) -> dict[str, "Usage"]:
        """The prefill (the first step, which read the prompt) and the decode apart."""
        return {"prefill": cls.of(steps[:1], prompt_tokens if steps else 0), "decode": cls.of(steps[1:])}

    def to_json(self) -> dict:
        return dict(self.__dict__)


# --- inside the transformer -----------------------------------------------------------

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


def token_dict(tok: int) -> dict:
    """A token as text, and its bytes in hex where they are not whole UTF-8 on their own
    (a piece of a multi-byte character), so a page can show ``<e6>`` and not U+FFFD."""
    raw = tokenizer.token_bytes(tok)
    d = {"token_id": tok, "text": tokenizer.token_text(tok)}
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        d["bytes_hex"] = raw.hex()
    return d


UNKNOWN_UNTRAINED = ("this store was loaded by an older puffergpt, which did not record which token vectors were "
                     "never trained (they may rank as answers): run `puffergpt load` with the same options to record them")


def _untrained(products) -> frozenset[int] | None:
    """The ids of token vectors never trained (``untrained.py``); None when not recorded."""
    return getattr(products, "untrained", None)


def _best(sims: np.ndarray, k: int, exclude: set[int], untrained: frozenset[int] | None) -> tuple[list[dict], int | None]:
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
                     f"token and {'says' if len(bad) == 1 else 'say'} nothing about the word; try a word the model knows")
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
    return {"tokens": {n: {"text": tokenizer.token_text(i), "token_id": i} for n, i in zip("abc", ids)},
            "results": results, **_honesty(dict(zip((a, b, c), ids)), _untrained(products), skipped)}


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
                       "untrained": None if bad is None else i in bad} for i, (x, y) in zip(ids, xy)],
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
    (a prefill's batch, a decode step's one token), counted in the store."""
    c = text.config
    with text.lock:
        counts = text.products.key_counts() if hasattr(text.products, "key_counts") else None
        return {"namespace": getattr(text.products, "keys_ns", None), "layers": c.n_layer, "heads": c.n_head,
                "length": text.length, "read_upto": text.read_upto, "known": len(text.tokens),
                "documents": None if counts is None else int(sum(counts)), "per_layer": counts,
                "positions": [{"position": i, "token_id": tok, "text": tokenizer.token_text(tok),
                               "stored": i < text.read_upto, "written_by": text.written_by.get(i)}
                              for i, tok in enumerate(text.tokens)],
                "writes": list(text.writes)}


__all__ = ["Texts", "Usage", "analogy", "complete", "embedding_map", "kv", "neighbours", "one_token", "opened"]
