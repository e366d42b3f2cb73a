"""Activation patching (lens/patching.py): the residual entering each block (and ln_f) at each
position, and each head's output at the last position, copied from a clean run into a corrupted
one, against transformers with the same hooks (a forward pre-hook on the block, on ln_f, on
attn.c_proj); on numpy and on searches; the copy starter's grid shows the value's position; bad
requests are refused by name; ``puffergpt patch --json`` prints the contract."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest

from helpers import assert_close, open_run_for
from puffergpt.lens import patching
from puffergpt.model import tokenizer
from puffergpt.texts.text import TextError
from test_demo_model import COPY_HEAD, COPY_LAYER, COPY_PROMPT

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
transformers = pytest.importorskip("transformers")

TOL = 1e-3  # the contract: equal to transformers with the same hooks within 1e-3
CORRUPT = COPY_PROMPT.replace("b = 3", "b = 5")  # the value to copy changed: the demo answers " 5"
CASES = {"demo": (COPY_PROMPT, CORRUPT, " 3", " 5"),
         "tiny": ("the cat sat", "the dog sat", "omsky", "apply")}  # tiny's random weights: its own top two


@contextlib.contextmanager
def hooks(*pairs):
    handles = [module.register_forward_pre_hook(fn) for module, fn in pairs]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def replace_at(t: int, value, lo: int | None = None, hi: int | None = None):
    """A pre-hook putting ``value`` at position t of the module's input (B, T, C), all of it or [lo:hi]."""
    def hook(mod, args):
        x = args[0].clone()
        x[0, t, lo:hi] = value
        return (x, *args[1:])
    return hook


def hf_patching(m, clean: str, corrupt: str, answer: str, wrong: str, mode: str) -> dict:
    """transformers' patching, from hooks alone: the clean run's inputs to each block, to ln_f and
    to each c_proj kept by pre-hooks, then each put back into the corrupted run by a pre-hook."""
    tr, hd = m.transformer, m.config.n_embd // m.config.n_head
    a, b = tokenizer.encode(clean), tokenizer.encode(corrupt)
    ans, wr = tokenizer.encode(answer)[0], tokenizer.encode(wrong)[0]
    seen = {}
    keep = lambda key: lambda mod, args: seen.__setitem__(key, args[0][0].clone())  # noqa: E731
    modules = [*[(f"h.{l}", tr.h[l]) for l in range(len(tr.h))], ("ln_f", tr.ln_f),
               *[(f"c_proj.{l}", tr.h[l].attn.c_proj) for l in range(len(tr.h))]]

    def diff(ids, *pairs) -> float:
        with hooks(*pairs), torch.no_grad():
            logits = m(torch.tensor([ids])).logits[0, -1].double()
        return float(logits[ans] - logits[wr])

    dc = diff(a, *[(mod, keep(key)) for key, mod in modules])
    dx = diff(b)
    rows = []
    if mode == "positions":
        for key, mod in modules[:len(tr.h) + 1]:
            rows.append([(diff(b, (mod, replace_at(t, seen[key][t]))) - dx) / (dc - dx) for t in range(len(a))])
    else:
        for l, block in enumerate(tr.h):
            z = seen[f"c_proj.{l}"][-1]  # (C,): the heads' outputs merged, at the last position
            rows.append([(diff(b, (block.attn.c_proj, replace_at(len(a) - 1, z[h * hd:(h + 1) * hd], h * hd,
                                                                  (h + 1) * hd))) - dx) / (dc - dx)
                         for h in range(m.config.n_head)])
    return {"clean_diff": dc, "corrupt_diff": dx, "rows": np.array(rows)}


def ours(kind, loaded, ckpt, mode: str) -> dict:
    asked = patching.check(*CASES[ckpt.name if ckpt.name == "demo" else "tiny"], mode)
    return patching.patch(open_run_for(kind, loaded, ckpt), ckpt.config, asked)


# Every kind, model and mode but one: the searches on the demo in positions mode are 90 prefills
# through the store (minutes on two cores), and searches are covered there by the heads mode and
# by the tiny model's positions mode. Left out of the list, not skipped.
CASES_RUN = [(k, m, mode) for mode in ("positions", "heads")
             for k, m in (("numpy", "demo"), ("numpy", "tiny"), ("search", "tiny"), ("search", "demo"))
             if (k, m, mode) != ("search", "demo", "positions")]


@pytest.mark.parametrize("kind,model,mode", CASES_RUN)
def test_patching_equals_transformers_with_the_same_hooks(request, hf, loaded, kind, model, mode):
    ckpt = request.getfixturevalue(model)
    want = hf_patching(hf(ckpt), *CASES[model], mode)
    got = ours(kind, loaded, ckpt, mode)
    rows = np.array([r["restored"] for r in got["layers" if mode == "positions" else "heads"]])
    c = ckpt.config
    assert rows.shape == ((c.n_layer + 1, len(tokenizer.encode(CASES[model][0]))) if mode == "positions"
                          else (c.n_layer, c.n_head))
    assert abs(want["clean_diff"] - want["corrupt_diff"]) > 0.02, "the prompts must differ for the test to see anything"
    assert_close(f"{model}/{kind} dc", got["clean_diff"], want["clean_diff"], TOL)
    assert_close(f"{model}/{kind} dx", got["corrupt_diff"], want["corrupt_diff"], TOL)
    assert_close(f"{model}/{kind}/{mode} restored", rows, want["rows"], TOL)
    assert np.abs(rows).max() > 0.1, "no patch restored anything: the test would not see a patch that did nothing"
    assert got["runs"] == 2 + rows.size
    if kind == "search":  # each run a forward pass of searches, counted
        assert len(got["requests"]) >= got["runs"] * (1 + 5 * c.n_layer)


def test_the_copy_starters_grid_shows_where_the_value_is(demo):
    """The value to copy (' 3', position 6) carries the answer through layers 0-2; from layer 3 the
    last position does; entering ln_f only the last position matters. The copying head restores most."""
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.session import Run

    got = patching.patch(lambda: Run(NumpyWeights(demo)), demo.config, patching.check(*CASES["demo"]))
    rows = np.array([r["restored"] for r in got["layers"]])
    value = tokenizer.encode(COPY_PROMPT).index(tokenizer.encode(" 3")[0])
    assert (rows[:COPY_LAYER + 1, value] > 0.9).all(), rows[:, value]
    assert rows[-1, -1] == pytest.approx(1.0) and np.abs(rows[-1, :-1]).max() < 1e-6
    heads = patching.patch(lambda: Run(NumpyWeights(demo)), demo.config, patching.check(*CASES["demo"], "heads"))
    grid = np.array([r["restored"] for r in heads["heads"]])
    assert np.unravel_index(np.argmax(grid), grid.shape) == (COPY_LAYER, COPY_HEAD), grid.round(2)


@pytest.mark.parametrize("clean,corrupt,answer,wrong,says", [
    ("a = 7\nb = 3", "a = 7\nb = 3\nc", " 3", " 5", "the clean prompt is 7 tokens and the corrupted one 9"),
    ("a = 7", "a = 5", " 3 4", " 5", "ANSWER ' 3 4' is 2 GPT-2 tokens"),
    ("a = 7", "a = 5", " 3", "", "WRONG: give one GPT-2 token"),
    ("a = 7", "a = 5", " 3", " 3", "ANSWER and WRONG are the same token"),
    ("", "a = 5", " 3", " 5", "the clean prompt is empty"),
])
def test_bad_requests_are_refused_by_name(clean, corrupt, answer, wrong, says):
    with pytest.raises(TextError) as e:
        patching.check(clean, corrupt, answer, wrong)
    assert says in str(e.value)


def test_prompts_the_model_answers_alike_are_refused(demo):
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.session import Run

    with pytest.raises(TextError, match="nothing for a patch to restore"):
        asked = patching.check("a = 7", "a = 7", " 3", " 5")
        list(patching.patching(lambda: Run(NumpyWeights(demo)), demo.config, asked))


def test_a_stopped_run_keeps_the_patches_so_far(demo):
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.session import Run

    asked = patching.check(*CASES["demo"], "heads")
    seen = []
    events = patching.patching(lambda: Run(NumpyWeights(demo)), demo.config, asked, should_stop=lambda: len(seen) >= 4)
    for e in events:
        seen.append(e)
    assert [e["kind"] for e in seen] == ["base", "run", "run", "run"]
    rows = patching.grid(demo.config, asked, seen)
    assert sum(r is not None for row in rows for r in row["restored"]) == 3


def test_patch_cli_prints_the_contract(demo, hf):
    from click.testing import CliRunner

    from puffergpt.cli import main

    r = CliRunner().invoke(main, ["patch", "--model", "demo", "--engine", "reference", "--json", *CASES["demo"]],
                           env={"PUFFERGPT_DATA": None})
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert set(got) == {"clean_diff", "corrupt_diff", "layers"}
    assert [row["layer"] for row in got["layers"]] == list(range(demo.config.n_layer + 1))
    want = hf_patching(hf(demo), *CASES["demo"], "positions")
    assert_close("cli restored", np.array([row["restored"] for row in got["layers"]]), want["rows"], TOL)
    bad = CliRunner().invoke(main, ["patch", "--model", "demo", "--engine", "reference", "a = 7", "a = 7\nb", " 3",
                                    " 5"])
    assert bad.exit_code != 0 and "is 3 tokens and the corrupted one 5" in bad.output, bad.output
