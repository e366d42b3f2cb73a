"""The numpy reference against Hugging Face transformers (torch, CPU): the oracle."""

import numpy as np
import pytest

from helpers import PROMPTS, assert_close
from puffergpt.model import tokenizer
from puffergpt.model.reference import Cache, NumpyWeights, Reference, forward, gelu, layer_norm, softmax

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")  # noqa: F841
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_logits_equal_transformers(request, hf, model):
    ckpt = request.getfixturevalue(model)
    ref, m = Reference(ckpt), hf(ckpt)
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            want = m(torch.tensor([ids])).logits[0].numpy()
        assert_close(f"{model} {prompt!r}", ref.logits(ids), want, 1e-4)


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_32_greedy_tokens_equal_transformers(request, hf, model):
    ckpt = request.getfixturevalue(model)
    ref, m = Reference(ckpt), hf(ckpt)
    for prompt in PROMPTS[:4]:
        ids = tokenizer.encode(prompt)
        with torch.no_grad():
            want = m.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=32, do_sample=False, pad_token_id=tokenizer.EOT)[0, len(ids):].tolist()
        got = ref.greedy(ids, 32)
        first = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), len(want))
        assert got[: len(want)] == want, f"{model} {prompt!r}: first difference at {first}"


def test_kv_cache_decode_equals_full_forward(tiny):
    """Reading tokens one at a time with the cache gives the full forward's logits."""
    ids = tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    full = Reference(tiny).logits(ids)
    p, cache = NumpyWeights(tiny), Cache()
    steps = [p.logits(forward(p, np.array(ids[:3]), 0, cache))[-1]]
    for i in range(3, len(ids)):
        steps.append(p.logits(forward(p, np.array([ids[i]]), i, cache))[-1])
    assert_close("incremental", np.stack(steps), full[2:], 1e-5)


def test_stepping_back_overwrites_the_cache(tiny):
    a, b = tokenizer.encode("one two three"), tokenizer.encode(" four")
    p, cache = NumpyWeights(tiny), Cache()
    forward(p, np.array(a + tokenizer.encode(" five six")), 0, cache)
    got = p.logits(forward(p, np.array(b), len(a), cache))[-1]  # replaces position 3 onwards
    assert_close("after step back", got, Reference(tiny).logits(a + b)[-1], 1e-5)


def test_building_blocks():
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    y = layer_norm(x, np.ones(8), np.zeros(8), 1e-5)
    np.testing.assert_allclose(y.mean(-1), 0, atol=1e-6)
    np.testing.assert_allclose(y.std(-1), 1, atol=1e-3)
    with torch.no_grad():
        want = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh").numpy()
    assert_close("gelu", gelu(x), want, 1e-6)
    np.testing.assert_allclose(softmax(x).sum(-1), 1, atol=1e-6)


def test_context_limit(tiny):
    with pytest.raises(ValueError, match="past the model's context of 128"):
        Reference(tiny).logits([1] * 129)


def test_a_trace_names_what_it_holds_as_gpt2_does(tiny):
    """A forward pass's trace is keyed by GPT-2's names, as the request kinds are: each layer's
    residual, attention scores and weights, heads, c_proj outputs and neurons, then ln_f's
    input; each of the last token's shape."""
    from puffergpt.model.reference import Cache, NumpyWeights, Trace, forward

    c, trace = tiny.config, Trace()
    forward(NumpyWeights(tiny), np.array([1, 2, 3]), 0, Cache(), trace)
    want = {f"h.{l}.{kind}" for l in range(c.n_layer) for kind in Trace.KINDS} | {"ln_f.resid"}
    assert set(trace.values) == want, sorted(set(trace.values) ^ want)
    assert trace["h.1.attn.weights"].shape == (c.n_head, 3) and trace["h.1.mlp.gelu"].shape == (4 * c.n_embd,)
    assert trace["h.0.attn.heads"].shape == (c.n_head, c.head_dim) and trace["ln_f.resid"].shape == (c.n_embd,)
    np.testing.assert_allclose(trace["h.1.attn.weights"].sum(axis=1), 1, rtol=1e-5)  # softmax rows
    assert len(trace.residual) == c.n_layer + 1 and trace.n_layer == c.n_layer
