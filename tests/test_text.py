"""Texts: batched prefill, decode, and edits that pay only for tokens the model has not read."""

import threading

import numpy as np
import pytest

from puffergpt.app.completion import complete
from puffergpt.lens import inspector, views
from puffergpt.model import tokenizer
from puffergpt.model.reference import Reference
from puffergpt.model.sampling import Sampling
from puffergpt.search.manifest import open_engine
from puffergpt.texts.registry import Texts
from puffergpt.texts.text import KEEP_CANDIDATES, Text, TextBusy, TextError

GREEDY = Sampling(0, 40)
PROMPT = tokenizer.encode("The quick brown fox jumps over the lazy dog")


@pytest.fixture
def engine(loaded, tiny):
    store, key = loaded(tiny)
    return open_engine(store, tiny.name, key)


@pytest.fixture
def text(engine):
    t = Text(engine.open())
    yield t
    t.close()


def reads(requests) -> list[int]:
    """Tokens read by each forward in a request log (the c_attn of layer 0 has one query a token)."""
    return [r.queries for r in requests if r.kind == "h.0.attn.c_attn"]


def state(t: Text):
    return (list(t.tokens), t.length, t.read_upto, sorted(t.steps), len(t.hidden))


def test_prefill_is_one_batched_forward(text, tiny):
    prompt = (PROMPT * 8)[:64]
    text.append(prompt)
    first, second = text.generate(2, GREEDY)
    assert reads(first.requests) == [64] and first.phase == "prefill" and first.read == 64
    assert reads(second.requests) == [1] and second.phase == "decode"
    assert len(first.requests) <= 2 * len(second.requests)  # 64 tokens cost about what one does
    assert len(first.requests) == len(second.requests) == 2 + 6 * tiny.config.n_layer


def test_greedy_text_equals_the_reference(text, tiny):
    text.append(PROMPT)
    got = [s.token_id for s in text.generate(12, GREEDY)]
    assert got == Reference(tiny).greedy(PROMPT, 12)


def test_branching_pays_only_for_positions_after_it(text, tiny):
    text.append(PROMPT)
    T = len(PROMPT)
    list(text.generate(8, GREEDY))
    p = T + 3
    text.branch(p, rank=2)
    alt = text.tokens[p]
    assert alt == int(text.steps[p].ids[2]) and text.length == p + 1
    steps = list(text.generate(4, GREEDY))
    assert reads(steps[0].requests) == [1]  # only position p is read again
    assert all(reads(s.requests) == [1] for s in steps)
    assert [s.position for s in steps] == [p + 1, p + 2, p + 3, p + 4]
    want = Reference(tiny).greedy(PROMPT + text.tokens[T:p + 1], 4)
    assert [s.token_id for s in steps] == want


def test_stepping_back_and_forward_costs_nothing(text):
    text.append(PROMPT)
    list(text.generate(8, GREEDY))
    end, tokens = text.length, list(text.tokens)
    with text.session.recording() as requests:
        text.step_back(end - 5)
        text.step_forward(end)
        text.step_back(end - 5)
        replay = list(text.generate(4, GREEDY))  # the same greedy tokens: replayed, not searched
    assert requests == [] and all(s.requests == [] and s.read == 0 for s in replay)
    assert text.length == end - 1 and text.tokens == tokens  # the token after the end is still known


def test_cut_and_retry(text, tiny):
    text.append(PROMPT)
    T = len(PROMPT)
    first = [s.token_id for s in text.generate(6, Sampling(1.0, 40, seed=1))]
    text.cut(T + 2)
    assert text.tokens == PROMPT + first[:2]
    again = list(text.generate(3, Sampling(0, 40)))
    assert reads(again[0].requests) == [] and again[0].read == 0  # position T+2's candidates are replayed
    assert all(reads(s.requests) == [1] for s in again[1:])  # then one new token read each
    assert [s.token_id for s in again] == Reference(tiny).greedy(PROMPT + first[:2], 3)
    assert len(text.tokens) == T + 5


def test_same_seed_same_tokens(engine):
    out = []
    for _ in range(2):
        t = Text(engine.open())
        t.append(PROMPT)
        out.append([s.token_id for s in t.generate(8, Sampling(1.0, 40, seed=7))])
        t.close()
    assert out[0] == out[1]


def test_texts_in_threads_are_isolated(engine):
    def alone(seed):
        t = Text(engine.open())
        t.append(PROMPT)
        got = [s.token_id for s in t.generate(8, Sampling(1.0, 40, seed=seed))]
        t.close()
        return got

    want = {seed: alone(seed) for seed in (1, 2)}
    got = {}

    def run(seed):
        got[seed] = alone(seed)

    threads = [threading.Thread(target=run, args=(s,)) for s in (1, 2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert got == want


def test_cancel_leaves_a_consistent_text(text, tiny):
    text.append(PROMPT)
    n = iter(range(100))
    steps = list(text.generate(10, GREEDY, should_stop=lambda: next(n) >= 3))
    assert len(steps) == 3 and text.length == len(PROMPT) + 3
    more = [s.token_id for s in text.generate(3, GREEDY)]
    assert [s.token_id for s in steps] + more == Reference(tiny).greedy(PROMPT, 6)


@pytest.mark.parametrize("op, match", [
    (lambda t: t.branch(999, token_id=5), "outside"),
    (lambda t: t.branch(-1, token_id=5), "outside"),
    (lambda t: t.step_back(-2), "outside"),
    (lambda t: t.step_forward(999), "outside"),
    (lambda t: t.cut(0), "outside"),
    (lambda t: t.branch(3, token_id=50257), "outside the vocabulary"),
    (lambda t: t.branch(3, token_id=-1), "outside the vocabulary"),
    (lambda t: t.branch(3, rank=0), "no candidates"),
    (lambda t: t.branch(len(PROMPT), rank=99), "rank 99"),
    (lambda t: t.branch(3), "token id or a candidate rank"),
    (lambda t: t.append([1] * 200), "context of 128"),
    (lambda t: list(t.generate(200, GREEDY)), "context of 128"),
    (lambda t: list(t.generate(-1, GREEDY)), ">= 0"),
    (lambda t: list(t.generate(1, Sampling(-1, 40))), "temperature"),
    (lambda t: list(t.generate(1, Sampling(1, 0))), "top_k"),
    (lambda t: t.step_back("3"), "integer"),
])
def test_bad_input_leaves_the_text_as_it_was(text, op, match):
    text.append(PROMPT)
    list(text.generate(2, GREEDY))
    before = state(text)
    with pytest.raises(ValueError, match=match):
        op(text)
    assert state(text) == before


def test_lifecycle(engine):
    texts = Texts(engine.open, max_open=2, idle_s=60)
    store = engine.store
    a = texts.create(PROMPT)
    b = texts.create(PROMPT)
    with pytest.raises(TextError, match="2 texts are open"):
        texts.create(PROMPT)
    list(a.generate(1, GREEDY))
    assert a.session.keys_ns in store.namespaces("text-")
    texts.close(a.id)
    assert a.session.keys_ns not in store.namespaces("text-")  # closing deletes its keys
    with pytest.raises(KeyError, match="no open text"):
        texts.get(a.id)
    with pytest.raises(KeyError, match="no open text"):
        texts.get("nope")
    assert texts.expire(now=b.last_used + 61) == [b.id]
    assert len(texts) == 0 and b.session.keys_ns not in store.namespaces("text-")
    with pytest.raises(TextError, match="outside the vocabulary"):
        texts.create([99999])
    assert len(texts) == 0  # a text that failed to open is not left open


def test_a_one_token_prompt_is_a_prefill(text):
    text.append([464])  # "The"
    first, second = text.generate(2, GREEDY)
    assert (first.phase, first.read) == ("prefill", 1) and (second.phase, second.read) == ("decode", 1)
    text.append(tokenizer.encode(" and then"))
    again = next(text.generate(1, GREEDY))
    assert again.phase == "prefill"  # it read the user's appended tokens (and the last generated one)


@pytest.mark.parametrize("op", [
    lambda t: t.append([464]),
    lambda t: t.step_back(2),
    lambda t: t.step_forward(len(PROMPT)),
    lambda t: t.cut(2),
    lambda t: t.branch(2, token_id=5),
    lambda t: t.begin(),
    lambda t: inspector.inspect(t, 2),
    lambda t: views.kv(t),
])
def test_a_generating_text_refuses_edits_and_views(text, op):
    """The text keeps its own rule (not the server): from begin() to end(), no edit, no
    second generation, no inspection or key count; each refusal leaves it as it was."""
    text.append(PROMPT)
    list(text.generate(1, GREEDY))
    text.step_back(len(PROMPT))  # a known token after the end, for step_forward
    text.begin()
    before = state(text)
    with pytest.raises(TextBusy, match="generating"):
        op(text)
    assert state(text) == before
    text.end()
    op(text)  # the same call, the generation over: done


def test_stop_ends_the_generation_begin_claimed(text):
    """A Stop before the generation starts is forgotten (begin clears it); one during it
    ends it at its next token, the text consistent."""
    text.append(PROMPT)
    text.stop()
    stopping = text.begin()
    assert not stopping.is_set()
    got = []
    for step in text.generate(10, GREEDY, should_stop=stopping.is_set):
        got.append(step)
        text.stop()
    text.end()
    assert len(got) == 1 and text.length == len(PROMPT) + 1 and stopping.is_set()


def test_greedy_without_logprobs_searches_only_the_candidates_a_step_keeps(engine, tiny):
    """/v1 at temperature 0 without top_k asks Sampling(0, n_vocab): the pick is the best
    token, so each step's wte search returns the KEEP_CANDIDATES a step holds, never the
    vocabulary; with log-probabilities (full) all n_vocab logits are scored. (The store's
    exact top-k still compares every row; what it returns and decodes is what shrinks.)"""
    V, n = tiny.config.n_vocab, 6
    runs = {full: list(complete(engine.open, PROMPT, n, Sampling(0, V), full=full)) for full in (False, True)}

    def wte(steps):  # (kind, hits returned) of each step's vocabulary search
        return [[(r.kind, r.returned) for r in st.requests if r.kind.startswith("wte")] for st in steps]

    assert wte(runs[False]) == [[("wte.top_k", KEEP_CANDIDATES)]] * n
    assert wte(runs[True]) == [[("wte.all", V)]] * n
    greedy = Reference(tiny).greedy(PROMPT, n)  # numpy: argmax over the whole vocabulary
    assert [st.token_id for st in runs[False]] == [st.token_id for st in runs[True]] == greedy
    # the candidates a step holds are the whole vocabulary's best, in order, at the same scores
    first = Reference(tiny).logits(PROMPT)[-1]  # (V,)
    best = np.argsort(-first, kind="stable")[:KEEP_CANDIDATES]
    for st in (runs[False][0], runs[True][0]):
        assert list(st.ids) == list(best)
        assert np.abs(st.logits - first[best]).max() < 1e-3
    assert runs[False][0].logz is None and runs[True][0].logz is not None


@pytest.mark.parametrize("s, k", [(Sampling(0, 50257), KEEP_CANDIDATES), (Sampling(0, 40), 40),
                                  (Sampling(0.8, 50257), 50257), (Sampling(0.8, 500), 500)])
def test_the_candidates_a_sampling_needs(s, k):
    assert s.search_k(KEEP_CANDIDATES) == k
