"""Context changes meaning (``contexts.py``): one word in 2 or 3 prompts, layer by layer.
`puffergpt contexts --json` and POST /api/contexts against transformers (output_hidden_states:
hidden_states[l] is the residual entering block l; the residual entering ln_f through a hook
on ln_f, as HF's last hidden state is after it), on the demo and on a GPT-2-shaped checkpoint
(the tiny preset); bad inputs refused with a message naming the problem; the requests counted."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from puffergpt.cli import main
from puffergpt.lens import contexts
from puffergpt.model import info as model_info
from puffergpt.model import tokenizer
from puffergpt.model.reference import NumpyProducts
from puffergpt.search.manifest import open_engine
from puffergpt.server import create_app
from puffergpt.texts.text import TextError

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
transformers = pytest.importorskip("transformers")

MOLE, BANK = ((s["word"], s["prompts"]) for s in model_info.context_starters())
TOL = 1e-3  # the contract's bound; measured: see the assertion messages


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
        contexts.contexts(lambda: NumpyProducts(tiny), tiny.config, " mole", ["a mole", far])


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


def test_info_names_the_context_starters(client):
    """The page's starters: each word one token, in every one of its prompts."""
    starters = client.get("/api/info").json()["context_starters"]
    assert [s["word"] for s in starters] == [" mole", " bank"]
    for s in starters:
        asked = contexts.check(s["word"], s["prompts"])
        assert len(asked.positions) == len(s["prompts"])
