"""Activation patching: where the information that decides an answer is.

Two prompts of the same number of tokens, a clean one and a corrupted one, that the model
answers differently (``a = 7 ... b =`` answers `` 3``; with the 3 changed to 5, `` 5``). The
answer's lead d = logit(ANSWER) - logit(WRONG) at the last position is dc on the clean run and
dx on the corrupted one. Run the corrupted prompt again with one activation copied in from the
clean run, and see how much of the lead comes back: r = (d_patched - dx) / (dc - dx), 1 when
that activation carries everything the clean run knew about the answer, 0 when nothing.

- mode ``positions``: the residual stream entering block l (``h.{l}.resid``; l = n_layer: entering
  ln_f, ``ln_f.resid``) at position t, for every l and t: a layer x position grid. Where the
  changed token's information travels from its position to the last one, the grid shows when.
- mode ``heads``: each head's output at the last position (its slice of ``h.{l}.attn.heads``,
  before c_proj): a layer x head grid, which heads carry it.

The patch is an intervention on the one forward pass (``reference.forward``), as an ablation
is: the pass hands each named value to ``apply`` and goes on with what it returns. ``Capture``
keeps the clean run's values, ``Patch`` puts one of them into the corrupted run. Every run is a
forward pass of searches in a run of its own (a fetch and five searches a layer), counted and
marked extra; wte[ANSWER] and wte[WRONG] are one fetch, and d is read from them as attribution
reads a logit. ``patching`` yields as it goes (the page's progress, a Stop between runs);
``patch`` collects it into what ``puffergpt patch --json`` prints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from puffergpt.model import tokenizer
from puffergpt.model.checkpoints import GPT2Config
from puffergpt.model.reference import Ablation, Cache, forward
from puffergpt.model.session import Run
from puffergpt.texts.text import TextError

MODES = ("positions", "heads")
MAX_PATCH_TOKENS = 48  # a prompt's tokens: positions mode costs (n_layer + 1) x T runs, each a prefill
MAX_PATCH_CHARS = 400
MIN_SPREAD = 1e-4  # |dc - dx| below this: the prompts give the same lead, there is nothing to restore


class Capture(Ablation):
    """A pass with every part on that keeps, at every position it reads, what a patch may put:
    the residual entering each block and ln_f (T, C), each layer's heads' outputs (H, T, hd)."""

    def __init__(self):
        super().__init__()
        self.values: dict[str, np.ndarray] = {}

    def apply(self, name: str, value: np.ndarray) -> np.ndarray:
        if name.endswith(".resid") or name.endswith(".attn.heads"):
            self.values[name] = np.array(value, np.float32)  # a copy: the pass goes on with its arrays
        return value


class Patch(Ablation):
    """One value of a clean run put into another run: the residual ``name`` (``h.{l}.resid``,
    ``ln_f.resid``) at ``position``, or with ``head`` that head's output (``h.{l}.attn.heads``)."""

    def __init__(self, name: str, position: int, value: np.ndarray, head: int | None = None):
        super().__init__()
        self.name, self.position, self.value, self.head = name, position, value, head

    def apply(self, name: str, value: np.ndarray) -> np.ndarray:
        if name != self.name:
            return value
        value = np.array(value, np.float32)  # a copy: the caller's array stays as it was
        if self.head is None:
            value[self.position] = self.value  # (T, C) <- (C,)
        else:
            value[self.head, self.position] = self.value  # (H, T, hd) <- (hd,)
        return value


def resid_name(layer: int, config: GPT2Config) -> str:
    """The residual entering block ``layer``, or entering ln_f for layer n_layer."""
    return "ln_f.resid" if layer == config.n_layer else f"h.{layer}.resid"


@dataclass(frozen=True)
class Asked:
    """A patching request, checked: both prompts' tokens, the answer's and the wrong token's ids."""

    clean: list[int]
    corrupt: list[int]
    answer: int
    wrong: int
    mode: str = "positions"

    def runs(self, config: GPT2Config) -> int:
        """Forward passes it costs: the clean and corrupted runs, then one a patch."""
        return 2 + n_patches(config, len(self.clean), self.mode)


def n_patches(config: GPT2Config, n_tokens: int, mode: str) -> int:
    return (config.n_layer + 1) * n_tokens if mode == "positions" else config.n_layer * config.n_head


def one_token(word, what: str) -> int:
    """A token given as text that must be one GPT-2 token: its id, or a clear error naming its pieces."""
    if not isinstance(word, str) or not word:
        raise TextError(f"{what}: give one GPT-2 token as text (e.g. ' 3'), not {word!r}")
    ids = tokenizer.encode(word)
    if len(ids) != 1:
        pieces = " + ".join(repr(tokenizer.token_text(i)) for i in ids)
        raise TextError(f"{what} {word!r} is {len(ids)} GPT-2 tokens ({pieces}), not one: a word inside a "
                        "sentence carries its leading space (' 3')")
    return ids[0]


def bounded_ids(prompt, what: str, max_chars: int, max_tokens: int, why: str) -> list[int]:
    """The prompt's token ids, refused by name when it is empty or past its bounds (a lesson's and
    patching's prompts each cost one forward pass per step, position or head: ``why``)."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise TextError(f"the {what} prompt is empty: give some text")
    if len(prompt) > max_chars:
        raise TextError(f"the {what} prompt is {len(prompt)} characters; at most {max_chars} characters")
    ids = tokenizer.encode(prompt)
    if len(ids) > max_tokens:
        raise TextError(f"the {what} prompt is {len(ids)} tokens; at most {max_tokens} tokens: {why}")
    return ids


def prompt_ids(prompt, what: str) -> list[int]:
    return bounded_ids(prompt, what, MAX_PATCH_CHARS, MAX_PATCH_TOKENS,
                       "each position of each layer is a forward pass of its own")


def check_prompts(clean, corrupt) -> tuple[list[int], list[int]]:
    """Both prompts' tokens, of the same count: else a clear error naming both counts."""
    a, b = prompt_ids(clean, "clean"), prompt_ids(corrupt, "corrupted")
    if len(a) != len(b):
        raise TextError(f"the clean prompt is {len(a)} tokens and the corrupted one {len(b)}: patching copies "
                        "position t of one into position t of the other, so they must have the same number of "
                        "tokens (change a word for a word of one token)")
    return a, b


def check(clean, corrupt, answer, wrong, mode: str = "positions") -> Asked:
    """The one check of a patching request, before anything runs."""
    if mode not in MODES:
        raise TextError(f"patching mode {str(mode)[:20]!r} is not one of {', '.join(MODES)}")
    a, b = check_prompts(clean, corrupt)
    ans, wr = one_token(answer, "ANSWER"), one_token(wrong, "WRONG")
    if ans == wr:
        raise TextError(f"ANSWER and WRONG are the same token ({answer!r}): d = logit(ANSWER) - logit(WRONG) "
                        "would be 0 on every run")
    return Asked(a, b, ans, wr, mode)


def _run(open_run: Callable[[], Run], ids: list[int], intervention: Ablation,
         fetch: list[int] | None = None) -> tuple[np.ndarray, np.ndarray | None, list]:
    """One forward pass of ``ids`` in a run of its own (closed after), in a turn among the
    texts generating, with ``intervention`` on it; ``fetch``: token rows fetched there too.
    -> (the final hidden state at the last position (C,), the rows or None, the requests)"""
    run = open_run()
    weights, session = run.weights, run.session
    try:
        with session.slot(), session.stepping(), session.recording(extra=True) as requests:
            h = forward(weights, np.asarray(ids), 0, Cache(), None, intervention)  # (T, C)
            rows = None if fetch is None else np.asarray(weights.token_rows(np.asarray(fetch)), np.float64)
        return np.asarray(h[-1], np.float64), rows, requests
    finally:
        session.close()


def _patches(config: GPT2Config, asked: Asked, clean: Capture) -> Iterator[tuple[dict, Patch]]:
    """Each patch of the mode, in order (layer by layer), with where it is."""
    T = len(asked.clean)
    if asked.mode == "positions":
        for l in range(config.n_layer + 1):
            name = resid_name(l, config)
            for t in range(T):
                yield {"layer": l, "position": t}, Patch(name, t, clean.values[name][t])
        return
    for l in range(config.n_layer):
        name = f"h.{l}.attn.heads"
        for h in range(config.n_head):
            yield {"layer": l, "head": h}, Patch(name, T - 1, clean.values[name][h, T - 1], head=h)


def _base(open_run: Callable[[], Run], asked: Asked) -> tuple[Capture, np.ndarray, float, float, list]:
    """The clean run (its values kept) and the corrupted one: (the clean values, wte[ANSWER] -
    wte[WRONG] (C,), dc, dx, the requests). d = h . w is the two logits' difference."""
    clean = Capture()
    hc, rows, first = _run(open_run, asked.clean, clean, fetch=[asked.answer, asked.wrong])
    w = rows[0] - rows[1]
    hx, _, second = _run(open_run, asked.corrupt, Ablation())
    return clean, w, float(hc @ w), float(hx @ w), first + second


def patching(open_run: Callable[[], Run], config: GPT2Config, asked: Asked,
             should_stop: Callable[[], bool] | None = None) -> Iterator[dict]:
    """The runs as they go: first {"kind": "base", "clean_diff", "corrupt_diff", "runs"}, then a
    {"kind": "run", "layer", "position" or "head", "diff", "restored", "done"} each patched run.
    ``should_stop`` is asked before each run: the patches so far stand. Each event carries the
    store's requests since the last (``requests``: a list, marked extra)."""
    if len(asked.clean) > config.n_ctx:
        raise TextError(f"the prompts are {len(asked.clean)} tokens, past the model's context of {config.n_ctx}")
    clean, w, dc, dx, requests = _base(open_run, asked)
    if abs(dc - dx) < MIN_SPREAD:
        raise TextError(f"the clean and corrupted prompts give the answer the same lead over the wrong token "
                        f"({dc:+.4f} and {dx:+.4f}): there is nothing for a patch to restore; choose prompts the "
                        "model answers differently, or another pair of tokens")
    runs = asked.runs(config)
    yield {"kind": "base", "clean_diff": dc, "corrupt_diff": dx, "runs": runs, "requests": requests}
    for done, (where, p) in enumerate(_patches(config, asked, clean), 3):
        if should_stop is not None and should_stop():
            return
        h, _, requests = _run(open_run, asked.corrupt, p)
        d = float(h @ w)
        yield {"kind": "run", **where, "diff": d, "restored": (d - dx) / (dc - dx), "done": done, "runs": runs,
               "requests": requests}


def grid(config: GPT2Config, asked: Asked, events: list[dict]) -> list[dict]:
    """The runs as rows: positions mode [{"layer", "restored": [r_0 .. r_{T-1}]}] for l = 0..n_layer;
    heads mode [{"layer", "restored": [r_h for each head]}]. A run not made (stopped) is None."""
    cols = len(asked.clean) if asked.mode == "positions" else config.n_head
    rows = [{"layer": l, "restored": [None] * cols} for l in range(config.n_layer + (asked.mode == "positions"))]
    for e in events:
        if e["kind"] == "run":
            rows[e["layer"]]["restored"][e["position"] if asked.mode == "positions" else e["head"]] = e["restored"]
    return rows


def patch(open_run: Callable[[], Run], config: GPT2Config, asked: Asked,
          should_stop: Callable[[], bool] | None = None) -> dict:
    """Every run, collected: {"clean_diff", "corrupt_diff", "layers" (positions mode) or "heads"
    (heads mode): ``grid``'s rows, "runs", "requests": the store's requests, in order}."""
    events = list(patching(open_run, config, asked, should_stop))
    base = events[0]
    key = "layers" if asked.mode == "positions" else "heads"
    return {"clean_diff": base["clean_diff"], "corrupt_diff": base["corrupt_diff"], key: grid(config, asked, events),
            "runs": len(events) + 1, "requests": [r for e in events for r in e["requests"]]}


def contract(got: dict) -> dict:
    """What ``puffergpt patch --json`` prints (docs/patching.md)."""
    key = "layers" if "layers" in got else "heads"
    return {"clean_diff": got["clean_diff"], "corrupt_diff": got["corrupt_diff"], key: got[key]}


def top(open_run: Callable[[], Run], ids: list[int], k: int = 5) -> tuple[list[dict], list]:
    """A prompt's k best next tokens, from a forward pass and one top-k search in a run of its own."""
    run = open_run()
    weights, session = run.weights, run.session
    try:
        with session.slot(), session.stepping(), session.recording(extra=True) as requests:
            h = forward(weights, np.asarray(ids), 0, Cache())
            got, logits = weights.top_k(h[-1], k)
        return [{**tokenizer.token_dict(int(i)), "logit": float(v)} for i, v in zip(got, logits, strict=True)], requests
    finally:
        session.close()


def propose(open_run: Callable[[], Run], config: GPT2Config, clean, corrupt) -> dict:
    """What the page shows before it runs anything costly: both prompts' tokens (checked: the same
    count), each one's best next tokens (the clean run's top choice proposed as the answer, the
    corrupted run's as the wrong token), and how many runs each mode would cost."""
    a, b = check_prompts(clean, corrupt)
    clean_top, r1 = top(open_run, a)
    corrupt_top, r2 = top(open_run, b)
    answer, wrong = clean_top[0], corrupt_top[0]
    if wrong["token_id"] == answer["token_id"]:  # the same top choice: the corrupted run's next best
        wrong = corrupt_top[1]
    return {"clean": [tokenizer.token_dict(t) for t in a], "corrupt": [tokenizer.token_dict(t) for t in b],
            "clean_top": clean_top, "corrupt_top": corrupt_top, "answer": answer, "wrong": wrong,
            "runs": {m: 2 + n_patches(config, len(a), m) for m in MODES}, "requests": r1 + r2}



def patch_one(open_run: Callable[[], Run], config: GPT2Config, asked: Asked, layer: int,
              head: int | None = None, position: int | None = None) -> dict:
    """One patch alone (a lesson's test of one head): with ``head``, that head's output at the
    last position; else the residual entering ``layer`` at ``position``. Three runs.
    -> {"clean_diff", "corrupt_diff", "restored", "requests"}"""
    clean, w, dc, dx, r1 = _base(open_run, asked)
    T = len(asked.clean)
    if head is None:
        name = resid_name(layer, config)
        p = Patch(name, position, clean.values[name][position])
    else:
        name = f"h.{layer}.attn.heads"
        p = Patch(name, T - 1, clean.values[name][head, T - 1], head=head)
    h, _, r2 = _run(open_run, asked.corrupt, p)
    d = float(h @ w)
    restored = (d - dx) / (dc - dx) if abs(dc - dx) >= MIN_SPREAD else 0.0  # no spread: nothing to restore
    return {"clean_diff": dc, "corrupt_diff": dx, "diff": d, "restored": restored, "requests": r1 + r2}


__all__ = ["MAX_PATCH_TOKENS", "MODES", "Asked", "Capture", "Patch", "check", "contract", "grid", "patch", "patch_one",
           "patching", "propose"]
