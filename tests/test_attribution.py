"""What each part adds to the next token (direct logit attribution) and the MLP as a
memory (top neurons and the tokens they promote), through search and numpy, against
transformers with hooks: attn.c_proj's input (each head's output), mlp, mlp.act and
ln_f's input."""

import json

import numpy as np
import pytest

from helpers import assert_close, message, open_run_for
from puffergpt.app import completion
from puffergpt.lens import attribution, inside, inspector
from puffergpt.model import tokenizer
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.search.manifest import open_engine
from puffergpt.texts.text import Text, TextError

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
transformers = pytest.importorskip("transformers")

PROMPTS = ["The list of built-in functions", "x = 1\ny = 2\nx = 1\ny ="]
TOL = 1e-3  # the contract: equal to transformers within 1e-3


def f64(t):
    return t.detach().double().numpy()


def hf_run(m, ids) -> dict:
    """transformers' forward of ids with hooks on attn.c_proj's input (each head's output),
    mlp, mlp.act and ln_f's input: what the last position went through, float64."""
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
    L = len(m.transformer.h)
    return {"z": [f64(got["z"][l]) for l in range(L)], "mlp": [f64(got["mlp"][l]) for l in range(L)],
            "act": [f64(got["act"][l]) for l in range(L)], "x": f64(got["x"]),
            "embed": f64(out.hidden_states[0][0, -1]), "logits": f64(out.logits[0, -1])}


def hf_parts(m, run, c):
    """transformers' own attribution of token c at the run's last position: {"embed", ("attn",
    l, h), ("attn_bias", l), ("mlp", l), "ln_f_bias"} -> value; the logit; and each layer's
    neurons' pushes on c (activation x c_proj's row read through ln_f), all 4C of them."""
    H = m.config.n_head
    hd = m.config.n_embd // H
    ln_f = m.transformer.ln_f
    x, g, b = run["x"], f64(ln_f.weight), f64(ln_f.bias)
    w = f64(m.transformer.wte.weight[c])
    s = np.sqrt(x.var() + ln_f.eps)

    def value(p):  # (..., C) -> (...)
        return ((p - p.mean(axis=-1, keepdims=True)) / s * g) @ w

    parts = {"embed": float(value(run["embed"]))}
    pushes = []
    for l, block in enumerate(m.transformer.h):
        W, bias = f64(block.attn.c_proj.weight), f64(block.attn.c_proj.bias)  # Conv1D: (in, out)
        z = run["z"][l]
        for h in range(H):
            parts[("attn", l, h)] = float(value(z[h * hd:(h + 1) * hd] @ W[h * hd:(h + 1) * hd]))
        parts[("attn_bias", l)] = float(value(bias))
        parts[("mlp", l)] = float(value(run["mlp"][l]))
        pushes.append(run["act"][l] * value(f64(block.mlp.c_proj.weight)))  # (4C,): row n is what neuron n writes
    parts["ln_f_bias"] = float(b @ w)
    return parts, float(run["logits"][c]), pushes


def key(part):
    return {"embed": "embed", "ln_f_bias": "ln_f_bias"}.get(part["kind"]) or (
        (part["kind"], part["layer"], part["head"]) if part["kind"] == "attn" else (part["kind"], part["layer"]))


def check_neurons(name, m, run, pushes, got: dict) -> dict:
    """Both rankings of the neurons, their activations, pushes and promoted tokens, against
    transformers: the max differences."""
    wte = f64(m.transformer.wte.weight)
    d = {"activation": 0.0, "push": 0.0, "promote score": 0.0}
    for way, ranked in (("neurons", run["act"]), ("pushing", pushes)):
        if way == "pushing" and got.get("pushing") is None:  # not asked for
            continue
        assert len(got[way]) == len(m.transformer.h)
        for l, layer in enumerate(got[way]):
            assert len(layer) >= 5
            top = np.argsort(-ranked[l], kind="stable")[: len(layer)]
            assert [n["neuron"] for n in layer] == list(top), f"{name}: layer {l}'s {way}"
            c_proj = f64(m.transformer.h[l].mlp.c_proj.weight)
            for n in layer:
                d["activation"] = max(d["activation"], abs(n["activation"] - run["act"][l][n["neuron"]]))
                d["push"] = max(d["push"], abs(n["push"] - pushes[l][n["neuron"]]))
                assert len(n["promotes"]) >= 5
                scores = wte @ c_proj[n["neuron"]]  # (V,)
                want_ids = np.argsort(-scores, kind="stable")[: len(n["promotes"])]
                assert [t["token_id"] for t in n["promotes"]] == list(want_ids), \
                    f"{name}: layer {l} neuron {n['neuron']} promotes"
                d["promote score"] = max(d["promote score"],
                                         max(abs(t["score"] - scores[t["token_id"]]) for t in n["promotes"]))
    return d


def check(name, m, ckpt, ids, got: dict, runner_up: bool = False) -> dict:
    """got["attribution"] (and its versus), got["neurons"] and got["pushing"] (where asked for)
    against transformers; with ``runner_up``, the versus is the second-highest logit. The max
    differences."""
    a, v = got["attribution"], got["attribution"]["versus"]
    run = hf_run(m, ids)
    want, logit, pushes = hf_parts(m, run, a["token_id"])
    other, other_logit, _ = hf_parts(m, run, v["token_id"])
    c = ckpt.config
    assert [key(p) for p in a["parts"]] == list(want), f"{name}: the parts, in order"
    assert [key(p) for p in v["parts"]] == list(want), f"{name}: the versus's parts, in order"
    assert len(a["parts"]) == 2 + c.n_layer * (c.n_head + 2)
    if runner_up:
        order = [int(i) for i in np.argsort(-run["logits"], kind="stable") if int(i) != a["token_id"]]
        assert v["token_id"] == order[0], f"{name}: the versus is the runner-up"
    diffs = {"parts": max(abs(p["value"] - want[key(p)]) for p in a["parts"]),
             "logit": abs(a["logit"] - logit), "sum": abs(sum(p["value"] for p in a["parts"]) - logit),
             "versus parts": max(abs(p["value"] - (want[key(p)] - other[key(p)])) for p in v["parts"]),
             "versus logit": abs(v["logit"] - other_logit),
             "versus sum": abs(sum(p["value"] for p in v["parts"]) - (logit - other_logit))}
    assert abs(sum(p["value"] for p in v["parts"]) - (a["logit"] - v["logit"])) <= 1e-4, \
        f"{name}: the versus's parts sum to the difference of its own logits"
    diffs |= check_neurons(name, m, run, pushes, got)
    print(f"{name}: max differences {', '.join(f'{k} {v:.2e}' for k, v in diffs.items())}")
    for k, x in diffs.items():
        bound = 1e-4 if k == "versus sum" else TOL
        assert x <= bound, f"{name}: {k} differs from transformers by {x:.3g}"
    return diffs


@pytest.mark.parametrize("kind", ["search", "numpy"])
@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_generate_explains_each_token_as_transformers(request, hf, loaded, kind, model):
    """The chosen token (greedy: the final top-1) of each step, as `generate --json --inspect` gives it."""
    ckpt = request.getfixturevalue(model)
    m = hf(ckpt)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        steps = list(completion.complete(open_run_for(kind, loaded, ckpt), ids, 2, Sampling(0, 40), inspect=5,
                                         explain=True))
        for i, step in enumerate(steps):
            upto = ids + [s.token_id for s in steps[:i]]
            assert step.inspect["attribution"]["token_id"] == step.token_id
            check(f"{model}/{kind} {prompt!r} step {i}", m, ckpt, upto, step.inspect, runner_up=True)


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_inspect_explains_the_token_that_is_there(request, hf, loaded, model):
    """On demand, at a prompt position: the attribution is of the token the text has there
    (not the model's top-1), and every request it cost is in the log, marked extra: one
    fetch of wte[c] and wte[r], one search a layer for the heads, one a layer for every
    neuron's row, one top-k over wte for every neuron shown. Another versus costs the
    fetch and the heads' searches again, and nothing for the neurons."""
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
        rows = [r for r in mine if r.kind.endswith("mlp.c_proj")]
        assert all(r.queries == attribution.NEURONS + 1 for r in rows)  # a one-hot query a neuron listed, a zero one
        assert mine[0].rows == 2  # wte[c] and wte[r], one fetch
        assert got["pushing"] is None
        # Asked again: kept, no request.
        _, again, recomputed = inspector.inspect(t, p, 5)
        assert again == [] and not recomputed
        # The neurons pushing the token most: every neuron's row, a search a layer; the attribution kept.
        got, again, _ = inspector.inspect(t, p, 5, pushing=True)
        assert [r.kind for r in again] == (["wte.fetch"] + [f"h.{l}.mlp.c_proj" for l in range(c.n_layer)]
                                           + ["wte.promotes"])
        assert all(r.queries == 4 * c.n_embd + 1 for r in again[1:-1])  # a one-hot query a neuron and the zero one
        assert again[-1].queries == 2 * attribution.NEURONS * c.n_layer
        check(f"{model} inspect at {p}, pushing", hf(ckpt), ckpt, ids[:p], got)
        # Why this token and not the lens's fourth: the attribution again, the neurons kept.
        other = int(got["lens"][-1]["ids"][3])
        got, again, _ = inspector.inspect(t, p, 5, versus=other)
        assert [r.kind for r in again] == ["wte.fetch"] + [f"h.{l}.attn.c_proj" for l in range(c.n_layer)]
        assert got["attribution"]["versus"]["token_id"] == other
        check(f"{model} inspect at {p} versus {other}", hf(ckpt), ckpt, ids[:p], got)
        with pytest.raises(TextError, match="versus: token id -1 is outside the vocabulary"):
            inspector.inspect(t, p, 5, versus=-1)
        # Past the end of the text (stepped back from the token it wrote): the final top-1 is explained.
        t.step_back(t.length - 1)
        got, _, _ = inspector.inspect(t, t.length, 5)
        assert got["attribution"]["token_id"] == inside.final_top1(got["lens"])
    finally:
        t.close()


def test_numpy_and_search_make_the_same_requests_and_numbers(loaded, tiny):
    """One code path: the same parts, versus and neurons both ways from numpy and from the searches."""
    ids = tokenizer.encode(PROMPTS[1])
    runs = {}
    for kind in ("numpy", "search"):
        t = Text(open_run_for(kind, loaded, tiny)())
        try:
            t.append(ids)
            list(inspector.generate(t, 1, Sampling(0, 40), 5))
            runs[kind] = inspector.inspect(t, len(ids), 5, pushing=True)[0]
        finally:
            t.close()
    a, b = runs["numpy"]["attribution"], runs["search"]["attribution"]
    assert_close("numpy vs search parts", [p["value"] for p in a["parts"]], [p["value"] for p in b["parts"]], 1e-4)
    assert a["versus"]["token_id"] == b["versus"]["token_id"]
    assert_close("numpy vs search versus parts", [p["value"] for p in a["versus"]["parts"]],
                 [p["value"] for p in b["versus"]["parts"]], 1e-4)

    def ids_of(got, way):
        return [[(n["neuron"], [t["token_id"] for t in n["promotes"]]) for n in l] for l in got[way]]

    def values(got, way):
        return [x for l in got[way] for n in l for x in (n["activation"], n["push"])]

    for way in ("neurons", "pushing"):
        assert ids_of(runs["numpy"], way) == ids_of(runs["search"], way), way
        assert_close(f"numpy vs search {way}: activations and pushes", values(runs["numpy"], way),
                     values(runs["search"], way), 1e-4)


def test_the_neurons_pushes_and_the_bias_sum_to_the_mlps_part(tiny):
    """Push is each neuron's share of its MLP's part: over every neuron of a layer, the pushes
    and c_proj's bias (read the same way) add up to the MLP's part of the attribution."""
    p = NumpyWeights(tiny)
    text = Text(Run(p))
    text.append(tokenizer.encode(PROMPTS[0]))
    step = list(inspector.generate(text, 1, Sampling(0, 40), 5))[0]
    got = attribution.explain(p, step.inspect, step.token_id, pushing=True)
    tr, a = got["trace"], got["attribution"]
    w = tiny.params["wte.weight"][a["token_id"]].astype(np.float64)
    read = attribution.Reading(p, tr)
    mlp = {part["layer"]: part["value"] for part in a["parts"] if part["kind"] == "mlp"}
    for layer in range(tiny.config.n_layer):
        pushes = np.asarray(tr[f"h.{layer}.mlp.gelu"], np.float64) * read.values(attribution.neuron_rows(p, layer), w)
        bias = tiny.params[f"h.{layer}.mlp.c_proj.bias"].astype(np.float64)
        assert abs(pushes.sum() + read.values(bias[None], w)[0] - mlp[layer]) < 1e-5, layer
        shown = got["pushing"][layer]
        assert [n["neuron"] for n in shown] == list(np.argsort(-pushes, kind="stable")[:len(shown)])


def test_head_writes_sum_to_the_attention_output(tiny):
    """Each head's write plus the bias is what attention added (c_proj is linear)."""
    p = NumpyWeights(tiny)
    text = Text(Run(p))
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
            assert v["pushing"] is None
            check(f"demo route at {p}", hf(demo), demo, ids, v, runner_up=p == n)
            assert a["versus"]["token"]["text"] == tokenizer.token_text(a["versus"]["token_id"])
            assert [x["label"] for x in a["versus"]["parts"]] == labels
            assert all(set(tok["token"]) >= {"token_id", "text"}
                       for layer in v["neurons"] for nn in layer for tok in nn["promotes"])
            kinds = [q["kind"] for q in v["requests"]]
            want = (["wte.fetch"] + [f"h.{l}.attn.c_proj" for l in range(c.n_layer)]
                    + [f"h.{l}.mlp.c_proj" for l in range(c.n_layer)] + ["wte.promotes"])
            assert kinds[-(2 * c.n_layer + 2):] == want
            assert all(q["extra"] for q in v["requests"])
        # ?versus=ID: the parts of the difference from that token; a bad one is a 400 that names it.
        other = v["lens"][-1]["top"][2]["token_id"]
        w = client.get(f"/api/texts/{t['id']}/steps/3/inspect",
                       params={"lens_k": 5, "versus": other, "pushing": "true"}).json()
        assert w["attribution"]["versus"]["token_id"] == other
        assert all(len(layer) == attribution.NEURONS for layer in w["pushing"])
        assert all(set(tok["token"]) >= {"token_id", "text"} for layer in w["pushing"] for nn in layer
                   for tok in nn["promotes"])
        check("demo route versus", hf(demo), demo, tokenizer.encode(PROMPTS[0])[:3], w)
        r = client.get(f"/api/texts/{t['id']}/steps/3/inspect", params={"versus": 60000})
        assert r.status_code == 400 and "versus: token id 60000 is outside the vocabulary" in message(r)


@pytest.mark.parametrize("engine", ["reference", "search"])
def test_generate_json_inspect_contract(tmp_path_factory, tiny, tiny_dir, hf, engine):
    """`puffergpt generate --json --inspect`: each token line has attribution (with its versus,
    the runner-up) and neurons as docs/cli.md's contract says, equal to transformers
    within 1e-3, the versus's parts summing to the difference within 1e-4; `--versus ID` sets it."""
    from click.testing import CliRunner

    from puffergpt.cli import main

    args = ["--model", str(tiny_dir), "--engine", engine]
    if engine == "search":
        data = tmp_path_factory.mktemp("cli-attribution")
        assert CliRunner().invoke(main, ["load", "--model", str(tiny_dir), "--data", str(data)],
                                  env={"PUFFERGPT_DATA": None}).exit_code == 0
        args += ["--data", str(data)]
    versus = ["--versus", str(tokenizer.encode(" the")[0])] if engine == "reference" else []
    r = CliRunner().invoke(main, ["generate", PROMPTS[1], *args, "--json", "--inspect", "--temperature", "0",
                                  "-n", "2", *versus], env={"PUFFERGPT_DATA": None})
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.splitlines() if x.strip()]
    tokens = [x for x in lines if "token_id" in x and "attribution" in x]
    assert len(tokens) == 2
    ids = tokenizer.encode(PROMPTS[1])
    for i, line in enumerate(tokens):
        a = line["attribution"]
        assert set(a) == {"token_id", "logit", "parts", "versus"} and a["token_id"] == line["token_id"]
        assert set(a["versus"]) == {"token_id", "logit", "parts"}
        if versus:
            assert a["versus"]["token_id"] == int(versus[1])
        kinds = {p["kind"] for p in a["parts"]}
        assert kinds == {"embed", "attn", "attn_bias", "mlp", "ln_f_bias"} == {p["kind"] for p in a["versus"]["parts"]}
        assert all(set(n) == {"neuron", "activation", "push", "promotes"} for layer in line["neurons"] for n in layer)
        assert isinstance(line["decided_layer"], int) and line["final_top1"]["token_id"] == line["token_id"]
        check(f"cli {engine} token {i}", hf(tiny), tiny, ids + [t["token_id"] for t in tokens[:i]], line,
              runner_up=not versus)
