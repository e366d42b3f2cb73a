"""Every probability the model's own, and what a head writes (issue 41), against transformers:

- each candidate's ``p_all``, its probability over the whole vocabulary at T = 1, from one search over every
  token vector, counted and marked extra; the sampler's ``prob`` stays a softmax over the top k;
- ``writes``: head L.H's pieces a_j v_j W_O^h read against the next token through ln_f (hooks on c_attn, the
  attention weights and ln_f's input), summing to the attribution's part for that head."""

import json

import numpy as np
import pytest

from helpers import open_run_for
from puffergpt.app import completion
from puffergpt.cli import main
from puffergpt.lens import attribution, inspector, writes
from puffergpt.model import tokenizer
from puffergpt.model.sampling import Sampling
from puffergpt.texts import probabilities
from puffergpt.texts.text import Text, TextError, opened

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")

COPY = "a = 7\nb = 3\nc = 9\na = 7\nb ="  # the demo's copy starter: L2 H2 copies " 3"
PROMPTS = [COPY, "He said that she"]


def f64(t):
    return t.detach().double().numpy()


def hf_logits(m, ids) -> np.ndarray:
    with torch.no_grad():
        return f64(m(torch.tensor([ids])).logits[0, -1])


def softmax(x, t=1.0):
    e = np.exp((x - x.max()) / t)
    return e / e.sum()


@pytest.mark.parametrize("kind", ["search", "numpy"])
@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_p_all_is_transformers_softmax_over_the_whole_vocabulary(request, hf, loaded, kind, model):
    ckpt = request.getfixturevalue(model)
    m = hf(ckpt)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        steps = list(completion.complete(open_run_for(kind, loaded, ckpt), ids, 2, Sampling(0.7, 10, seed=3),
                                         over_all=True))
        for i, step in enumerate(steps):
            want = softmax(hf_logits(m, ids + [s.token_id for s in steps[:i]]))
            want_t = softmax(np.log(want), 0.7)
            c = step.candidates()
            got = np.array([x["p_all"] for x in c])
            top = [x["token_id"] for x in c]
            d = np.abs(got - want[top]).max()
            print(f"{model}/{kind} {prompt!r} step {i}: p_all max |diff| {d:.2e}")
            assert d <= 1e-5, f"{model}/{kind}: p_all differs from transformers by {d:.3g}"
            assert np.abs(np.array([x["p_all_t"] for x in c]) - want_t[top]).max() <= 1e-5
            assert got.sum() <= 1 + 1e-9 and got.sum() == pytest.approx(want[top].sum(), abs=1e-5)
            probs = np.array([x["prob"] for x in c])  # the sampler's: over the top k, unchanged
            assert probs.sum() == pytest.approx(1) and np.allclose(probs, softmax(step.logits, 0.7))
            assert step.logprob == pytest.approx(np.log(want[step.token_id]), abs=1e-4)
            if kind == "search":  # one more search, over every token vector, in the step's log and marked extra
                last = step.requests[-1]
                assert last.kind == "wte.all" and last.extra and last.rows == ckpt.config.n_vocab


def test_normalise_once_a_step_and_bad_positions(demo, loaded):
    store, key = loaded(demo)
    from puffergpt.search.manifest import open_engine

    t = Text(open_engine(store, demo.name, key).open())
    try:
        ids = tokenizer.encode(COPY)
        t.append(ids)
        list(t.generate(2, Sampling(0, 40)))
        p = len(ids)
        assert "p_all" not in t.steps[p].candidates()[0]
        reqs = probabilities.normalise(t, p)
        assert [r.kind for r in reqs] == ["wte.all"] and reqs[0].extra
        assert probabilities.normalise(t, p) == []  # kept on the step
        c = t.steps[p].candidates()
        assert c[0]["p_all"] <= 1 and c[0]["p_all_t"] == 1.0  # generated at T = 0
        for bad, words in ((0, "outside"), (3, "no candidates"), (99, "outside"), (True, "outside")):
            with pytest.raises(TextError, match=words):
                probabilities.normalise(t, bad)
    finally:
        t.close()


def hf_writes(m, ids, layer, head, c) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """transformers' pieces' effects on token c's logit, the head's weights and each piece read through ln_f
    (e_j is it . wte[c]), from hooks on c_attn's output and ln_f's input and the attention weights:
    (S,), (S,), (S, C)"""
    got = {}
    block = m.transformer.h[layer]
    hooks = [block.attn.c_attn.register_forward_hook(lambda mod, a, out: got.__setitem__("qkv", out[0])),
             m.transformer.ln_f.register_forward_pre_hook(lambda mod, a: got.__setitem__("x", a[0][0, -1]))]
    try:
        with torch.no_grad():
            out = m(torch.tensor([ids]), output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    C, H = m.config.n_embd, m.config.n_head
    hd = C // H
    a = f64(out.attentions[layer][0, head, -1])  # (S,)
    v = f64(got["qkv"])[:, 2 * C + head * hd: 2 * C + (head + 1) * hd]  # (S, hd)
    W = f64(block.attn.c_proj.weight)[head * hd:(head + 1) * hd]  # Conv1D: (in, out), the head's rows
    x, g = f64(got["x"]), f64(m.transformer.ln_f.weight)
    s = np.sqrt(x.var() + m.transformer.ln_f.eps)
    pieces = a[:, None] * v @ W  # (S, C)
    w = f64(m.transformer.wte.weight[c])
    queries = (pieces - pieces.mean(axis=-1, keepdims=True)) / s * g
    return queries @ w, a, queries


@pytest.mark.parametrize("kind", ["search", "numpy"])
@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_writes_is_transformers_and_sums_to_the_heads_part(request, hf, loaded, kind, model):
    ckpt = request.getfixturevalue(model)
    m, cfg = hf(ckpt), ckpt.config
    wte = ckpt.params["wte.weight"].astype(np.float64)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        c = int(np.argmax(hf_logits(m, ids)))  # the greedy next token
        with opened(open_run_for(kind, loaded, ckpt), ids) as text:
            text.read()
            for layer, head in {(min(2, cfg.n_layer - 1), 2), (cfg.n_layer - 1, cfg.n_head - 1), (0, 0)}:
                got, reqs = inspector.head_writes(text, len(ids), f"{layer}.{head}")
                name = f"{model}/{kind} {prompt!r} L{layer} H{head}"
                assert got["token_id"] == c and got["position"] == len(ids) - 1
                assert [s["position"] for s in got["sources"]] == list(range(len(ids)))
                want, a, queries = hf_writes(m, ids, layer, head, c)
                effects = np.array([s["effect"] for s in got["sources"]])
                d = np.abs(effects - want).max()
                print(f"{name}: effects max |diff| {d:.2e}")
                assert d <= 1e-3, f"{name}: effects differ from transformers by {d:.3g}"
                assert np.abs(np.array([s["weight"] for s in got["sources"]]) - a).max() <= 1e-5
                assert got["total"] == pytest.approx(effects.sum(), abs=1e-9)
                ins, _, _ = inspector.inspect(text, len(ids), 5)
                part = next(p["value"] for p in ins["attribution"]["parts"]
                            if p["kind"] == "attn" and (p["layer"], p["head"]) == (layer, head))
                assert ins["attribution"]["token_id"] == c
                assert abs(got["total"] - part) <= 1e-4, f"{name}: total {got['total']} vs the part {part}"
                # Each piece's top: every token ranked by the same expression with its own wte row.
                for src, u in zip(got["sources"], queries, strict=True):
                    scores = wte @ u  # (V,)
                    fifth = np.sort(scores)[-writes.TOP]
                    assert len(src["top"]) == writes.TOP
                    assert max(abs(v - scores[t]) for t, v in src["top"]) <= 1e-3, name
                    assert min(scores[t] for t, _ in src["top"]) >= fifth - 1e-3, f"{name}: not the top 5"
                if kind == "search":
                    assert [r.kind for r in reqs][-3:] == [f"h.{layer}.attn.c_proj", "wte.fetch", "wte.writes"]
                    assert all(r.extra for r in reqs) and reqs[-3].queries == len(ids) + 1
                    assert reqs[-1].queries == len(ids)


def test_the_copy_starters_l2_h2_writes_3(demo):
    with opened(open_run_for("numpy", None, demo), tokenizer.encode(COPY)) as text:
        text.read()
        got, _ = inspector.head_writes(text, text.length, "2.2")
    three = tokenizer.encode(" 3")[0]
    best = max(got["sources"], key=lambda s: s["effect"])
    assert got["token_id"] == three and tokenizer.token_text(tokenizer.encode(COPY)[best["position"]]) == " 3"
    assert best["weight"] > 0.9 and best["top"][0][0] == three and best["effect"] > 1


@pytest.mark.parametrize("spec, words", [("4.0", ["layers 0..3", "heads 0..5"]), ("2.6", ["heads 0..5"]),
                                          ("2", ["not a head", "L.H"]), ("a.b", ["not a head"]),
                                          ("-1.0", ["not a head"])])
def test_a_head_out_of_range_names_the_models_layers_and_heads(demo, spec, words):
    with pytest.raises(ValueError) as e:
        writes.head_of(spec, demo.config.n_layer, demo.config.n_head)
    for w in words:
        assert w in str(e.value)


def test_writes_cli_json_contract(demo):
    from click.testing import CliRunner

    r = CliRunner().invoke(main, ["writes", "--model", "demo", "--engine", "reference", "--json", "2.2", COPY],
                           env={"PUFFERGPT_DATA": None})
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert set(got) == {"token_id", "position", "sources", "total"}
    assert got["token_id"] == tokenizer.encode(" 3")[0] and got["position"] == len(tokenizer.encode(COPY)) - 1
    assert all(set(s) == {"position", "weight", "effect", "top"} and len(s["top"]) == 5 for s in got["sources"])
    assert got["total"] == pytest.approx(sum(s["effect"] for s in got["sources"]), abs=1e-9)
    bad = CliRunner().invoke(main, ["writes", "--model", "demo", "--engine", "reference", "7.1", COPY],
                             env={"PUFFERGPT_DATA": None})
    assert bad.exit_code != 0 and "Traceback" not in bad.output
    assert "layers 0..3" in bad.output and "heads 0..5" in bad.output
    assert attribution.label({"kind": "attn", "layer": 2, "head": 2}) == "L2 H2"


def test_the_routes_give_p_all_and_a_heads_writes(demo, loaded):
    """The page's routes: a step's probabilities over all tokens (one search, then kept), and what L2 H2 writes
    at the copy starter's " 3" (its pieces summing to the head's bar in the attribution); bad input by name."""
    from fastapi.testclient import TestClient

    from puffergpt.search.manifest import open_engine
    from puffergpt.server import ServerConfig, create_app

    store, key = loaded(demo)
    with TestClient(create_app(open_engine(store, demo.name, key), ServerConfig(max_open_texts=2))) as client:
        t = client.post("/api/texts", json={"prompt": COPY}).json()
        p = t["length"]
        client.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 1, "temperature": 0, "top_k": 40})
        got = client.post(f"/api/texts/{t['id']}/steps/{p}/probabilities", json={})
        assert got.status_code == 200, got.text
        got = got.json()
        assert [r["kind"] for r in got["requests"]] == ["wte.all"] and got["requests"][0]["extra"]
        assert got["n_vocab"] == demo.config.n_vocab and len(got["candidates"]) == 40
        assert 0 < got["mass"] <= 1 and got["mass"] == pytest.approx(sum(c["p_all"] for c in got["candidates"]))
        assert [t_ for t_, _ in got["normalisers"]][:3] == [0.0, 0.05, 0.1]
        again = client.post(f"/api/texts/{t['id']}/steps/{p}/probabilities", json={}).json()
        assert again["requests"] == [] and again["candidates"] == got["candidates"]
        step = client.get(f"/api/texts/{t['id']}").json()["steps"][str(p)]
        assert step["candidates"][0]["p_all"] == got["candidates"][0]["p_all"]
        w = client.post(f"/api/texts/{t['id']}/steps/{p}/writes", json={"head": "2.2"})
        assert w.status_code == 200, w.text
        w = w.json()
        assert w["token"]["text"] == " 3" and (w["layer"], w["head"], w["position"]) == (2, 2, p - 1)
        best = max(w["sources"], key=lambda s: s["effect"])
        assert best["token"]["text"] == " 3" and best["top"][0]["text"] == " 3"
        ins = client.get(f"/api/texts/{t['id']}/steps/{p}/inspect").json()
        bar = next(x["value"] for x in ins["attribution"]["parts"] if x["label"] == "L2 H2")
        assert abs(w["total"] - bar) <= 1e-4
        for body, words in (({"head": "4.0"}, "layers 0..3"), ({"head": "x"}, "not a head")):
            r = client.post(f"/api/texts/{t['id']}/steps/{p}/writes", json=body)
            assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
        r = client.post(f"/api/texts/{t['id']}/steps/2/probabilities", json={})
        assert r.status_code == 400 and "no candidates" in r.json()["error"]["message"]
        assert client.post(f"/api/texts/{t['id']}/steps/{p}/writes", json={"head": "1" * 40}).status_code == 422
