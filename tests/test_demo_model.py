"""The shipped demo model does what its model card (src/puffergpt/models/demo/README.md)
says: English it never trained on at a perplexity under 1,000, the copy prompt answered by
an induction head the attention view shows, token rows whose neighbours are not ties,
sensible analogies, and never-trained rows that are one shared vector. Measured with the
numpy reference; the reference's logits and attention are checked against transformers on
the same inputs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from puffergpt.model import tokenizer
from puffergpt.model.reference import Cache, NumpyWeights, Trace, forward, softmax

HELD_OUT = Path(__file__).parent / "data" / "english.txt"  # never trained on: scripts/train_demo.py drops it
CARD = Path(__file__).parent.parent / "src" / "puffergpt" / "models" / "demo" / "README.md"
COPY_PROMPT = "a = 7\nb = 3\nc = 9\na = 7\nb ="
COPY_LAYER, COPY_HEAD = 2, 2  # the induction head: most weight on the token to copy (0-based), per the card
N_UNTRAINED = 34_643  # rows of wte set to one shared vector (the card says how many)
PERPLEXITY = 614.2  # the card's figure for tests/data/english.txt
ANALOGIES = [
    (" he", " she", " his", " her"),
    (" one", " two", " three", " four"),
]  # (a, b, c, answer) the card names as right


def paragraphs() -> list[list[int]]:
    return [tokenizer.encode(p.strip()) for p in HELD_OUT.read_text(encoding="utf-8").split("\n\n") if p.strip()]


def last_token_trace(ckpt, ids) -> tuple[np.ndarray, Trace]:
    """The numpy forward pass of ids: (logits of the last token (V,), its trace)."""
    p, trace = NumpyWeights(ckpt), Trace()
    h = forward(p, np.asarray(ids), 0, Cache(), trace)  # (T, C)
    return p.logits(h[-1]), trace


def unit_rows(ckpt) -> np.ndarray:
    wte = ckpt.params["wte.weight"].astype(np.float64)  # (V, C)
    return wte / np.linalg.norm(wte, axis=1, keepdims=True)


def one_id(word: str) -> int:
    ids = tokenizer.encode(word)
    assert len(ids) == 1, f"{word!r} is {len(ids)} tokens"
    return ids[0]


def test_held_out_english_perplexity_is_under_1000(demo):
    total, n = 0.0, 0
    for ids in paragraphs():
        p = NumpyWeights(demo)
        logits = p.logits(forward(p, np.asarray(ids), 0, Cache()))[:-1].astype(np.float64)  # (T-1, V)
        logp = logits - logits.max(1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(1, keepdims=True))
        total -= logp[np.arange(len(ids) - 1), ids[1:]].sum()
        n += len(ids) - 1
    ppl = float(np.exp(total / n))
    assert n == 377, "the held-out text: five paragraphs, 382 tokens"
    assert ppl <= 1000, f"perplexity {ppl:.1f} on English the model never saw"
    assert abs(ppl - PERPLEXITY) / PERPLEXITY < 0.01, f"perplexity {ppl:.2f}, the model card says {PERPLEXITY}"


def copy_weights(ckpt) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(ids, last-token logits (V,), attention weights (n_layer, n_head, T)) of the copy prompt."""
    ids = tokenizer.encode(COPY_PROMPT)
    logits, trace = last_token_trace(ckpt, ids)
    return ids, logits, np.stack(trace.layers("attn.weights"))


def test_copy_prompt_answers_3(demo, hf):
    torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
    ids, logits, w = copy_weights(demo)
    assert tokenizer.decode([int(np.argmax(logits))]) == " 3"
    # The attention the views show is transformers' own (eager softmax), to 1e-4.
    with torch.no_grad():
        att = hf(demo)(torch.tensor([ids]), output_attentions=True).attentions
    want = np.stack([a[0, :, -1].numpy() for a in att])  # (n_layer, n_head, T)
    assert np.abs(w - want).max() < 1e-4
    target = ids.index(one_id(" 3"))  # the token to copy: the " 3" after the first "b ="
    on_target = w[:, :, target]  # (n_layer, n_head)
    assert np.unravel_index(np.argmax(on_target), on_target.shape) == (COPY_LAYER, COPY_HEAD), on_target.round(3)


def test_an_induction_head_puts_most_weight_on_the_token_to_copy(demo):
    ids, _, w = copy_weights(demo)
    on_target = w[COPY_LAYER, COPY_HEAD, ids.index(one_id(" 3"))]
    assert on_target > 0.5, f"layer {COPY_LAYER} head {COPY_HEAD} puts {on_target:.3f} on the ' 3' to copy"


def test_the_cards_other_copy_prompts_answer_as_it_says(demo):
    # The card lists prompts of the copy prompt's shape, each marked right or wanted: check every line.
    card = CARD.read_text()
    lines = re.findall(r"^  - `'(.*?)'` -> `'(.*?)'`", card, re.M)
    assert len(lines) >= 4, "the card lists the other copy prompts it tried"
    for prompt, answer in lines:
        ids = tokenizer.encode(prompt.encode().decode("unicode_escape"))
        logits, _ = last_token_trace(demo, ids)
        assert tokenizer.decode([int(np.argmax(logits))]) == answer, prompt


def test_nearest_tokens_to_common_words_are_not_ties(demo):
    unit = unit_rows(demo)
    for word in (" king", " water", " house"):
        i = one_id(word)
        cos = unit @ unit[i]  # (V,)
        cos[i] = -2
        top = np.sort(cos)[::-1][:10]
        assert top[0] < 0.999, f"{word!r}: nearest row at cosine {top[0]:.4f}"
        assert len(set(np.round(top, 6))) == 10, f"{word!r}: tied neighbours {top}"


def test_named_analogies_answer_right(demo):
    unit = unit_rows(demo)
    dup = untrained_ids(demo)
    assert ANALOGIES, "the model card names some analogies"
    for a, b, c, want in ANALOGIES:
        ia, ib, ic = one_id(a), one_id(b), one_id(c)
        q = unit[ib] - unit[ia] + unit[ic]
        cos = unit @ (q / np.linalg.norm(q))  # (V,)
        cos[[ia, ib, ic]] = -2
        cos[dup] = -2  # the shared row is no answer
        got = tokenizer.decode([int(np.argmax(cos))])
        assert got == want, f"{a!r} : {b!r} :: {c!r} : {got!r}, not {want!r}"


def untrained_ids(ckpt) -> np.ndarray:
    """Ids of rows equal to another row, by numpy's unique (independent of puffergpt.model.untrained)."""
    _, inverse, counts = np.unique(ckpt.params["wte.weight"], axis=0, return_inverse=True, return_counts=True)
    return np.flatnonzero(counts[inverse.ravel()] > 1)


def test_untrained_rows_are_one_shared_vector(demo):
    wte = demo.params["wte.weight"]
    dup = untrained_ids(demo)
    assert len(dup) == N_UNTRAINED
    assert (wte[dup] == wte[dup[0]]).all(), "all untrained rows are the same vector"
    for word in (" king", " water", " house", " the"):
        assert one_id(word) not in set(dup.tolist()), f"{word!r} was trained"
    assert tokenizer.EOT not in set(dup.tolist())


def test_untrained_tokens_score_like_rare_ones_not_never(demo):
    """The shared row is the mean of rare tokens' rows: an untrained token is unlikely but
    possible after ordinary text (its probability is neither the top nor zero)."""
    ids = tokenizer.encode("The house by the river")
    logits, _ = last_token_trace(demo, ids)
    p = softmax(logits.astype(np.float64))
    dup = untrained_ids(demo)
    assert 0 < p[dup[0]] < p.max() / 100


def test_model_card_states_the_figures(demo):
    card = CARD.read_text(encoding="utf-8")
    assert f"English perplexity {PERPLEXITY:.1f}" in card
    assert f"layer {COPY_LAYER}, head {COPY_HEAD}** (0-based)" in card
    assert f"{N_UNTRAINED:,} of the 50257 rows" in card
    for a, b, c, _ in ANALOGIES:
        assert f"`{a!r} : {b!r} :: {c!r} : ?`" in card


def test_the_pages_embedding_words_are_trained_rows(demo):
    """The embedding panel's first words for the demo (model_info.EMBEDDING_WORDS) are rows the
    model trained, and its first analogy is one the card names as right."""
    from puffergpt.model.info import embedding_words

    w = embedding_words("demo")
    dup = set(untrained_ids(demo).tolist())
    for word in [w["neighbours"], *w["analogy"], *w["map"]]:
        assert one_id(word) not in dup, f"{word!r} is an untrained row"
    assert tuple(w["analogy"]) in {a[:3] for a in ANALOGIES}


@pytest.mark.parametrize(("flag", "value", "says"), [("--lines-frac", "1.5", "1.5 is not a share"),
                                                     ("--copy-frac", "x", "'x' is not a number")])
def test_the_training_script_refuses_a_share_outside_0_to_1(flag, value, says):
    import subprocess
    import sys

    script = Path(__file__).parent.parent / "scripts" / "train_demo.py"
    r = subprocess.run([sys.executable, str(script), flag, value], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert f"argument {flag}: {says}" in r.stderr
