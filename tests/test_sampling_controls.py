"""The sampling's controls (presence, frequency and repetition penalties, logit_bias, min_p):
the candidates are the true top k after them over the whole vocabulary (numpy, the searches),
and at temperature 0 /v1 writes the tokens transformers' logits choose under the same rules."""

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from puffergpt.model import sampling, tokenizer
from puffergpt.model.reference import Cache, NumpyWeights, forward
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.texts.text import Text
from test_openai import servers  # noqa: F401  (the fixture: one uvicorn thread a model)

LOOP = "Perl was created by Larry Wall in"  # the demo loops: "the first of the world of the\nthe first of the world"


def full_after(ckpt, tokens: list[int], s: Sampling, seen, generated) -> np.ndarray:
    """The numpy GPT-2's whole vocabulary at the end of ``tokens``, after the controls: (V,)"""
    weights = NumpyWeights(ckpt)
    h = forward(weights, np.asarray(tokens), 0, Cache())
    return sampling.controls(s, np.arange(ckpt.config.n_vocab), weights.logits(h[-1]), seen, generated)[0]


def far_token(ckpt, prompt: str, rank: int) -> tuple[int, float]:
    """The token ranked ``rank`` after ``prompt``, and the bias that makes it the best by 1."""
    weights = NumpyWeights(ckpt)
    logits = weights.logits(forward(weights, np.asarray(tokenizer.encode(prompt)), 0, Cache())[-1])
    order = np.argsort(-logits)
    return int(order[rank]), float(logits[order[0]] - logits[order[rank]] + 1.0)


CASES = {
    "presence": dict(presence_penalty=1.5),
    "frequency": dict(frequency_penalty=0.8),
    "repetition": dict(repetition_penalty=1.6),
    "raising": dict(repetition_penalty=0.7, frequency_penalty=-0.5),
    "bias": dict(logit_bias={13: 4.0, 262: -5.0}),
    "together": dict(presence_penalty=0.4, frequency_penalty=0.6, repetition_penalty=1.3, logit_bias={198: -3.0}),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("kind", ["numpy", "search"])
def test_candidates_are_the_true_top_k_after_the_controls(demo, loaded, kind, case):
    store, key = loaded(demo)
    run = Run(NumpyWeights(demo)) if kind == "numpy" else open_engine(store, demo.name, key).open()
    s = Sampling(0.0, 40, **CASES[case])
    text = Text(run)
    text.append(tokenizer.encode(LOOP))
    steps, moved = list(text.generate(10, s)), 0
    for st in steps:
        seen, generated = text.history(st.position)
        after = full_after(demo, text.tokens[: st.position], s, seen, generated)
        want = np.argsort(-after, kind="stable")[: len(st.ids)]
        assert list(st.ids) == list(want), f"position {st.position}: not the top {len(st.ids)} after the controls"
        np.testing.assert_allclose(st.logits, after[want], atol=1e-3)
        assert st.token_id == int(np.argmax(after))
        cands = st.candidates()
        moved += sum(bool(c["moved"]) for c in cands)
        for c in cands:  # a logit changes only where a control says it moved it
            assert (c["logit"] != pytest.approx(c["logit_before"], abs=1e-9)) <= bool(c["moved"])
    assert moved, "no candidate was moved by a control"
    text.close()


def test_a_bias_lifts_a_token_from_far_below_the_top_k(demo, loaded):
    """A token ranked 5000th is found and chosen when a bias makes it the best: its row is scored
    apart, in one search restricted to it (wte.scored)."""
    tok, bias = far_token(demo, LOOP, 5000)
    engine = open_engine(loaded(demo)[0], demo.name, loaded(demo)[1])
    text = Text(engine.open())
    text.append(tokenizer.encode(LOOP))
    (step,) = list(text.generate(1, Sampling(0.0, 40, logit_bias={tok: bias})))
    assert step.token_id == tok and int(step.ids[0]) == tok
    assert step.candidates()[0]["moved"] == ["logit_bias"]
    assert step.candidates()[0]["logit_before"] == pytest.approx(step.logits[0] - bias, abs=1e-6)
    assert [r.kind for r in step.requests].count("wte.scored") == 1
    text.close()


# --- /v1 against transformers ---------------------------------------------------------------

def hf_greedy(m, ids: list[int], n: int, presence=0.0, frequency=0.0, repetition=1.0, bias=None) -> tuple:
    """transformers' greedy tokens with the rules applied to its logits: RepetitionPenaltyLogitsProcessor
    over the prompt and the generated, OpenAI's penalties over the generated, then the bias.
    -> (the tokens, each one's log-probability after the rules)"""
    import torch
    from transformers import RepetitionPenaltyLogitsProcessor

    out, gen, lps = list(ids), [], []
    for _ in range(n):
        with torch.no_grad():
            logits = m(torch.tensor([out])).logits[:, -1].double()  # (1, V)
        if repetition != 1:
            logits = RepetitionPenaltyLogitsProcessor(repetition)(torch.tensor([out]), logits)
        count = torch.bincount(torch.tensor(gen, dtype=torch.long), minlength=logits.shape[1]).double()
        logits = logits - count * frequency - (count > 0).double() * presence
        for t, b in (bias or {}).items():
            logits[0, t] += b
        tok = int(logits.argmax())
        lps.append(float(torch.log_softmax(logits[0], -1)[tok]))
        out.append(tok)
        gen.append(tok)
        if tok == tokenizer.EOT:
            break
    return gen, lps


def v1_args(case: dict) -> dict:
    d = {k: v for k, v in case.items() if k != "logit_bias"}
    return d | ({"logit_bias": {str(t): b for t, b in case["logit_bias"].items()}} if "logit_bias" in case else {})


def hf_args(case: dict) -> dict:
    return {"presence": case.get("presence_penalty", 0.0), "frequency": case.get("frequency_penalty", 0.0),
            "repetition": case.get("repetition_penalty", 1.0), "bias": case.get("logit_bias")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_v1_greedy_tokens_equal_transformers_with_the_same_rules(servers, demo, hf, case):  # noqa: F811
    client, _ = servers(demo)
    want, want_lps = hf_greedy(hf(demo), tokenizer.encode(LOOP), 16, **hf_args(CASES[case]))
    extra = v1_args(CASES[case])
    # the top-k path (temperature 0: the 100 best after the controls) and the whole vocabulary's (logprobs)
    plain = client.completions.create(model=demo.name, prompt=LOOP, max_tokens=16, temperature=0, extra_body=extra)
    scored = client.completions.create(model=demo.name, prompt=LOOP, max_tokens=16, temperature=0, logprobs=1,
                                       extra_body=extra)
    text = tokenizer.decode([t for t in want if t != tokenizer.EOT])
    assert plain.choices[0].text == text and scored.choices[0].text == text
    got_lps = scored.choices[0].logprobs.token_logprobs
    assert len(got_lps) == len(want_lps)
    np.testing.assert_allclose(got_lps, want_lps, atol=1e-3)  # the distribution after the controls
    plain_text = hf_greedy(hf(demo), tokenizer.encode(LOOP), 16)[0]
    if case != "bias":
        assert want != plain_text, "the control changed nothing: the test would not see it"


def test_v1_a_bias_from_outside_the_top_40_equals_transformers(servers, demo, hf):  # noqa: F811
    client, _ = servers(demo)
    tok, bias = far_token(demo, LOOP, 2000)
    want, _ = hf_greedy(hf(demo), tokenizer.encode(LOOP), 4, bias={tok: bias})
    assert want[0] == tok
    r = client.completions.create(model=demo.name, prompt=LOOP, max_tokens=4, temperature=0,
                                  logit_bias={str(tok): bias}, extra_body={"top_k": 40})
    assert r.choices[0].text == tokenizer.decode([t for t in want if t != tokenizer.EOT])
    chat = client.chat.completions.create(model=demo.name, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=3, temperature=0, logit_bias={str(tok): 100})
    assert chat.choices[0].message.content.startswith(tokenizer.token_text(tok).lstrip(" ")[:1])


@pytest.mark.parametrize("body, param", [
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_p": 1.5}, "min_p"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"13": 101}}, "logit_bias"),
    ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ({"stream": True, "stream_options": {"bogus": 1}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options"),
])
def test_v1_refuses_controls_out_of_bounds_naming_them(servers, demo, body, param):  # noqa: F811
    _, url = servers(demo)
    r = httpx.post(f"{url}/completions", json={"model": demo.name, "prompt": "a", "max_tokens": 1, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_v1_stream_options_include_usage_still_works(servers, demo):  # noqa: F811
    client, _ = servers(demo)
    chunks = list(client.completions.create(model=demo.name, prompt="a", max_tokens=2, temperature=0, stream=True,
                                            stream_options={"include_usage": True, "include_obfuscation": False}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_min_p_keeps_what_transformers_min_p_warper_keeps():
    import torch
    from transformers import MinPLogitsWarper

    logits = np.random.default_rng(0).normal(0, 2, 500)
    for min_p, t in ((0.05, 1.0), (0.3, 0.7), (0.5, 3.0)):
        p = sampling.distribution(logits, Sampling(t, 500, min_p=min_p))
        warped = MinPLogitsWarper(min_p)(None, torch.tensor(logits / t)[None])[0]
        want = torch.softmax(warped, -1).numpy()
        np.testing.assert_allclose(p, want, atol=1e-12)
        assert 1 < (p > 0).sum() < 500


def test_the_playground_shows_each_candidates_logit_before_and_after(demo, loaded):
    store, key = loaded(demo)
    with TestClient(create_app(open_engine(store, demo.name, key), ServerConfig())) as c:
        t = c.post("/api/texts", json={"prompt": LOOP}).json()
        r = c.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 12, "temperature": 0, "top_k": 40,
                                                           "frequency_penalty": 0.8})
        assert r.status_code == 200
        steps = [__import__("json").loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        moved = [c for st in steps if "candidates" in st for c in st["candidates"] if c.get("moved")]
        assert moved and all(c["moved"] == ["frequency_penalty"] for c in moved)
        assert all(c["logit"] < c["logit_before"] for c in moved)
        bad = c.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 1, "logit_bias": {"x": 1}})
        assert bad.status_code == 422 and "token id" in bad.text
