"""What each part adds to the next token (direct logit attribution) and the MLP as a
memory (top neurons and the tokens they promote), through search and numpy, against
transformers with hooks: attn.c_proj's input (each head's output), mlp, mlp.act and
ln_f's input."""

import json

import numpy as np
import pytest

from helpers import assert_close, products_for
from puffergpt import attribution, completion, inside, inspector, tokenizer
from puffergpt.loading import open_engine
from puffergpt.reference import NumpyProducts
from puffergpt.sampling import Sampling
from puffergpt.text import Text

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
transformers = pytest.importorskip("transformers")

PROMPTS = ["The list of built-in functions", "x = 1\ny = 2\nx = 1\ny ="]
TOL = 1e-3  # the contract: equal to transformers within 1e-3


def hf_parts(m, ids, c):
    """transformers' own attribution of token c at the last position of ids, from hooks,
    in float64: {"embed", ("attn", l, h), ("attn_bias", l), ("mlp", l), "ln_f_bias"} -> value,
    the logit, and per layer the activations (4C,) and mlp.c_proj's weight (4C, C)."""
    cfg = m.config
    L, H, C = cfg.n_layer, cfg.n_head, cfg.n_embd
    hd = C // H
    got = {"z": {}, "mlp": {}, "act": {}}
    hooks = []
    for l, block in enumerate(m.transformer.h):
        hooks.append(block.attn.c_proj.register_forward_pre_hook(
            lambda mod, a, l=l: got["z"].__setitem__(l, a[0][0, -1])))
        hooks.append(block.mlp.register_forward_hook(lambda mod, a, out, l=l: got["mlp"].__setitem__(l, out[0, -1])))
        hooks.append(block.mlp.act.register_forward_hook(
            lambda mod, a, out, l=l: got["act"].__setitem__(l, out[0, -1])))
    hooks.append(m.transformer.ln_f.register_forward_pre_hook(lambda mod, a: got.__setitem__("x", a[0][0, -1])))
    try:
        with torch.no_grad():
            out = m(torch.tensor([ids]), output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()

    def f64(t):
        return t.detach().double().numpy()

    ln_f = m.transformer.ln_f
    x, g, b = f64(got["x"]), f64(ln_f.weight), f64(ln_f.bias)
    w = f64(m.transformer.wte.weight[c])
    s = np.sqrt(x.var() + ln_f.eps)

    def value(p):
        return float(((p - p.mean()) / s * g) @ w)

    parts = {"embed": value(f64(out.hidden_states[0][0, -1]))}
    for l, block in enumerate(m.transformer.h):
        W, bias = f64(block.attn.c_proj.weight), f64(block.attn.c_proj.bias)  # Conv1D: (in, out)
        z = f64(got["z"][l])
        for h in range(H):
            parts[("attn", l, h)] = value(z[h * hd:(h + 1) * hd] @ W[h * hd:(h + 1) * hd])
        parts[("attn_bias", l)] = value(bias)
        parts[("mlp", l)] = value(f64(got["mlp"][l]))
    parts["ln_f_bias"] = float(b @ w)
    acts = [f64(got["act"][l]) for l in range(L)]
    c_proj = [f64(block.mlp.c_proj.weight) for block in m.transformer.h]  # (4C, C): row n is what neuron n writes
    return parts, float(out.logits[0, -1, c]), acts, c_proj, f64(m.transformer.wte.weight)


def key(part):
    return {"embed": "embed", "ln_f_bias": "ln_f_bias"}.get(part["kind"]) or (
        (part["kind"], part["layer"], part["head"]) if part["kind"] == "attn" else (part["kind"], part["layer"]))


def check(name, m, ckpt, ids, got: dict) -> dict:
    """got["attribution"] and got["neurons"] against transformers; the max differences."""
    a = got["attribution"]
    want, logit, acts, c_proj, wte = hf_parts(m, ids, a["token_id"])
    c = ckpt.config
    assert [key(p) for p in a["parts"]] == list(want), f"{name}: the parts, in order"
    assert len(a["parts"]) == 2 + c.n_layer * (c.n_head + 2)
    diffs = {"parts": max(abs(p["value"] - want[key(p)]) for p in a["parts"]),
             "logit": abs(a["logit"] - logit), "sum": abs(sum(p["value"] for p in a["parts"]) - logit)}
    assert len(got["neurons"]) == c.n_layer
    d_act = d_score = 0.0
    for l, layer in enumerate(got["neurons"]):
        assert len(layer) >= 5
        top = np.argsort(-acts[l], kind="stable")[: len(layer)]
        assert [n["neuron"] for n in layer] == list(top), f"{name}: layer {l}'s top neurons"
        d_act = max(d_act, max(abs(n["activation"] - acts[l][n["neuron"]]) for n in layer))
        for n in layer:
            assert len(n["promotes"]) >= 5
            scores = wte @ c_proj[l][n["neuron"]]  # (V,)
            want_ids = np.argsort(-scores, kind="stable")[: len(n["promotes"])]
            assert [t["token_id"] for t in n["promotes"]] == list(want_ids), \
                f"{name}: layer {l} neuron {n['neuron']} promotes"
            d_score = max(d_score, max(abs(t["score"] - scores[t["token_id"]]) for t in n["promotes"]))
    diffs |= {"activation": d_act, "promote score": d_score}
    print(f"{name}: max differences {', '.join(f'{k} {v:.2e}' for k, v in diffs.items())}")
    for k, v in diffs.items():
        assert v <= TOL, f"{name}: {k} differs from transformers by {v:.3g}"
    return diffs


@pytest.mark.parametrize("kind", ["search", "numpy"])
@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_generate_explains_each_token_as_transformers(request, hf, loaded, kind, model):
    """The chosen token (greedy: the final top-1) of each step, as `generate --json --inspect` gives it."""
    ckpt = request.getfixturevalue(model)
    m = hf(ckpt)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        steps = list(completion.complete(products_for(kind, loaded, ckpt), ids, 2, Sampling(0, 40), inspect=5,
                                         explain=True))
        for i, step in enumerate(steps):
            upto = ids + [s.token_id for s in steps[:i]]
            assert step.inspect["attribution"]["token_id"] == step.token_id
            check(f"{model}/{kind} {prompt!r} step {i}", m, ckpt, upto, step.inspect)


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_inspect_explains_the_token_that_is_there(request, hf, loaded, model):
    """On demand, at a prompt position: the attribution is of the token the text has there
    (not the model's top-1), and every request it cost is in the log, marked extra: one
    fetch of wte[c], one search a layer for the heads, one a layer for the neurons' rows,
    one top-k over wte for every neuron."""
    ckpt = request.getfixturevalue(model)
    store, key_ = loaded(ckpt)
    c = ckpt.config
    t = Text(open_engine(store, ckpt.name, key_).open())
    try:
        ids = tokenizer.encode(PROMPTS[0])
        t.append(ids)
        list(t.generate(1, Sampling(0, 40)))
        p = 3
        got, reqs, _ = inspector.inspect(t, p, 5)
        assert got["attribution"]["token_id"] == ids[p]
        check(f"{model} inspect at {p}", hf(ckpt), ckpt, ids[:p], got)
        kinds = [r.kind for r in reqs]
        mine = reqs[kinds.index("wte.fetch"):]  # after the token's forward pass again and its lens
        assert [r.kind for r in mine] == (["wte.fetch"] + [f"h.{l}.attn.c_proj" for l in range(c.n_layer)]
                                          + [f"h.{l}.mlp.c_proj" for l in range(c.n_layer)] + ["wte.promotes"])
        assert all(r.extra for r in reqs)
        heads = [r for r in mine if r.kind.endswith("attn.c_proj")]
        assert all(r.queries == c.n_head + 1 for r in heads)  # H masked queries and the zero one (the bias)
        # Asked again: kept, no request.
        _, again, recomputed = inspector.inspect(t, p, 5)
        assert again == [] and not recomputed
        # Past the end of the text (stepped back from the token it wrote): the final top-1 is explained.
        t.step_back(t.length - 1)
        got, _, _ = inspector.inspect(t, t.length, 5)
        assert got["attribution"]["token_id"] == inside.final_top1(got["lens"])
    finally:
        t.close()


def test_numpy_and_search_make_the_same_requests_and_numbers(loaded, tiny):
    """One code path: the same parts from numpy and from the searches."""
    ids = tokenizer.encode(PROMPTS[1])
    runs = {}
    for kind in ("numpy", "search"):
        step = list(completion.complete(products_for(kind, loaded, tiny), ids, 1, Sampling(0, 40), inspect=5,
                                        explain=True))[0]
        runs[kind] = step.inspect
    a, b = runs["numpy"]["attribution"], runs["search"]["attribution"]
    assert_close("numpy vs search parts", [p["value"] for p in a["parts"]], [p["value"] for p in b["parts"]], 1e-4)

    def ids_of(got):
        return [[(n["neuron"], [t["token_id"] for t in n["promotes"]]) for n in l] for l in got["neurons"]]

    assert ids_of(runs["numpy"]) == ids_of(runs["search"])

    def acts(got):
        return [n["activation"] for l in got["neurons"] for n in l]

    assert_close("numpy vs search activations", acts(runs["numpy"]), acts(runs["search"]), 1e-4)


def test_head_writes_sum_to_the_attention_output(tiny):
    """Each head's write plus the bias is what attention added (c_proj is linear)."""
    p = NumpyProducts(tiny)
    text = Text(p)
    text.append(tokenizer.encode(PROMPTS[0]))
    got = list(inspector.generate(text, 1, Sampling(0, 40), 5))[0].inspect
    tr = got["trace"]
    for layer in range(tiny.config.n_layer):
        writes, bias = attribution.head_writes(p, layer, tr[f"h.{layer}.attn.heads"])
        assert_close(f"layer {layer} heads + bias", writes.sum(axis=0) + bias, tr[f"h.{layer}.attn.c_proj"], 1e-5)


def test_the_inspect_route_gives_the_page_its_shape(loaded, hf, demo):
    """GET /api/texts/{id}/steps/{p}/inspect: decided_layer, final_top1, the attribution
    with labels and token text, the neurons with their promoted tokens as text, and the
    new searches in its requests; the streamed steps carry decided_layer and final_top1."""
    from fastapi.testclient import TestClient

    from puffergpt.server import ServerConfig, create_app

    store, key_ = loaded(demo)
    c = demo.config
    app = create_app(open_engine(store, demo.name, key_), ServerConfig(max_open_texts=2))
    with TestClient(app) as client:
        t = client.post("/api/texts", json={"prompt": PROMPTS[0]}).json()
        n = t["length"]
        r = client.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 2, "temperature": 0, "top_k": 40,
                                                                "inspect": True, "lens_k": 5})
        token = json.loads(r.text.strip().split("\n\n")[0].split("data: ", 1)[1])
        assert isinstance(token["decided_layer"], int) and token["final_top1"]["token_id"] == token["token_id"]
        for p in (n, 3):  # a generated token (kept) and a prompt token (recomputed)
            v = client.get(f"/api/texts/{t['id']}/steps/{p}/inspect", params={"lens_k": 5}).json()
            assert {"decided_layer", "final_top1", "attribution", "neurons", "lens", "attention", "requests"} <= set(v)
            a = v["attribution"]
            assert a["token_id"] == v["predicts_token"]["token_id"]
            assert a["token"]["text"] == v["predicts_token"]["text"]
            labels = [x["label"] for x in a["parts"]]
            assert labels[0] == "embed" and labels[-1] == "ln_f bias"
            assert labels[1:c.n_head + 3] == [f"L0 H{h}" for h in range(c.n_head)] + ["L0 attn bias", "L0 MLP"]
            assert abs(sum(x["value"] for x in a["parts"]) - a["logit"]) < 1e-3
            ids = tokenizer.encode(PROMPTS[0])[:p] if p < n else tokenizer.encode(PROMPTS[0])
            check(f"demo route at {p}", hf(demo), demo, ids, {"attribution": a, "neurons": v["neurons"]})
            assert all(set(tok["token"]) >= {"token_id", "text"}
                       for layer in v["neurons"] for nn in layer for tok in nn["promotes"])
            kinds = [q["kind"] for q in v["requests"]]
            want = (["wte.fetch"] + [f"h.{l}.attn.c_proj" for l in range(c.n_layer)]
                    + [f"h.{l}.mlp.c_proj" for l in range(c.n_layer)] + ["wte.promotes"])
            assert kinds[-(2 * c.n_layer + 2):] == want
            assert all(q["extra"] for q in v["requests"])


@pytest.mark.parametrize("engine", ["reference", "search"])
def test_generate_json_inspect_contract(tmp_path_factory, tiny, tiny_dir, hf, engine):
    """`puffergpt generate --json --inspect`: each token line has attribution and neurons
    as docs/openai.md's contract says, equal to transformers within 1e-3."""
    from click.testing import CliRunner

    from puffergpt.cli import main

    args = ["--model", str(tiny_dir), "--engine", engine]
    if engine == "search":
        data = tmp_path_factory.mktemp("cli-attribution")
        assert CliRunner().invoke(main, ["load", "--model", str(tiny_dir), "--data", str(data)],
                                  env={"PUFFERGPT_DATA": None}).exit_code == 0
        args += ["--data", str(data)]
    r = CliRunner().invoke(main, ["generate", PROMPTS[1], *args, "--json", "--inspect", "--temperature", "0",
                                  "-n", "2"], env={"PUFFERGPT_DATA": None})
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    tokens = [x for x in lines if "token_id" in x and "attribution" in x]
    assert len(tokens) == 2
    ids = tokenizer.encode(PROMPTS[1])
    for i, line in enumerate(tokens):
        a = line["attribution"]
        assert set(a) == {"token_id", "logit", "parts"} and a["token_id"] == line["token_id"]
        kinds = {p["kind"] for p in a["parts"]}
        assert kinds == {"embed", "attn", "attn_bias", "mlp", "ln_f_bias"}
        assert all(set(n) == {"neuron", "activation", "promotes"} for layer in line["neurons"] for n in layer)
        assert isinstance(line["decided_layer"], int) and line["final_top1"]["token_id"] == line["token_id"]
        check(f"cli {engine} token {i}", hf(tiny), tiny, ids + [t["token_id"] for t in tokens[:i]], line)
