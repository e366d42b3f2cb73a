"""Context changes meaning (``contexts.py``): one word in 2 or 3 prompts, layer by layer, and a
control prompt (the word in the sense it has in prompt 1) whose pair is the baseline.
`puffergpt contexts --json` and POST /api/contexts against transformers (output_hidden_states:
hidden_states[l] is the residual entering block l; the residual entering ln_f through a hook
on ln_f, as HF's last hidden state is after it), on the demo and on a GPT-2-shaped checkpoint
(the tiny preset); the control pair's cosines within 1e-5 of transformers'; the word's rarity
from the model's token counts; the reading in words and the lens note from their numbers; bad
inputs refused with a message naming the problem; the requests counted."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from puffergpt.cli import main
from puffergpt.lens import contexts
from puffergpt.model import info as model_info
from puffergpt.model import token_counts, tokenizer
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.session import Run
from puffergpt.search.manifest import open_engine
from puffergpt.server import create_app
from puffergpt.texts.text import TextError

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
transformers = pytest.importorskip("transformers")

MOLE, BANK = ((s["word"], s["prompts"]) for s in model_info.context_starters("gpt2"))
MOLE_CONTROL, BANK_CONTROL = (s["control"] for s in model_info.context_starters("gpt2"))
TOL = 1e-3  # the contract's bound; measured: see the assertion messages
CONTROL_TOL = 1e-5  # the control pair's cosines (measured: about 2e-7)


def hf_contexts(m, word_id: int, prompts: list[str]) -> dict:
    """transformers on each whole prompt, at the word's first position p: the residual entering
    each block and entering ln_f (n, L + 1, C), the lens logits there (n, L + 1, V), the
    attention of p's query (n of (L, H, p + 1))."""
    res, lens, att = [], [], []
    for prompt in prompts:
        ids = tokenizer.encode(prompt)
        p = ids.index(word_id)
        seen = {}
        hook = m.transformer.ln_f.register_forward_pre_hook(lambda mod, args, seen=seen: seen.update(x=args[0]))
        try:
            with torch.no_grad():
                out = m(torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
                hs = [h[0, p] for h in out.hidden_states[:-1]] + [seen["x"][0, p]]  # the last: entering ln_f
                logits = [m.lm_head(m.transformer.ln_f(h)) for h in hs[:-1]] + [out.logits[0, p]]
        finally:
            hook.remove()
        res.append(np.stack([h.numpy() for h in hs]).astype(np.float64))
        lens.append(np.stack([x.numpy() for x in logits]))
        att.append(np.stack([a[0, :, p, : p + 1].numpy() for a in out.attentions]))
    return {"residual": np.stack(res), "lens": np.stack(lens), "attention": att}


def check_contract(name: str, got: dict, want: dict, c) -> float:
    """The contract's numbers against transformers: cosines within TOL, lens top-1 identical.
    -> the largest cosine difference."""
    assert [e["layer"] for e in got["layers"]] == list(range(c.n_layer + 1))
    worst = 0.0
    for e in got["layers"]:
        l = e["layer"]
        x = want["residual"][:, l]  # (n, C)
        norms = np.linalg.norm(x, axis=1)
        cos = x @ x.T / np.outer(norms, norms)
        worst = max(worst, float(np.abs(np.asarray(e["cosine"]) - cos).max()))
        assert e["lens"] == [int(np.argmax(v)) for v in want["lens"][:, l]], f"{name}: lens top-1 at layer {l}"
    assert worst <= TOL, f"{name}: cosine off by {worst:.2e}"
    return worst


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_cli_contexts_json_equals_transformers(request, tmp_path, hf, model):
    """The CLI on the search engine (the model loaded into a store of its own on first use):
    exactly the contract's keys, its numbers those of transformers. The demo reads the mole
    sentences (3 prompts), the GPT-2-shaped checkpoint the bank ones (2)."""
    ckpt = request.getfixturevalue(model)
    name = "demo" if model == "demo" else str(request.getfixturevalue("tiny_dir"))
    word, prompts = MOLE if model == "demo" else BANK
    r = CliRunner().invoke(main, ["contexts", "--json", "--model", name, "--data", str(tmp_path / "data"), word,
                                  *prompts], env={"PUFFERGPT_DATA": None})
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(got) == {"word_id", "positions", "layers"}
    assert all(set(e) == {"layer", "cosine", "lens"} for e in got["layers"])
    word_id = tokenizer.encode(word)[0]
    assert got["word_id"] == word_id
    assert got["positions"] == [tokenizer.encode(p).index(word_id) for p in prompts]
    n = len(prompts)
    assert all(np.asarray(e["cosine"]).shape == (n, n) and len(e["lens"]) == n for e in got["layers"])
    check_contract(f"cli {model}", got, hf_contexts(hf(ckpt), word_id, prompts), ckpt.config)


BAD = [
    ([" biopsy", "a biopsy", "the biopsy"], "' biopsy' is 2 GPT-2 tokens (' bi' + 'opsy'), not one"),
    (["mole", "a mole", "the mole"], "with its leading space, ' mole' is one token"),
    ([" mole", "American shrew mole", "Moles dig"], "prompt 2 ('Moles dig') does not contain the token ' mole'"),
    ([" mole", "American shrew mole"], "give 2 or 3 prompts that each contain ' mole', got 1"),
    ([" mole", "a mole", "b mole", "c mole", "d mole"], "got 4"),
    ([" mole", "a mole", " "], "prompt 2 is empty"),
    ([" mole", "a mole", "a" * 600 + " mole"], "prompt 2 has 605 characters, over 500"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_cli_bad_input_is_a_clear_error_before_any_model_opens(tmp_path, tiny_dir, args, message):
    data = tmp_path / "never"
    r = CliRunner().invoke(main, ["contexts", "--json", "--model", str(tiny_dir), "--data", str(data), *args],
                           env={"PUFFERGPT_DATA": None})
    assert r.exit_code != 0
    assert message in r.output, r.output
    assert "Traceback" not in r.output and not data.exists()  # refused before a store was opened


def test_a_word_past_the_context_is_refused(tiny):
    """The context bound needs the model: a word at position 200 of a 128-token model."""
    far = "a" + " a" * 199 + " mole"
    with pytest.raises(TextError, match="position 200, past the model's context of 128 tokens"):
        contexts.contexts(lambda: Run(NumpyWeights(tiny)), tiny.config, " mole", ["a mole", far])


@pytest.fixture(scope="module")
def client(loaded, demo):
    store, key = loaded(demo)
    with TestClient(create_app(open_engine(store, demo.name, key))) as c:
        yield c


def test_the_route_equals_transformers_and_counts_its_requests(client, hf, demo):
    """POST /api/contexts: the contract's numbers, each context's lens top-k (ids identical,
    logits within 1e-3) and its attention from the word (within 1e-4), all as transformers;
    each prompt costs one prefill up to the word and one lens search, marked extra."""
    word, prompts = MOLE
    r = client.post("/api/contexts", json={"word": word, "prompts": prompts, "k": 5})
    assert r.status_code == 200, r.text
    got = r.json()
    c = demo.config
    want = hf_contexts(hf(demo), got["word_id"], prompts)
    check_contract("route", got, want, c)
    for e in got["layers"]:
        for i, top in enumerate(e["top"]):
            v = want["lens"][i, e["layer"]]
            ids = np.argsort(-v, kind="stable")[:5]
            assert [t["token_id"] for t in top] == ids.tolist()
            assert np.abs(np.array([t["logit"] for t in top]) - v[ids]).max() <= 1e-3
            assert all(t["text"] == tokenizer.token_text(t["token_id"]) for t in top)
    for i, (att, p) in enumerate(zip(got["attention"], got["positions"], strict=True)):
        assert np.asarray(att).shape == (c.n_layer, c.n_head, p + 1)
        assert np.abs(np.asarray(att) - want["attention"][i]).max() <= 1e-4
    assert [x["prompt"] for x in got["contexts"]] == prompts
    assert [x["position"] for x in got["contexts"]] == got["positions"]
    assert [[t["token_id"] for t in x["tokens"]] for x in got["contexts"]] == [tokenizer.encode(p) for p in prompts]
    # A prefill up to the word: the rows' fetch, then per layer c_attn, the keys written, their
    # search (every word here has earlier tokens), c_proj, c_fc, c_proj; then the lens.
    kinds = [q["kind"] for q in got["requests"]]
    assert len(kinds) == len(prompts) * (2 + 6 * c.n_layer), kinds
    assert kinds.count("lens.top_k") == len(prompts) and all(q["extra"] for q in got["requests"])
    assert kinds[: 2 + 6 * c.n_layer] == kinds[2 + 6 * c.n_layer: 2 * (2 + 6 * c.n_layer)]


@pytest.mark.parametrize("body,status,message", [
    ({"word": " mole", "prompts": ["a mole", "b mole", "c mole", "d mole"]}, 422, "at most 3"),
    ({"word": " mole", "prompts": ["a mole"]}, 400, "give 2 or 3 prompts"),
    ({"word": " mole", "prompts": ["a mole", "b"]}, 400, "prompt 2 ('b') does not contain the token ' mole'"),
    ({"word": " biopsy", "prompts": ["a biopsy", "b biopsy"]}, 400, "2 GPT-2 tokens"),
    ({"word": " mole", "prompts": ["a mole", "x" * 501]}, 422, "prompt 2 has 501 characters"),
    ({"word": " mole", "prompts": ["a mole", "b mole"], "k": 0}, 422, "k"),
    ({"word": " mole", "prompts": ["a mole", "b mole"], "extra": 1}, 422, "extra"),
    ({"word": " mole", "prompts": "a mole"}, 422, "prompts"),
])
def test_the_route_refuses_bad_bodies_naming_the_problem(client, body, status, message):
    r = client.post("/api/contexts", json=body)
    assert r.status_code == status, r.text
    assert message in r.text


def test_info_names_the_context_starters(client, demo):
    """The page's starters, the demo's own: each word one token, in every one of its prompts and
    its control, and a word the demo's training text holds often (its token counts: never a
    rare one, whose row barely moved)."""
    starters = client.get("/api/info").json()["context_starters"]
    assert starters == model_info.context_starters("demo")
    counts = token_counts.for_model("demo", demo.config.n_vocab)
    for s in starters:
        asked = contexts.check(s["word"], s["prompts"], control=s["control"])
        assert len(asked.positions) == len(s["prompts"]) and asked.control_position is not None
        assert counts.of(asked.word_id) >= 10 * token_counts.RARE_BELOW, (s["word"], counts.of(asked.word_id))
    assert [s["word"] for s in model_info.context_starters("gpt2")] == [" mole", " bank"]  # GPT-2 keeps its own
    for s in model_info.context_starters("gpt2"):
        contexts.check(s["word"], s["prompts"], control=s["control"])


# --- the control pair, the word's rarity, the reading ---

def control_cosines(want: dict) -> np.ndarray:
    """transformers' cosine between context 1 (row 0) and the control (the last row), per layer."""
    x = want["residual"]  # (n + 1, L + 1, C)
    a, c = x[0], x[-1]
    return (a * c).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(c, axis=-1))


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_cli_control_pair_equals_transformers(request, tmp_path, hf, model):
    """--control: each layer's "control" is the cosine between context 1 and the control prompt,
    within 1e-5 of transformers', and "control_position" is the word's place in the control."""
    ckpt = request.getfixturevalue(model)
    name = "demo" if model == "demo" else str(request.getfixturevalue("tiny_dir"))
    (word, prompts), control = (MOLE, MOLE_CONTROL) if model == "demo" else (BANK, BANK_CONTROL)
    r = CliRunner().invoke(main, ["contexts", "--json", "--model", name, "--data", str(tmp_path / "data"),
                                  "--control", control, word, *prompts], env={"PUFFERGPT_DATA": None})
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert set(got) == {"word_id", "positions", "layers", "control_position"}
    assert got["control_position"] == tokenizer.encode(control).index(got["word_id"])
    want = hf_contexts(hf(ckpt), got["word_id"], prompts + [control])
    diff = np.abs(np.array([e["control"] for e in got["layers"]]) - control_cosines(want)).max()
    assert diff <= CONTROL_TOL, f"{model}: the control's cosine off by {diff:.2e}"


def test_the_route_reads_the_demos_starter_against_its_control(client, hf, demo):
    """The demo's first starter with its control: the control line within 1e-5 of transformers,
    the table's pairs as before; the reading states each line's first and last cosine and its
    gap to the control, as computed here from transformers' numbers; the word's count is the
    token counts'; the control's prompt read once more (one prefill, one lens search)."""
    s = model_info.context_starters("demo")[0]
    r = client.post("/api/contexts", json={"word": s["word"], "prompts": s["prompts"], "control": s["control"]})
    assert r.status_code == 200, r.text
    got = r.json()
    want = hf_contexts(hf(demo), got["word_id"], s["prompts"] + [s["control"]])
    control = control_cosines(want)
    assert np.abs(np.array([e["control"] for e in got["layers"]]) - control).max() <= CONTROL_TOL
    check_contract("route with a control", got, {k: v[: len(s["prompts"])] if k != "attention" else v
                                                  for k, v in want.items()}, demo.config)
    assert got["control"]["prompt"] == s["control"] and got["control"]["with"] == 0
    assert got["control"]["position"] == tokenizer.encode(s["control"]).index(got["word_id"])
    x = want["residual"]
    pair = float((x[0, -1] * x[1, -1]).sum() / np.linalg.norm(x[0, -1]) / np.linalg.norm(x[1, -1]))
    first = float((x[0, 0] * x[1, 0]).sum() / np.linalg.norm(x[0, 0]) / np.linalg.norm(x[1, 0]))
    line = next(t for t in got["reading"] if t.startswith("1·2: "))
    assert f"{first:.4f} at the embedding, {pair:.4f} entering ln_f" in line, line
    gap = control[-1] - pair
    assert gap >= contexts.APART, "the demo's starter should show its two senses apart from the control"
    assert f"ends {gap:.4f} below the control" in line, line
    assert any(t.startswith("control (") and f"{control[-1]:.4f} entering ln_f" in t for t in got["reading"])
    counts = token_counts.for_model("demo", demo.config.n_vocab)
    assert got["rarity"]["count"] == counts.of(got["word_id"]) and got["rarity"]["rare"] is False
    assert all(t["count"] == counts.of(t["token_id"]) for e in got["layers"] for top in e["top"] for t in top)
    per = 2 + 6 * demo.config.n_layer
    assert len(got["requests"]) == (len(s["prompts"]) + 1) * per  # the control's prefill and lens search too


def test_a_rare_word_is_marked_as_the_neighbours_view_marks_it(client, demo):
    """' mole' on the demo: its count and rare mark, and the note, are the neighbours view's."""
    r = client.post("/api/contexts", json={"word": MOLE[0], "prompts": MOLE[1], "control": MOLE_CONTROL})
    assert r.status_code == 200, r.text
    rarity = r.json()["rarity"]
    neighbours = client.post("/api/neighbours", json={"word": MOLE[0], "k": 5}).json()
    counts = token_counts.for_model("demo", demo.config.n_vocab)
    assert rarity["count"] == counts.of(tokenizer.encode(MOLE[0])[0]) < token_counts.RARE_BELOW
    assert rarity["rare"] is True and rarity["rare_below"] == token_counts.RARE_BELOW
    assert rarity["note"] == neighbours["rare_note"].split("; ")[0]


def test_a_control_equal_to_prompt_1_is_read_once(client, demo):
    """The same prompt asked twice is read once: the control line is 1 at every layer."""
    word, prompts = MOLE
    got = client.post("/api/contexts", json={"word": word, "prompts": prompts, "control": prompts[0]}).json()
    assert len(got["requests"]) == len(prompts) * (2 + 6 * demo.config.n_layer)
    assert all(abs(e["control"] - 1) < 1e-6 for e in got["layers"])


@pytest.mark.parametrize("body,status,message", [
    ({"word": " mole", "prompts": ["a mole", "b mole"], "control": "moles"}, 400,
     "the control prompt ('moles') does not contain the token ' mole'"),
    ({"word": " mole", "prompts": ["a mole", "b mole"], "control": " "}, 400, "the control prompt is empty"),
    ({"word": " mole", "prompts": ["a mole", "b mole"], "control": "x" * 501}, 422,
     "the control prompt has 501 characters"),
    ({"word": " mole", "prompts": ["a mole", "b mole"], "control": 3}, 422, "control"),
])
def test_the_route_refuses_a_bad_control_naming_it(client, body, status, message):
    r = client.post("/api/contexts", json=body)
    assert r.status_code == status, r.text
    assert message in r.text


def test_cli_bad_control_is_a_clear_error_before_any_model_opens(tmp_path, tiny_dir):
    data = tmp_path / "never"
    r = CliRunner().invoke(main, ["contexts", "--model", str(tiny_dir), "--data", str(data), "--control",
                                  "no such word", " mole", "a mole", "b mole"], env={"PUFFERGPT_DATA": None})
    assert r.exit_code != 0 and "the control prompt ('no such word') does not contain the token ' mole'" in r.output
    assert "Traceback" not in r.output and not data.exists()


def test_cli_text_says_the_count_the_control_and_the_reading(tmp_path):
    """The text output on the numpy reference: the word's count, a control column, the reading."""
    s = model_info.context_starters("demo")[1]
    r = CliRunner().invoke(main, ["contexts", "--model", "demo", "--engine", "reference", "--control", s["control"],
                                  s["word"], *s["prompts"]], env={"PUFFERGPT_DATA": None})
    assert r.exit_code == 0, r.output
    counts = token_counts.for_model("demo", 50257)
    assert f"seen {counts.of(tokenizer.encode(s['word'])[0]):,} times in training" in r.output
    assert "cos 1-C" in r.output and "control (1 and the control prompt" in r.output and "1·2: " in r.output


def layers_of(pairs: list[tuple[float, float]], control: tuple[float, float] | None = None) -> list[dict]:
    """Two layers (the embedding, entering ln_f) of two contexts: (first, last) cosine of the pair."""
    (c0, c1), = pairs
    out = [{"layer": 0, "cosine": [[1, c0], [c0, 1]], "lens": [0, 0]}, {"layer": 1, "cosine": [[1, c1], [c1, 1]],
                                                                         "lens": [0, 0]}]
    if control is not None:
        out[0]["control"], out[1]["control"] = control
    return out


@pytest.mark.parametrize("pair,control,says", [
    ((0.9, 0.6), (0.95, 0.9), ["falling (-0.3000)", "ends 0.3000 below the control", "A falling line"]),
    ((0.7, 0.8), (0.7, 0.82), ["rising (+0.1000)", "within 0.05 of the control (-0.0200)", "A rising line",
                               "read it against the control's line"]),
    ((0.7, 0.95), (0.7, 0.8), ["rising (+0.2500)", "ends 0.1500 above the control", "try a closer control"]),
    ((0.9, 0.91), None, ["flat (+0.0100)", "No control: a cosine alone has no baseline"]),
])
def test_the_reading_states_what_the_numbers_say(pair, control, says):
    """The words follow the numbers: a rise, a fall, flat; below, above or within the control."""
    lines = contexts.reading(layers_of([pair], control), 2, " bank")
    text = "\n".join(lines)
    for s in says:
        assert s in text, (s, lines)
    if control is None:
        assert "A rising line" not in text and "A falling line" not in text
    else:
        assert lines[0].startswith("control (1 and the control prompt, ' bank' in the same sense): "
                                   f"{control[0]:.4f} at the embedding, {control[1]:.4f} entering ln_f")


def test_the_lens_note_is_there_only_where_every_top1_is_filler(demo):
    """Said where every context's top-1 from layer 1 on is punctuation or among the most-seen
    tokens (with each one's count and rank), and not where one is a word of its own."""
    counts = token_counts.for_model("demo", demo.config.n_vocab)
    comma, of, plant = (tokenizer.encode(w)[0] for w in (",", " of", " plant"))
    layers = [{"layer": 0, "lens": [plant, plant]}, {"layer": 1, "lens": [comma, of]},
              {"layer": 2, "lens": [of, comma]}]
    note = contexts.lens_note(layers, 2, counts, 4)
    rank = int((counts.counts > counts.of(of)).sum()) + 1
    assert note and f"' of' (seen {counts.of(of):,} times, rank {rank})" in note and "4 layers" in note
    assert contexts.lens_note(layers, 2, None, 4) is None  # ' of' is a word: without counts, only punctuation
    layers[2]["lens"] = [plant, comma]
    assert contexts.lens_note(layers, 2, counts, 4) is None
    assert contexts.lens_note(layers[:1] + [{"layer": 1, "lens": [comma, comma]}] * 2, 2, None, 4).startswith(
        "From layer 1 on, every context's lens top-1 is punctuation: ','")
