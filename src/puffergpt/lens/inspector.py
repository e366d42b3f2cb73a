"""Inspecting a text: the learning views of one of its tokens, as a layer over ``text.Text``.

A text reads and writes tokens; the inspector asks it what a read showed (``Text.trace``,
or the trace of the step it is generating) and turns that into the views, each one made of
searches and counted as extra requests:

- ``inspect``: the view from the token at p - 1, whose output predicts position p: attention
  per layer and head over 0..p-1 and the logit lens (``inside.py``), and with ``explain`` the
  attribution of the token at p and the MLP's most active neurons (``attribution.py``);
- ``head_writes``: what one head writes from each position it attends to, read as the attribution reads a part;
- ``generate``: a text's generation with each new token inspected as it is written;
- ``ablate``: the step at p run again with parts of the model switched off, in a run of
  its own, beside the text's own candidates.

What it computes is kept on the text (``Text.keep``) while the tokens before it stay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from puffergpt.lens import attribution, inside, writes
from puffergpt.model.reference import Ablation, Averaging, Trace
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.texts.text import Step, Text, TextBusy, TextError, check_token_ids, opened


def check_k(k) -> int:
    try:
        return inside.check_k(k, "lens k")
    except ValueError as e:
        raise TextError(str(e)) from None


def check_versus(versus, n_vocab: int) -> int | None:
    """The token an attribution is compared with, checked: None (the runner-up) or a token id."""
    if versus is None:
        return None
    try:
        check_token_ids([versus], n_vocab)
    except TextError as e:
        raise TextError(f"versus: {e}") from None
    return int(versus)


def inspect(text: Text, p: int, k: int = 10, explain: bool = True, versus: int | None = None,
            pushing: bool = False) -> tuple[dict, list, bool]:
    """The view from the token at p - 1 (see the module's docstring). Kept from a generation
    that asked, else recomputed: that token through the layers again (``Text.trace``).
    ``explain`` adds the attribution of the token at p (the final top-1 when p is past the
    end) against ``versus`` (default: the runner-up) and the MLP's most active neurons, and
    ``pushing`` the neurons pushing that token most (every neuron's row: the whole of each
    c_proj). -> (inspection, the requests it cost, marked extra; recomputed?)"""
    k = check_k(k)
    versus = check_versus(versus, text.config.n_vocab)
    with text.lock:
        if text.generating:
            raise TextBusy("this text is generating: inspect a token when it ends")
        with text.session.recording(extra=True) as requests:
            got, recomputed = _view(text, p, k)
            if explain:  # the token at p, or the model's own prediction past the end
                chosen = text.tokens[p] if p < text.length else inside.final_top1(got["lens"])
                attribution.explain(text.weights, got, chosen, versus, pushing)
        return got, requests, recomputed


def _view(text: Text, p: int, k: int) -> tuple[dict, bool]:
    """Attention and the lens at p: kept, or recomputed and kept. -> (inspection, recomputed?)"""
    kept = text.kept.get(p)
    if kept is not None and kept["k"] >= k:
        return kept, False
    got = inside.inspection(text.weights, text.trace(p), k)
    text.keep(p, got)
    return got, True


def generate(text: Text, n: int, s: Sampling, k: int, explain: bool = False,
             should_stop: Callable[[], bool] | None = None, versus: int | None = None) -> Iterator[Step]:
    """``Text.generate`` with each token inspected as it is written (``Step.inspect``): its
    attention and a lens of top-k, and with ``explain`` its attribution (against ``versus``,
    default each step's runner-up) and the MLP's neurons. The lens over the step's own trace
    costs one more request, marked extra."""
    k = check_k(k)
    versus = check_versus(versus, text.config.n_vocab)
    if s.top_p < 1:
        raise TextError("inspect works over the top-k candidates: not with top_p or full log-probabilities")

    def observe(step: Step, trace: Trace | None) -> None:
        _observe(text, step, trace, k, explain, versus)

    yield from text.generate(n, s, should_stop=should_stop, observe=observe)


def _observe(text: Text, step: Step, trace: Trace | None, k: int, explain: bool, versus: int | None) -> None:
    """A step just written (the text's lock held): its inspection, from its own trace when it
    read tokens, else kept or recomputed (a replayed step)."""
    with text.session.recording(extra=True):
        if trace is not None:
            got = inside.inspection(text.weights, trace, k, (step.ids, step.logits))
            text.keep(step.position, got)
        else:
            got, _ = _view(text, step.position, k)
        if explain:
            attribution.explain(text.weights, got, step.token_id, versus)
    step.inspect = got


def head_writes(text: Text, p: int, spec: str, k: int = 10) -> tuple[dict, list]:
    """What head ``spec`` ("L.H") writes at the token at p - 1, a piece a source position (``writes.py``), read
    against the token at p (the model's own top-1 past the end), as the attribution reads it: the pieces sum to
    the head's part. The attention and the lens kept (or recomputed, ``inspect``); the values from the text's
    cache. -> ({"token_id", "position" (p - 1), "layer", "head", "sources", "total"}, its requests, marked extra)"""
    try:
        layer, head = writes.head_of(spec, text.config.n_layer, text.config.n_head)
    except ValueError as e:
        raise TextError(str(e)) from None
    with text.lock:
        if text.generating:
            raise TextBusy("this text is generating: open a head when it ends")
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= text.read_upto:
            raise TextError(f"writes: position {p!r} is outside 1..{text.read_upto} "
                            f"(the positions whose previous token the model has read)")
        with text.session.recording(extra=True) as requests:
            got, _ = _view(text, p, check_k(k))
            chosen = text.tokens[p] if p < text.length else inside.final_top1(got["lens"])
            values = text.cache.values[layer][head, :p]  # (p, hd): positions 0..p-1, read (p <= read_upto)
            out = writes.writes(text.weights, got["trace"], got["weights"][layer, head, :p], values, layer, head,
                                chosen)
        return out | {"position": p - 1}, requests


ABLATION_MODES = ("zero", "mean")


def ablate(text: Text, p: int, parts: list[str], open_run: Callable[[], Run], k: int = 10,
           mode: str = "zero") -> dict:
    """The step at p run again with ``parts`` switched off (``reference.Ablation``: "attn L.H",
    "mlp L") at every position: tokens[:p] read in one prefill in a run of its own, opened
    from ``open_run`` and closed after, so the text, its cache and its keys stay as they
    are; beside it the text's own k best candidates at p (the step's, or one top-k search).
    ``mode`` "zero" zeroes each part's output; "mean" puts its mean over positions 0..p-1 of an
    unablated pass (one more prefill, first). Every request is marked extra.
    -> {"position", "parts" (as read), "mode", "chosen" (the token at p, None past the end),
    "before" and "after" ((ids, logits), best first), "requests"}"""
    k = check_k(k)
    if mode not in ABLATION_MODES:
        raise TextError(f"ablate: mode {str(mode)[:20]!r} is not one of {', '.join(ABLATION_MODES)}")
    try:
        ablation = Ablation.of(parts, text.config)
    except ValueError as e:
        raise TextError(str(e)) from None
    if not ablation.parts:
        raise TextError("give at least one part to switch off: 'attn L.H' or 'mlp L'")
    with text.lock:
        if text.generating:
            raise TextBusy("this text is generating: switch parts off when it ends")
        if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= text.read_upto:
            raise TextError(f"ablate: position {p!r} is outside 1..{text.read_upto} "
                            f"(the positions whose previous token the model has read)")
        ids, chosen = list(text.tokens[:p]), (text.tokens[p] if p < text.length else None)
        with text.session.recording(extra=True) as requests:
            before = text.candidates(p, k)
    if mode == "mean":  # the parts' means over the same tokens, every part on
        averaging = Averaging(ablation)
        with opened(open_run, ids, averaging) as clean, clean.session.recording(extra=True) as first:
            with clean.session.slot():
                clean.read()
        requests, ablation = requests + first, averaging.ablation()
    with opened(open_run, ids, ablation) as other, other.session.recording(extra=True) as rerun:
        with other.session.slot():  # a turn among the texts generating, as a generation takes
            after = other.candidates(p, k)
    return {"position": p, "parts": ablation.parts, "mode": mode, "chosen": chosen, "before": before, "after": after,
            "requests": requests + rerun}
