"""Inside the transformer, as searches: attention per layer and head, the logit lens,
the embedding space, the KV cache, and the round trips a decode step makes. Each
against an independent reference: transformers (eager attention, output_attentions,
output_hidden_states) and numpy on the checkpoint."""

import numpy as np
import pytest

from helpers import assert_close, open_run_for
from puffergpt.app import completion
from puffergpt.lens import inside, inspector, views
from puffergpt.model import checkpoints, tokenizer
from puffergpt.model.checkpoints import GPT2Config
from puffergpt.model.reference import Reference
from puffergpt.model.sampling import Sampling
from puffergpt.search import load, manifest
from puffergpt.search.engine import round_trips_per_token
from puffergpt.search.manifest import open_engine
from puffergpt.stores import open_store
from puffergpt.texts.text import Text, TextError

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
transformers = pytest.importorskip("transformers")

PROMPTS = ["The list of built-in functions", "x = 1\ny = 2\nx = 1\ny ="]


def hf_inside(m, ids):
    """transformers' view of the last token: attention (L, H, T) and the lens logits (L+1, V)."""
    with torch.no_grad():
        out = m(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
        att = np.stack([a[0, :, -1, :].numpy() for a in out.attentions])  # L x (H, T)
        hs = out.hidden_states  # embeddings, after block 0, ..., after block L-1 with ln_f applied
        lens = [m.lm_head(m.transformer.ln_f(h[0, -1])).numpy() for h in hs[:-1]] + [out.logits[0, -1].numpy()]
    return att, np.stack(lens)


@pytest.mark.parametrize("kind", ["search", "reference"])
@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_attention_and_lens_equal_transformers(request, hf, loaded, kind, model):
    ckpt = request.getfixturevalue(model)
    m, k = hf(ckpt), 10
    decodes = 0
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        # the prefill's step, then a decode step's (unless the first token is <|endoftext|>: it stops)
        steps = list(completion.complete(open_run_for(kind, loaded, ckpt), ids, 2, Sampling(0, 40), inspect=k))
        decodes += len(steps) - 1
        for i, step in enumerate(steps):
            upto = ids + [s.token_id for s in steps[:i]]
            want_att, want_lens = hf_inside(m, upto)
            got = step.inspect
            T = len(upto)
            assert got["weights"].shape == (ckpt.config.n_layer, ckpt.config.n_head, T)
            assert np.allclose(got["weights"].sum(axis=-1), 1, atol=1e-5)
            assert_close(f"{model}/{kind} attention at {T - 1}", got["weights"], want_att, 1e-4)
            assert len(got["lens"]) == ckpt.config.n_layer + 1
            for e, want in zip(got["lens"], want_lens, strict=True):
                top = np.argsort(-want, kind="stable")[:k]
                assert list(e["ids"]) == list(top), \
                    f"{model}/{kind} lens layer {e['layer']}: {list(e['ids'])} != {list(top)}"
                assert_close(f"{model}/{kind} lens layer {e['layer']}", e["logits"], want[top], 1e-3)
    assert decodes, "no prompt reached a decode step"


def test_inspect_on_demand_equals_the_generations_own(loaded, tiny):
    """A position not kept is recomputed, its requests counted and marked extra, and the
    text is left as it was: same tokens, same keys, same next candidates."""
    store, key = loaded(tiny)
    t = Text(open_engine(store, tiny.name, key).open())
    try:
        t.append(tokenizer.encode(PROMPTS[0]))
        steps = list(inspector.generate(t, 6, Sampling(0, 40), 10))
        kept = {p: t.kept[p] for p in list(t.kept)}
        t.kept.clear()
        before = (list(t.tokens), t.read_upto, t.session.key_counts())
        for p, want in kept.items():
            got, reqs, recomputed = inspector.inspect(t, p, 10)
            assert recomputed and reqs and all(r.extra for r in reqs)
            assert_close(f"weights at {p}", got["weights"], want["weights"], 1e-6)
            for a, b in zip(got["lens"], want["lens"], strict=True):
                assert list(a["ids"]) == list(b["ids"])
        assert (list(t.tokens), t.read_upto, t.session.key_counts()) == before
        more = list(t.generate(4, Sampling(0, 40)))
        ref = Reference(tiny).greedy(tokenizer.encode(PROMPTS[0]), 10)
        assert [s.token_id for s in steps + more] == ref
    finally:
        t.close()


def test_inspect_bad_input_changes_nothing(loaded, tiny):
    store, key = loaded(tiny)
    t = Text(open_engine(store, tiny.name, key).open())
    try:
        t.append(tokenizer.encode(PROMPTS[0]))
        list(t.generate(3, Sampling(0, 40)))
        state = (list(t.tokens), t.length, t.read_upto, sorted(t.steps))
        for p in (0, -1, t.read_upto + 1, 999, True, "2"):
            with pytest.raises(TextError, match="position"):
                inspector.inspect(t, p)
        for k in (0, 101, 2.5):
            with pytest.raises(TextError, match="k must be"):
                inspector.inspect(t, 2, k)
        t.cut(3)  # a cut text: positions past the cut are not read any more
        with pytest.raises(TextError, match="outside 1..3"):
            inspector.inspect(t, 5)
        assert (list(t.tokens), t.length, t.read_upto) == (state[0][:3], 3, 3)
    finally:
        t.close()


def numpy_cosine(ckpt, v):
    w = ckpt.params["wte.weight"].astype(np.float64)
    return w @ v / (np.linalg.norm(w, axis=1) * np.linalg.norm(v))


def numpy_untrained(ckpt) -> set[int]:
    """Rows of wte equal to another row, by numpy's own unique (not the module's hashing)."""
    _, inverse, counts = np.unique(ckpt.params["wte.weight"], axis=0, return_inverse=True, return_counts=True)
    return set(np.flatnonzero(counts[inverse.ravel()] > 1).tolist())


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_analogy_and_neighbours_equal_numpy(request, loaded, model):
    ckpt = request.getfixturevalue(model)
    store, key = loaded(ckpt)
    run = open_engine(store, ckpt.name, key).open()
    try:
        with run.session.recording() as requests:
            got = views.analogy(run.weights, " man", " woman", " king", 10)
        assert [r.kind for r in requests] == ["wte.fetch", "wte.cosine"]  # a fetch and one search
        w = ckpt.params["wte.weight"].astype(np.float64)
        a, b, c = (tokenizer.encode(x)[0] for x in (" man", " woman", " king"))
        sims = numpy_cosine(ckpt, w[b] - w[a] + w[c])
        bad = numpy_untrained(ckpt)
        want = [int(i) for i in np.argsort(-sims, kind="stable") if int(i) not in (a, b, c) and int(i) not in bad][:10]
        assert [r["token_id"] for r in got["results"]] == want
        assert_close(f"{model} analogy scores", [r["score"] for r in got["results"]], sims[want], 1e-4)
        got = views.neighbours(run.weights, " list", 5)
        i = tokenizer.encode(" list")[0]
        sims = numpy_cosine(ckpt, w[i])
        want = [int(j) for j in np.argsort(-sims, kind="stable") if int(j) != i and int(j) not in bad][:5]
        assert [r["token_id"] for r in got["results"]] == want
        assert_close(f"{model} neighbour scores", [r["score"] for r in got["results"]], sims[want], 1e-4)
    finally:
        run.session.close()


def test_a_word_of_several_tokens_is_a_clear_error(loaded, tiny):
    store, key = loaded(tiny)
    run = open_engine(store, tiny.name, key).open()
    try:
        with pytest.raises(TextError,
                           match=r"'queen' is 2 GPT-2 tokens \('que' \+ 'en'\).*leading space, ' queen' is one token"):
            views.analogy(run.weights, " man", "queen", " king")
        with pytest.raises(TextError, match="k must be"):
            views.neighbours(run.weights, " man", 0)
        with pytest.raises(TextError, match="2 to 24 words"):
            views.embedding_map(run.weights, [" man"])
    finally:
        run.session.close()


def test_map_is_stable_and_is_the_words_pca(loaded, tiny):
    store, key = loaded(tiny)
    run = open_engine(store, tiny.name, key).open()
    words = [" man", " woman", " king", " queen", " list"]
    try:
        one, two = views.embedding_map(run.weights, words), views.embedding_map(run.weights, words)
        assert one["points"] == two["points"]
        rows = tiny.params["wte.weight"][[tokenizer.encode(w)[0] for w in words]].astype(np.float64)
        centred = rows - rows.mean(axis=0)
        got = np.array([[p["x"], p["y"]] for p in one["points"]])
        # the same plane as numpy's PCA: distances between the points agree
        _, _, vt = np.linalg.svd(centred, full_matrices=False)
        want = centred @ vt[:2].T
        assert_close("map distances", np.linalg.norm(got[:, None] - got[None], axis=-1),
                     np.linalg.norm(want[:, None] - want[None], axis=-1), 1e-6)
    finally:
        run.session.close()


def test_kv_view_counts_keys_in_the_store(loaded, tiny):
    store, key = loaded(tiny)
    t = Text(open_engine(store, tiny.name, key).open())
    c = tiny.config
    try:
        ids = tokenizer.encode(PROMPTS[0])
        t.append(ids)
        list(t.generate(3, Sampling(0, 40)))
        v = views.kv(t)
        assert v["per_layer"] == [c.n_head * t.read_upto] * c.n_layer
        assert v["writes"][0] == {**v["writes"][0], "phase": "prefill", "start": 0, "end": len(ids)}
        assert [w["phase"] for w in v["writes"][1:]] == ["decode", "decode"]
        t.step_back(len(ids) + 1)  # stepping back deletes nothing
        assert views.kv(t)["per_layer"] == v["per_layer"]
    finally:
        t.close()


def test_a_decode_step_is_at_most_62_round_trips_at_gpt2_depth(tmp_path):
    """12 layers, as GPT-2 small: 2 + 5 x 12 = 62 sequential requests, the 12 key writes beside them."""
    c = GPT2Config(n_vocab=tokenizer.VOCAB_SIZE, n_ctx=64, n_embd=32, n_layer=12, n_head=2)
    path = checkpoints.save_dir(tmp_path / "deep", c, checkpoints.random_params(c, 3))
    ckpt = checkpoints.load(str(path))
    store = open_store("embedded", tmp_path / "data")
    try:
        key = manifest.model_key(ckpt.name)
        load.load(store, ckpt, key, progress=False)
        t = Text(open_engine(store, ckpt.name, key).open())
        t.append(tokenizer.encode(PROMPTS[0]))
        steps = list(t.generate(4, Sampling(0, 40)))
        t.close()
        for st in steps[1:]:
            writes = [r for r in st.requests if r.op == "write"]
            assert sum(r.round_trips for r in st.requests) == round_trips_per_token(c) == 62
            assert len(writes) == 12 and all(r.concurrent for r in writes)
        assert [s.token_id for s in steps] == Reference(ckpt).greedy(tokenizer.encode(PROMPTS[0]), 4)
    finally:
        store.close()


def test_200_tokens_never_miss_a_key(loaded, demo):
    """Concurrent key writes: every search still finds every earlier key (each search checks
    its count), and 200 greedy tokens equal the reference's."""
    store, key = loaded(demo)
    ids = tokenizer.encode("A man")  # the demo model writes 200 tokens after it without <|endoftext|>
    want = Reference(demo).greedy(ids, 200)
    assert tokenizer.EOT not in want, "pick a prompt the model continues for 200 tokens"
    got = [s.token_id for s in completion.complete(open_engine(store, demo.name, key).open, ids, 200, Sampling(0, 40))]
    assert got == want


# --- one truth: the layer where the model made up its mind ---

def lens_of(top1s):
    return [{"layer": l, "ids": np.array([t, 99]), "logits": np.array([1.0, 0.0])} for l, t in enumerate(top1s)]


def test_decided_layer_is_where_the_final_top1_stays():
    """The first layer from which every later top-1 is the final one: a layer whose top-1
    equals it, then changes, then comes back does not count (the other reading said 1 here)."""
    assert inside.decided_layer(lens_of([5, 7, 8, 7, 7])) == 3
    assert inside.final_top1(lens_of([5, 7, 8, 7, 7])) == 7
    assert inside.decided_layer(lens_of([7, 7, 7])) == 0
    assert inside.decided_layer(lens_of([7, 3, 7, 3])) == 3  # only the final entry
    assert inside.decided_layer(lens_of([1, 2, 2, 9, 2])) == 3 + 1


def test_decided_layer_on_a_real_prompt_where_the_readings_differ(loaded, hf, demo):
    """Demo model, "A cat" -> next token: the lens's top-1 at layer 2 already is the final
    top-1 (","), layer 3's is not ("'s"), the last is again. Checked against transformers' lens,
    through the search engine, the protocol's inspect JSON and the CLI's line."""
    from puffergpt.app.protocol import inspect_json, step_inspect_json, step_line

    ids = tokenizer.encode("A cat")
    _, want_lens = hf_inside(hf(demo), ids)
    tops = [int(np.argmax(v)) for v in want_lens]
    final = tops[-1]
    first_equal = tops.index(final)
    decided = next(l for l in range(len(tops)) if all(t == final for t in tops[l:]))
    assert first_equal < decided, f"the prompt no longer tells the readings apart: {tops}"
    store, key = loaded(demo)
    t = Text(open_engine(store, demo.name, key).open())
    try:
        t.append(ids)
        step = list(inspector.generate(t, 1, Sampling(0, 40), 5))[0]
        assert inside.decided_layer(step.inspect["lens"]) == decided
        assert step_inspect_json(step)["decided_layer"] == decided
        assert step_inspect_json(step)["final_top1"]["token_id"] == final
        line = step_line(step)
        assert (line["decided_layer"], line["final_top1"]["token_id"]) == (decided, final)
        got, reqs, recomputed = inspector.inspect(t, 2, 5)
        view = inspect_json(got, t, 2, reqs, recomputed)
        assert (view["decided_layer"], view["final_top1"]["token_id"]) == (decided, final)
        assert "first_top1_layer" not in view
    finally:
        t.close()


# --- honest embedding views: rows never trained ---

@pytest.fixture(scope="module")
def twins(tmp_path_factory, tiny):
    """The tiny model with some wte rows set to one shared vector (as the demo sets every
    unseen token's), among them " king", " queen" and tokens that would rank high."""
    params = {k: v.copy() for k, v in tiny.params.items()}
    w = params["wte.weight"]
    king, queen, man, woman = (tokenizer.encode(x)[0] for x in (" king", " queen", " man", " woman"))
    sims = numpy_cosine(tiny, w[woman].astype(np.float64) - w[man] + w[king])
    near = [int(i) for i in np.argsort(-sims, kind="stable") if int(i) not in (king, man, woman)][:3]
    twins = [king, queen, *near, 100, 101, 102]
    w[twins] = w[5000]  # 5000 too: it is now one of them
    path = checkpoints.save_dir(tmp_path_factory.mktemp("twins") / "twins", tiny.config, params)
    ckpt = checkpoints.load(str(path))
    store = open_store("embedded", tmp_path_factory.mktemp("twins-store"))
    key = manifest.model_key(ckpt.name)
    m = load.load(store, ckpt, key, progress=False)
    yield ckpt, store, key, m, set(twins) | {5000}
    store.close()


def test_untrained_rows_are_recorded_at_load(twins, loaded, demo):
    ckpt, store, key, _, want = twins
    assert open_engine(store, ckpt.name, key).untrained == want == numpy_untrained(ckpt)
    demo_store, demo_key = loaded(demo)
    got = open_engine(demo_store, demo.name, demo_key).untrained
    assert got == numpy_untrained(demo) and len(got) > 1000  # the demo model's unseen tokens
    assert tokenizer.encode(" niece")[0] in got and tokenizer.encode(" list")[0] not in got


def test_views_never_answer_with_untrained_rows(twins):
    ckpt, store, key, _, bad = twins
    run = open_engine(store, ckpt.name, key).views()
    w = ckpt.params["wte.weight"].astype(np.float64)
    try:
        man, woman, king = (tokenizer.encode(x)[0] for x in (" man", " woman", " king"))
        got = views.analogy(run.weights, " man", " woman", " king", 5)
        sims = numpy_cosine(ckpt, w[woman] - w[man] + w[king])
        order = [int(i) for i in np.argsort(-sims, kind="stable") if int(i) not in (man, woman, king)]
        want = [i for i in order if i not in bad][:5]
        assert [r["token_id"] for r in got["results"]] == want
        assert got["untrained_skipped"] == len([i for i in order[: order.index(want[-1])] if i in bad]) >= 3
        assert got["untrained_inputs"] == [" king"] and "' king' was never trained" in got["note"]
        got = views.neighbours(run.weights, " king", 5)
        assert not {r["token_id"] for r in got["results"]} & bad
        assert got["untrained_skipped"] == len(bad) - 1  # its twins are all at cosine 1: skipped
        assert got["untrained_inputs"] == [" king"]
        got = views.neighbours(run.weights, " list", 5)
        assert got["untrained_inputs"] == []
        assert got["note"] is None or "skipped" in got["note"]
        m = views.embedding_map(run.weights, [" king", " queen", " man", " woman", " list"])
        assert [p["untrained"] for p in m["points"]] == [True, True, False, False, False]
        assert m["degenerate"] and "same point" in m["note"] and "never trained" in m["note"]
        m = views.embedding_map(run.weights, [" man", " woman", " list", " dict"])
        assert not m["degenerate"] and m["note"] is None
        m = views.embedding_map(run.weights, [" man", " woman"])  # two points: a line
        assert m["degenerate"] and "second component" in m["note"]
    finally:
        run.session.close()


def test_a_store_from_an_older_version_says_untrained_rows_are_unknown(tmp_path, tiny):
    """No `untrained` in the manifest: the views work, say they can't tell, and name the
    command; that command records them."""
    store = open_store("embedded", tmp_path / "old")
    try:
        key = manifest.model_key(tiny.name)
        m = load.load(store, tiny, key, progress=False)
        del m["untrained"]
        store.put_meta(f"manifest:{key}", m)
        run = open_engine(store, tiny.name, key).views()
        try:
            w = run.weights
            for got in (views.analogy(w, " man", " woman", " king", 3), views.neighbours(w, " man", 3),
                        views.embedding_map(w, [" man", " woman", " king"])):
                assert "`puffergpt load`" in got["note"] and "older puffergpt" in got["note"]
            assert got["points"][0]["untrained"] is None
        finally:
            run.session.close()
        assert load.load(store, tiny, key, progress=False)["untrained"] == []
        assert open_engine(store, tiny.name, key).untrained == frozenset()
    finally:
        store.close()
