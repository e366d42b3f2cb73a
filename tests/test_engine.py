"""The search-driven engine against the numpy reference: same scores, same tokens."""

import numpy as np
import pytest

from helpers import PROMPTS, compare_with_reference
from puffergpt.model import tokenizer
from puffergpt.model.reference import Reference
from puffergpt.model.sampling import Sampling
from puffergpt.search.engine import Engine
from puffergpt.search.manifest import open_engine
from puffergpt.stores.base import StoreError
from puffergpt.texts.text import Text


def greedy_on(engine: Engine, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after ids, from a text of its own."""
    text = Text(engine.open())
    try:
        text.append(ids)
        return [s.token_id for s in text.generate(n, Sampling(0, 40))]
    finally:
        text.close()


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_engine_equals_reference_on_ten_prompts(request, loaded, model):
    ckpt = request.getfixturevalue(model)
    store, key = loaded(ckpt)
    worst = 0.0
    for prompt in PROMPTS:
        diff, _ = compare_with_reference(ckpt, Text(open_engine(store, ckpt.name, key).open()), prompt, 32)
        worst = max(worst, diff)
    print(f"{model} inner_product: worst top-40 logit diff {worst:.3g}")


@pytest.mark.parametrize("metric", ["euclidean_squared", "cosine_distance"])
def test_padded_encodings_on_the_demo_model(loaded, demo, metric):
    store, key = loaded(demo, metric)
    worst = 0.0
    for prompt in PROMPTS[:3]:
        diff, _ = compare_with_reference(demo, Text(open_engine(store, demo.name, key).open()), prompt, 8, metric)
        worst = max(worst, diff)
    print(f"demo {metric}: worst top-40 logit diff {worst:.3g}")


def test_request_counts(loaded, tiny):
    store, key = loaded(tiny)
    text = Text(open_engine(store, tiny.name, key).open())
    L = tiny.config.n_layer
    text.append(tokenizer.encode("one two three four five six"))
    steps = list(text.generate(3, Sampling(0, 40)))
    per_token = 1 + 6 * L + 1  # embed, per layer (c_attn, keys write, scores, c_proj, c_fc, c_proj), wte top-k
    assert [len(s.requests) for s in steps] == [per_token] * 3  # the 6-token prefill costs what one token does
    kinds = [r.kind for r in steps[1].requests]
    assert kinds[:7] == [
        "embed",
        "h.0.attn.c_attn",
        "h.0.attn.keys",
        "h.0.attn.scores",
        "h.0.attn.c_proj",
        "h.0.mlp.c_fc",
        "h.0.mlp.c_proj",
    ]
    assert kinds[-1] == "wte.top_k"
    fc = steps[1].requests[5]
    assert fc.rows == 4 * tiny.config.n_embd and fc.returned == fc.rows  # one request, every row
    assert steps[0].requests[5].queries == 6  # prefill: all six tokens in that one request
    text.close()


def test_no_weights_in_the_server(loaded, tiny):
    """Walk everything a text, its weights and its session hold: only layer norms and activations."""
    store, key = loaded(tiny)
    text = Text(open_engine(store, tiny.name, key).open())
    text.append(tokenizer.encode("Hello world"))
    list(text.generate(4, Sampling(0, 40)))
    arrays, seen = [], set()

    def walk(o):
        if id(o) in seen or o is store:
            return
        seen.add(id(o))
        if isinstance(o, np.ndarray):
            arrays.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple, set)):
            for v in o:
                walk(v)
        elif hasattr(o, "__dict__"):
            walk(vars(o))

    walk(text)
    C = tiny.config.n_embd
    activations = {id(v) for v in text.cache.values + text.hidden}  # values and hidden states, not weights
    held = [a for a in arrays if id(a) not in activations]
    assert sum(a.shape == (C,) for a in held) == 2 * (2 * tiny.config.n_layer + 1)  # the walk found the layer norms
    big = [a.shape for a in held if a.size > C]
    assert big == [], f"the server holds arrays larger than a layer norm: {big}"
    wte = tiny.params["wte.weight"]
    assert not any(np.array_equal(a, wte[t]) for a in held for t in text.tokens)  # not even the rows it read
    text.close()


def test_closing_drops_the_keys_namespace(loaded, tiny):
    store, key = loaded(tiny)
    session = open_engine(store, tiny.name, key).open().session
    assert session.keys_ns in store.namespaces("text-")
    session.close()
    assert session.keys_ns not in store.namespaces("text-")


def test_a_text_that_fails_to_open_leaves_no_namespace(loaded, tiny, monkeypatch):
    """The session makes the namespace, the weights then fetch the layer norms: where that fetch
    fails, the open fails with the store's error, and the session's namespace goes with it."""
    store, key = loaded(tiny)
    engine = open_engine(store, tiny.name, key)
    before = store.namespaces("text-")

    def fetch(ns, ids):
        raise StoreError("the store went away")

    monkeypatch.setattr(store, "fetch", fetch)
    with pytest.raises(StoreError, match="went away"):
        engine.open()
    assert store.namespaces("text-") == before


def test_texts_made_ready_open_on_spare_shards_and_still_equal_numpy(tmp_path, tiny):
    """ready_texts(n) on the embedded store leaves n emptied key shards; the next texts open on
    them (no shard made), see none of the earlier keys, and give numpy's tokens."""
    from puffergpt.search import load
    from puffergpt.stores import open_store

    store = open_store("embedded", tmp_path)
    try:
        load.load(store, tiny, "tiny", progress=False)
        engine = open_engine(store, tiny.name, "tiny")
        assert engine.ready_texts(3) == 3 and len(store.texts._spare) == 3  # a text's keys: Qdrant Edge
        spare_dirs = {sp.dir for sp in store.texts._spare}
        prompt = [464, 3290, 286]
        want = Reference(tiny).greedy(prompt, 5)
        for _ in range(4):  # one after another, each on a spare shard
            assert greedy_on(engine, prompt, 5) == want
        assert {sp.dir for sp in store.texts._spare} & spare_dirs
        assert store.namespaces("text-") == []
    finally:
        store.close()


def test_a_run_for_the_views_makes_no_namespace_and_reads_no_text(loaded, tiny):
    store, key = loaded(tiny)
    before = store.namespaces("text-")
    run = open_engine(store, tiny.name, key).views()
    assert store.namespaces("text-") == before and run.session.keys_ns is None
    t = Text(run)
    t.append([1, 2])
    with pytest.raises(StoreError, match="open a text"):
        next(t.generate(1, Sampling(0, 40)))
    assert len(run.weights.token_rows([1, 2])) == 2  # what the views need still works
    t.close()
    assert store.namespaces("text-") == before


@pytest.mark.parametrize("metric", ["euclidean_squared", "cosine_distance"])
def test_keys_without_an_inner_product(loaded, tiny, metric):
    """The path of a store with no inner product (turbopuffer): each key carries |k|^2."""
    store, key = loaded(tiny, metric)
    ids = tokenizer.encode(PROMPTS[2])
    assert greedy_on(open_engine(store, tiny.name, key, key_metric=metric), ids, 12) == Reference(tiny).greedy(ids, 12)


def test_batches_over_the_store_limit_are_split(loaded, tiny, monkeypatch):
    """A prefill with more queries than a request may carry still equals the reference."""
    store, key = loaded(tiny)
    monkeypatch.setattr(store, "max_queries", 7)
    ids = tokenizer.encode(PROMPTS[4])  # 10 tokens: 40 attention queries, 10 per product
    assert greedy_on(open_engine(store, tiny.name, key), ids, 3) == Reference(tiny).greedy(ids, 3)


def test_split_batches_count_their_round_trips(loaded, tiny, monkeypatch):
    store, key = loaded(tiny)
    monkeypatch.setattr(store, "max_queries", 7)
    text = Text(open_engine(store, tiny.name, key).open())
    text.append(tokenizer.encode(PROMPTS[4]))  # 10 tokens
    step = next(text.generate(1, Sampling(0, 40)))
    text.close()
    fc = next(r for r in step.requests if r.kind == "h.0.mlp.c_fc")
    scores = next(r for r in step.requests if r.kind == "h.0.attn.scores")
    # 4 heads x 9 tokens search earlier keys (position 0 has none): 36 queries in 6 parts of 7
    assert (fc.queries, fc.parts) == (10, 2) and (scores.queries, scores.parts) == (36, 6)
