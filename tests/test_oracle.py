"""numpy and the engine against a frozen oracle: what Hugging Face transformers computed with the
demo model (tests/data/oracle-demo.json, written by scripts/make_oracle.py), so that the fast
tier, which has no torch, still checks against ground truth (llm.c's way). Only the last test
runs transformers: it makes the file again and compares (the oracle tier, by conftest's rule)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from helpers import LOGIT_BOUNDS, assert_close
from puffergpt.model import checkpoints, tokenizer
from puffergpt.model.reference import Cache, NumpyWeights, forward
from puffergpt.model.sampling import Sampling
from puffergpt.search.manifest import open_engine
from puffergpt.texts.text import Text

ROOT = Path(__file__).resolve().parents[1]
ORACLE_FILE = ROOT / "tests" / "data" / "oracle-demo.json"
FORMAT = 1  # the layout this test reads (scripts/make_oracle.py's FORMAT)
REMAKE = "run `python scripts/make_oracle.py` (it needs torch and transformers: the test extra) and commit the file"
ORACLE = json.loads(ORACLE_FILE.read_text())
PROMPTS = [p["prompt"] for p in ORACLE["prompts"]]
# Tolerances, absolute, against transformers' float32 values. numpy does the same float32 arithmetic
# in another order: 1e-4, as tests/test_reference.py holds it to transformers live. The engine's
# products are searches, within LOGIT_BOUNDS["inner_product"] of numpy's, so within that plus 1e-4.
NUMPY_TOL = 1e-4
ENGINE_TOL = LOGIT_BOUNDS["inner_product"] + NUMPY_TOL
REMADE_TOL = 1e-5  # transformers again, on another day: the same arithmetic, perhaps another torch build


def oracle_of(prompt: str) -> dict:
    return next(p for p in ORACLE["prompts"] if p["prompt"] == prompt)


def assert_same_ids(name: str, got, want) -> None:
    """Lists of token ids equal, else the first that differs, by index, with both lists."""
    got, want = [int(t) for t in got], [int(t) for t in want]
    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    assert got == want, f"{name}: first difference at index {first}: got {got}, the oracle {want}"


def assert_top(name: str, o: dict, ids, logits, tol: float) -> None:
    """The best TOP_K ids at the prompt's last position are the oracle's (as a set: the file was
    made with no near tie at its boundary), each with the oracle's logit within tol.
    ids, logits: best first, at least TOP_K of them."""
    k = ORACLE["top_k"]
    got = dict(zip((int(i) for i in ids), (float(v) for v in logits), strict=True))
    top = [int(i) for i in ids[:k]]
    missing, extra = sorted(set(o["top_ids"]) - set(top)), sorted(set(top) - set(o["top_ids"]))
    assert not missing, f"{name}: top-{k} lacks the oracle's {missing} and has {extra} instead"
    assert_close(f"{name} top-{k} logits", [got[i] for i in o["top_ids"]], o["top_logits"], tol)


def test_the_oracle_is_of_the_demo_model_that_ships():
    """The file was made from these very weights, by a script that writes this layout."""
    assert ORACLE["format"] == FORMAT, f"{ORACLE_FILE} is format {ORACLE['format']}, this test reads {FORMAT}: {REMAKE}"
    d = checkpoints.demo_dir()
    for what, name in (("weights_sha256", "model.safetensors"), ("config_sha256", "config.json")):
        got = hashlib.sha256((d / name).read_bytes()).hexdigest()
        assert got == ORACLE["model"][what], (
            f"the demo model's {name} has changed since {ORACLE_FILE.name} was made ({ORACLE['date']}, "
            f"sha256 {ORACLE['model'][what][:12]}..., now {got[:12]}...): {REMAKE}")


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_tokenizer_agrees_with_the_oracle(prompt):
    """tiktoken (ours) and transformers' own GPT-2 tokenizer (the oracle's), on the same text."""
    assert_same_ids(f"{prompt!r} token ids", tokenizer.encode(prompt), oracle_of(prompt)["ids"])


@pytest.mark.parametrize("prompt", PROMPTS)
def test_numpy_agrees_with_the_oracle(demo, prompt):
    """reference.forward over NumpyWeights: the final hidden states (after ln_f) and logits at
    the first and last positions, the top 20 at the last, and 8 greedy tokens (KV cache)."""
    o, ids = oracle_of(prompt), oracle_of(prompt)["ids"]
    p, cache = NumpyWeights(demo), Cache()
    x = forward(p, np.array(ids), 0, cache)  # (T,) -> (T, C)
    logits = p.logits(x)  # (T, C) -> (T, V)
    for a in o["at"]:
        q = a["position"]
        assert_close(f"{prompt!r} ln_f at {q}", x[q, :len(a["ln_f"])], a["ln_f"], NUMPY_TOL)
        assert_close(f"{prompt!r} logits at {q} of {a['ids']}", logits[q, a["ids"]], a["logits"], NUMPY_TOL)
    best = np.argsort(-logits[-1], kind="stable")[:ORACLE["top_k"]]
    assert_top(f"numpy {prompt!r}", o, best, logits[-1, best], NUMPY_TOL)
    tokens = [int(np.argmax(logits[-1]))]
    while len(tokens) < ORACLE["greedy_n"]:  # one token at a time, through the cache
        h = forward(p, np.array(tokens[-1:]), len(ids) + len(tokens) - 1, cache)
        tokens.append(int(np.argmax(p.logits(h)[-1])))
    assert_same_ids(f"numpy {prompt!r} greedy tokens", tokens, o["greedy"])


@pytest.mark.parametrize("prompt", PROMPTS)
def test_the_engine_agrees_with_the_oracle(loaded, demo, prompt):
    """The searches, on the embedded store: a text's first step (its 40 candidates, of which the
    best 20 are the oracle's), 8 greedy tokens, and the hidden states the searches made."""
    o = oracle_of(prompt)
    store, key = loaded(demo)
    text = Text(open_engine(store, demo.name, key).open())
    try:
        text.append(o["ids"])
        steps = list(text.generate(ORACLE["greedy_n"], Sampling(0, 40)))
        with text.lock:
            hidden = {a["position"]: text.hidden_at(a["position"]) for a in o["at"]}
    finally:
        text.close()
    assert_top(f"engine {prompt!r}", o, steps[0].ids, steps[0].logits, ENGINE_TOL)
    assert_same_ids(f"engine {prompt!r} greedy tokens", [s.token_id for s in steps], o["greedy"])
    for a in o["at"]:
        q = a["position"]
        assert_close(f"engine {prompt!r} ln_f at {q}", hidden[q][:len(a["ln_f"])], a["ln_f"], ENGINE_TOL)


def test_making_the_oracle_again_gives_the_file():
    """scripts/make_oracle.py run now (transformers, torch CPU) writes what the file holds."""
    pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
    pytest.importorskip("transformers")
    spec = importlib.util.spec_from_file_location("make_oracle", ROOT / "scripts" / "make_oracle.py")
    make_oracle = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_oracle)
    new = make_oracle.oracle(checkpoints.demo_dir())
    for field in ("format", "model", "top_k", "greedy_n", "margin"):
        assert new[field] == ORACLE[field], f"{field}: now {new[field]}, the file {ORACLE[field]}: {REMAKE}"
    assert [p["prompt"] for p in new["prompts"]] == PROMPTS, f"the script's prompts changed: {REMAKE}"
    for got, want in zip(new["prompts"], ORACLE["prompts"], strict=True):
        name = repr(want["prompt"])
        for ids in ("ids", "top_ids", "greedy"):
            assert_same_ids(f"{name} {ids}", got[ids], want[ids])
        assert_close(f"{name} top logits", got["top_logits"], want["top_logits"], REMADE_TOL)
        for g, w in zip(got["at"], want["at"], strict=True):
            assert g["position"] == w["position"] and g["ids"] == w["ids"], f"{name}: {g} != {w}"
            assert_close(f"{name} ln_f at {w['position']}", g["ln_f"], w["ln_f"], REMADE_TOL)
            assert_close(f"{name} logits at {w['position']}", g["logits"], w["logits"], REMADE_TOL)
