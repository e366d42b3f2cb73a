"""Switching parts of the model off (ablation): a head's mixed values zeroed before c_proj,
an MLP's output (bias included) zeroed, at every position. The same forward pass, numpy and
searches, against transformers with the same hooks (a forward pre-hook on attn.c_proj
zeroing the head's slice, a forward hook on the MLP returning zeros); the playground's rerun
of a step (POST /api/texts/{id}/steps/{p}/ablate) leaves the text as it was; bad parts are
refused by name."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest

from helpers import assert_close, message, open_run_for
from puffergpt.app import completion
from puffergpt.model import tokenizer
from puffergpt.model.reference import Ablation, Cache, NumpyWeights, forward
from puffergpt.model.sampling import Sampling
from puffergpt.search.engine import requests_per_token
from puffergpt.search.manifest import open_engine
from test_demo_model import COPY_HEAD, COPY_LAYER, COPY_PROMPT

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
transformers = pytest.importorskip("transformers")

TOL = 1e-3  # the contract: candidate logits equal to transformers' within 1e-3
PARTS = {"demo": [f"attn {COPY_LAYER}.{COPY_HEAD}", "mlp 1"], "tiny": ["attn 0.1", "attn 1.3", "mlp 1"]}
PROMPTS = {"demo": COPY_PROMPT, "tiny": "x = 1\ny = 2\nx = 1\ny ="}


@contextlib.contextmanager
def hooked(m, ablation: Ablation):
    """transformers' model with the same parts switched off, by hooks."""
    hd = m.config.n_embd // m.config.n_head
    hooks = []
    for layer, heads in ablation.heads.items():
        def zero_heads(mod, args, heads=heads):
            z = args[0].clone()  # (B, T, C): the heads' outputs, merged, before c_proj
            for h in heads:
                z[..., h * hd:(h + 1) * hd] = 0
            return (z,)
        hooks.append(m.transformer.h[layer].attn.c_proj.register_forward_pre_hook(zero_heads))
    for layer in ablation.mlps:
        hooks.append(m.transformer.h[layer].mlp.register_forward_hook(lambda mod, args, out: torch.zeros_like(out)))
    try:
        yield m
    finally:
        for h in hooks:
            h.remove()


@contextlib.contextmanager
def hooked_mean(m, ids, ablation: Ablation):
    """transformers' model with the parts' outputs replaced, at every position, by their means
    over ``ids``' positions in a pass with every part on (mean ablation)."""
    hd = m.config.n_embd // m.config.n_head
    seen, hooks = {}, []
    for layer in ablation.heads:
        hooks.append(m.transformer.h[layer].attn.c_proj.register_forward_pre_hook(
            lambda mod, args, layer=layer: seen.__setitem__(("attn", layer), args[0][0].double().mean(0))))
    for layer in ablation.mlps:
        hooks.append(m.transformer.h[layer].mlp.register_forward_hook(
            lambda mod, args, out, layer=layer: seen.__setitem__(("mlp", layer), out[0].double().mean(0))))
    with torch.no_grad():
        m(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    hooks = []
    for layer, heads in ablation.heads.items():
        mean = seen[("attn", layer)].float()

        def mean_heads(mod, args, heads=heads, mean=mean):
            z = args[0].clone()  # (B, T, C): the heads' outputs, merged, before c_proj
            for h in heads:
                z[..., h * hd:(h + 1) * hd] = mean[h * hd:(h + 1) * hd]
            return (z,)
        hooks.append(m.transformer.h[layer].attn.c_proj.register_forward_pre_hook(mean_heads))
    for layer in ablation.mlps:
        mean = seen[("mlp", layer)].float()
        hooks.append(m.transformer.h[layer].mlp.register_forward_hook(
            lambda mod, args, out, mean=mean: mean.expand_as(out).clone()))
    try:
        yield m
    finally:
        for h in hooks:
            h.remove()


def hf_logits(m, ids, ablation: Ablation) -> np.ndarray:
    """The last position's logits (V,) with the parts off, float64."""
    with hooked(m, ablation), torch.no_grad():
        return m(torch.tensor([ids])).logits[0, -1].double().numpy()


def numpy_top(ckpt, ids, ablation: Ablation, k: int) -> tuple[list[int], np.ndarray]:
    p = NumpyWeights(ckpt)
    logits = p.logits(forward(p, np.asarray(ids), 0, Cache(), None, ablation)[-1])
    top = np.argsort(-logits, kind="stable")[:k]
    return [int(i) for i in top], logits[top]


@pytest.mark.parametrize("kind", ["search", "numpy"])
@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_an_ablated_generation_equals_transformers_with_the_same_hooks(request, hf, loaded, kind, model):
    """Greedy tokens with parts off: the same tokens as transformers with the same hooks, each
    step's 40 candidates' logits within 1e-3; and not what the whole model says."""
    ckpt = request.getfixturevalue(model)
    m = hf(ckpt)
    off = Ablation.of(PARTS[model], ckpt.config)
    ids = tokenizer.encode(PROMPTS[model])
    steps = list(completion.complete(open_run_for(kind, loaded, ckpt), ids, 3, Sampling(0, 40), ablation=off))
    assert len(steps) == 3
    worst = moved = 0.0
    for i, step in enumerate(steps):
        upto = ids + [s.token_id for s in steps[:i]]
        want = hf_logits(m, upto, off)
        assert step.token_id == int(np.argmax(want)), f"{model}/{kind} step {i}"
        worst = max(worst, assert_close(f"{model}/{kind} step {i} candidates", step.logits[:40],
                                        want[step.ids[:40]], TOL))
        moved = max(moved, float(np.abs(hf_logits(m, upto, Ablation()) - want).max()))
    print(f"{model}/{kind}: max |logit - transformers'| {worst:.2e}; the parts moved logits by up to {moved:.2f}")
    assert moved > 0.1, "switching the parts off changed nothing: the test would not see a missing ablation"
    if model == "demo":  # the copying head off: the copy fails
        assert tokenizer.token_text(steps[0].token_id) != " 3"


def test_generate_ablate_on_the_demo_copies_no_more(demo, hf):
    """`generate --ablate` from the command line: the token lines as usual, equal to
    transformers with the same hooks; the summary names the parts."""
    import json

    from click.testing import CliRunner

    from puffergpt.cli import main

    part = f"attn {COPY_LAYER}.{COPY_HEAD}"
    r = CliRunner().invoke(main, ["generate", COPY_PROMPT, "--model", "demo", "--engine", "reference", "--json",
                                  "--temperature", "0", "-n", "2", "--ablate", part], env={"PUFFERGPT_DATA": None})
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[-1]["summary"]["ablate"] == [part]
    off, ids, m = Ablation.of([part], demo.config), tokenizer.encode(COPY_PROMPT), hf(demo)
    for line in lines[:-1]:
        want = hf_logits(m, ids, off)
        assert line["token_id"] == int(np.argmax(want))
        assert_close("cli candidates", [c["logit"] for c in line["candidates"]],
                     want[[c["token_id"] for c in line["candidates"]]], TOL)
        ids.append(line["token_id"])
    assert lines[0]["text"] != " 3"


def test_parts_are_read_and_refused_by_name(demo):
    c = demo.config
    off = Ablation.of([" attn 2.2 ", "mlp 0", "attn 2.2", "attn 0.5"], c)
    assert off.parts == ["attn 0.5", "mlp 0", "attn 2.2"]
    for bad, says in (("attn 4.0", "'attn 4.0' is not in this model: this model has layers 0..3 and heads 0..5"),
                      ("attn 1.6", "'attn 1.6' is not in this model"), ("mlp 7", "'mlp 7' is not in this model"),
                      ("head 2", "'head 2' is not a part: write 'attn L.H'"), ("attn 2", "'attn 2' is not a part"),
                      ("mlp", "'mlp' is not a part"), ("attn ٢.٢", "is not a part")):
        with pytest.raises(ValueError, match=says):
            Ablation.of([bad], c)


def test_the_rerun_route_answers_before_and_after_and_leaves_the_text(loaded, demo, hf):
    """POST /api/texts/{id}/steps/{p}/ablate: the candidates before (the step's own) and after
    (transformers with the same hooks: ids, logits within 1e-3), the top choice changed, one
    prefill's requests marked extra; the text's tokens, keys and next token as they were."""
    from fastapi.testclient import TestClient

    from puffergpt.server import ServerConfig, create_app

    store, key = loaded(demo)
    app = create_app(open_engine(store, demo.name, key), ServerConfig(max_open_texts=2))
    part = f"attn {COPY_LAYER}.{COPY_HEAD}"
    off, m, ids = Ablation.of([part], demo.config), hf(demo), tokenizer.encode(COPY_PROMPT)
    with TestClient(app) as client:
        t = client.post("/api/texts", json={"prompt": COPY_PROMPT}).json()
        url = f"/api/texts/{t['id']}"
        n = t["length"]
        step = client.post(f"{url}/generate", json={"max_tokens": 1, "temperature": 0})
        assert step.status_code == 200
        before = client.get(url).json()
        text = app.state.served.texts.get(t["id"])
        keys = text.session.key_counts()
        got = client.post(f"{url}/steps/{n}/ablate", json={"parts": [part], "k": 10})
        assert got.status_code == 200, got.text
        a = got.json()
        assert a["parts"] == [part] and a["chosen"]["text"] == " 3" == a["top1_before"]["text"]
        own = before["steps"][str(n)]["candidates"][:10]
        assert [c["token_id"] for c in a["before"]] == [c["token_id"] for c in own]
        want = hf_logits(m, ids, off)
        top = [int(i) for i in np.argsort(-want, kind="stable")[:10]]
        assert [c["token_id"] for c in a["after"]] == top
        assert_close("rerun after", [c["logit"] for c in a["after"]], want[top], TOL)
        assert a["top1_after"]["token_id"] == top[0] and a["changed"] is True and a["chosen_rank_before"] == 0
        three = a["chosen"]["token_id"]
        assert a["chosen_rank_after"] == (top.index(three) if three in top else None)
        assert len(a["requests"]) == requests_per_token(demo.config) and all(r["extra"] for r in a["requests"])
        assert [r["kind"] for r in a["requests"]][-1] == "wte.top_k"
        # The text is as it was: its tokens, its keys, its next token (the whole model's).
        assert client.get(url).json()["tokens"] == before["tokens"] and text.session.key_counts() == keys
        nxt = client.post(f"{url}/generate", json={"max_tokens": 1, "temperature": 0})
        assert nxt.status_code == 200
        assert client.get(url).json()["tokens"][-1]["token_id"] == numpy_top(demo, ids + [three], Ablation(), 1)[0][0]
        # Mean ablation: the parts' outputs replaced by their means over positions 0..n-1 of an
        # unablated pass (one more prefill, first), as transformers with mean hooks has it.
        parts = [part, "mlp 1"]
        mean = client.post(f"{url}/steps/{n}/ablate", json={"parts": parts, "mode": "mean"}).json()
        with hooked_mean(m, ids, Ablation.of(parts, demo.config)), torch.no_grad():
            want = m(torch.tensor([ids])).logits[0, -1].double().numpy()
        top = [int(i) for i in np.argsort(-want, kind="stable")[:10]]
        assert mean["mode"] == "mean" and [c["token_id"] for c in mean["after"]] == top
        assert_close("mean ablation after", [c["logit"] for c in mean["after"]], want[top], TOL)
        zeroed = hf_logits(m, ids, Ablation.of(parts, demo.config))
        assert np.abs(zeroed - want).max() > 0.1, "mean and zero ablation agree: the test would not tell them apart"
        assert len(mean["requests"]) == 2 * requests_per_token(demo.config) - 1  # a prefill, then the rerun
        # A prompt position: its candidates before from one top-k search, as numpy has them.
        b = client.post(f"{url}/steps/5/ablate", json={"parts": ["mlp 0"]}).json()
        assert [c["token_id"] for c in b["before"]] == numpy_top(demo, ids[:5], Ablation(), 10)[0]
        assert [c["token_id"] for c in b["after"]] == numpy_top(demo, ids[:5], Ablation.of(["mlp 0"], demo.config),
                                                                10)[0]
        assert len(b["requests"]) == requests_per_token(demo.config) + 1  # the text's own top-k, then the rerun
        # Refused, by name: a part not in the model, not a part, none, a position not read, busy.
        for body, status, says in (({"parts": ["attn 2.9"]}, 400, "'attn 2.9' is not in this model"),
                                   ({"parts": ["mlp"]}, 400, "'mlp' is not a part"),
                                   ({"parts": []}, 422, "at least 1 item"),
                                   ({"parts": ["attn " + "1" * 40]}, 422, "at most 32"),
                                   ({"parts": ["mlp 0"], "k": 0}, 422, "greater than or equal to 1"),
                                   ({"parts": ["mlp 0"], "mode": "median"}, 422, "'zero' or 'mean'"),
                                   ({"parts": ["mlp 0"], "extra": 1}, 422, "xtra")):
            r = client.post(f"{url}/steps/{n}/ablate", json=body)
            assert r.status_code == status and says in r.text, (body, r.status_code, r.text)
        r = client.post(f"{url}/steps/{n + 5}/ablate", json={"parts": ["mlp 0"]})
        assert r.status_code == 400 and f"position {n + 5} is outside 1..{n + 1}" in message(r)
        text.begin()
        try:
            r = client.post(f"{url}/steps/{n}/ablate", json={"parts": ["mlp 0"]})
            assert r.status_code == 409 and "generating" in message(r)
        finally:
            text.end()
        assert client.post("/api/texts/0123456789ab/steps/1/ablate", json={"parts": ["mlp 0"]}).status_code == 404
