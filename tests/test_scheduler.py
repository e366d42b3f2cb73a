"""Many texts at once: searches merged across texts (scheduler.Batcher) give each text
exactly what it gets alone; generation slots (scheduler.Scheduler) queue, stop and free.
No timing is asserted: the speed is measured by ``puffergpt bench --clients``."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from helpers import LOGIT_BOUNDS, assert_close
from puffergpt.model import tokenizer
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.search.engine import Engine
from puffergpt.search.manifest import open_engine
from puffergpt.search.scheduler import Batcher, Scheduler, split
from puffergpt.stores import Query
from puffergpt.stores.base import Hits, StoreError
from puffergpt.texts.text import Text

PROMPTS = ["The list", "A man", "A cat", "The quick brown fox jumps over the lazy dog"]


def run_together(fn, args):
    """fn(arg) for every arg, each in a thread of its own, started together: {arg: result}."""
    out, errors, start = {}, [], threading.Barrier(len(args))

    def one(a):
        try:
            start.wait()
            out[a] = fn(a)
        except BaseException as e:  # surfaced below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out


# --- the batcher on a store: merged searches are each text's own -------------------------

@pytest.fixture
def rows_store(tmp_path):
    from puffergpt.stores import open_store

    rng = np.random.default_rng(0)
    w = rng.standard_normal((300, 16)).astype(np.float32)
    store = open_store("embedded", tmp_path)
    store.create_namespace("w", 16, {"matrix": "str", "row": "int"}, "inner_product")
    half = ["a"] * 150 + ["b"] * 150
    store.upsert("w", [f"r{i}" for i in range(300)], w, {"matrix": half, "row": np.arange(300)})
    yield store, w
    store.close()


def test_merged_searches_answer_each_asker_as_numpy_does(rows_store):
    """Eight threads search at once, with other filters and top-k each; with a long gather
    they share requests, and each gets exactly its own hits: numpy's scores, to 1e-5."""
    store, w = rows_store
    b = Batcher(store, gather_s=2.0)
    rng = np.random.default_rng(1)
    asks = {i: [Query(rng.standard_normal(16).astype(np.float32), (("matrix", "=", "ab"[i % 2]),),
                      top_k=None if i % 3 else 5) for _ in range(1 + i % 3)] for i in range(8)}

    stepping = threading.Barrier(len(asks))

    def ask(i):
        with b.stepping():
            stepping.wait()  # every text is in its step before any asks: the first leader waits for all
            return b.search("w", asks[i], "inner_product", ("row",), gather=True)

    got = run_together(ask, list(asks))
    stats = b.stats()
    assert stats.asks == 8 and stats.requests < 8 and stats.merged >= 2, stats
    for i, (hits, shared) in got.items():
        assert shared >= 1
        for j, q in enumerate(asks[i]):
            mine = hits.query == j
            rows = np.arange(150) + (150 if i % 2 else 0)
            want = w[rows] @ q.vector
            order = np.argsort(-want, kind="stable")
            if q.top_k is not None:
                assert list(hits.attrs["row"][mine]) == list(rows[order[:q.top_k]]), f"ask {i} query {j}: top-k rows"
                assert_close(f"ask {i} query {j} top-k", hits.distance[mine], want[order[:q.top_k]], 1e-5)
            else:
                by_row = dict(zip(hits.attrs["row"][mine], hits.distance[mine], strict=True))
                assert sorted(by_row) == list(rows), f"ask {i} query {j}: every row of its matrix"
                assert_close(f"ask {i} query {j}", [by_row[r] for r in rows], want, 1e-5)


def test_a_bad_search_fails_alone(rows_store):
    """A merged request that fails is asked again text by text: only the bad one errs."""
    store, w = rows_store
    b = Batcher(store, gather_s=2.0)
    good = [Query(w[0], (("matrix", "=", "a"),))]
    bad = [Query(w[0][:8], (("matrix", "=", "a"),))]  # the same product, a vector of the wrong length

    stepping = threading.Barrier(2)

    def ask(which):
        with b.stepping():
            stepping.wait()
            try:
                return b.search("w", good if which == "good" else bad, "inner_product", ("row",), gather=True)
            except StoreError as e:
                return e

    got = run_together(ask, ["good", "bad"])
    assert b.stats().requests == 3, b.stats()  # one merged that failed, then each alone
    assert isinstance(got["bad"], StoreError) and "shape (8,)" in str(got["bad"]), got["bad"]
    hits, _ = got["good"]
    assert sorted(hits.attrs["row"]) == list(range(150))


def test_split_keeps_each_queries_order():
    hits = Hits(np.array([2, 0, 2, 1, 0]), np.array([9., 8., 7., 6., 5.]), {"row": np.array([20, 0, 21, 10, 1])})
    a, b = split(hits, [2, 1], ("row",))
    assert list(a.query) == [0, 0, 1] and list(a.attrs["row"]) == [0, 1, 10] and list(a.distance) == [8, 5, 6]
    assert list(b.query) == [0, 0] and list(b.attrs["row"]) == [20, 21] and list(b.distance) == [9, 7]


# --- texts generating together on the engine ------------------------------------------

@pytest.fixture
def demo_engine(loaded, demo):
    store, key = loaded(demo)
    engine = open_engine(store, demo.name, key)
    engine.batcher.gather_s = 1.0  # texts wait for each other as long as it takes: merging is sure
    return engine


def generate(engine_or_ckpt, prompt: str, s: Sampling, n: int = 8):
    t = Text(engine_or_ckpt.open() if isinstance(engine_or_ckpt, Engine) else Run(NumpyWeights(engine_or_ckpt)))
    try:
        t.append(tokenizer.encode(prompt))
        steps = list(t.generate(n, s))
        return [(st.token_id, st.ids.copy(), st.logits.copy(), [r.shared for r in st.requests]) for st in steps]
    finally:
        t.close()


@pytest.mark.parametrize("s", [Sampling(0.0), Sampling(1.0, 40, seed=7)], ids=["greedy", "sampled"])
def test_texts_together_equal_texts_alone_and_numpy(demo_engine, demo, s):
    """Four texts generate at once: each writes the tokens it writes alone, with the same
    candidates and logits (to the digit), and numpy's own forward pass agrees to LOGIT_BOUNDS;
    some of their searches went to the store as one request."""
    alone = {p: generate(demo_engine, p, s) for p in PROMPTS}
    together = run_together(lambda p: generate(demo_engine, p, s), PROMPTS)
    shared = max(x for steps in together.values() for *_, sh in steps for x in sh)
    assert shared >= 2, "no request was shared by two texts"
    for p in PROMPTS:
        a, t = alone[p], together[p]
        assert [x[0] for x in t] == [x[0] for x in a], f"{p!r}: tokens together differ from alone"
        for i, (x, y) in enumerate(zip(t, a, strict=True)):
            assert list(x[1]) == list(y[1]), f"{p!r} step {i}: candidates differ"
            assert_close(f"{p!r} step {i} logits together vs alone", x[2], y[2], 1e-6)
        ref = generate(demo, p, s)
        assert [x[0] for x in ref] == [x[0] for x in t], f"{p!r}: numpy writes other tokens"
        for i, (x, y) in enumerate(zip(t, ref, strict=True)):
            k = min(10, len(y[1]))
            assert list(x[1][:k]) == list(y[1][:k]), f"{p!r} step {i}: top-{k} differ from numpy"
            assert_close(f"{p!r} step {i} logits vs numpy", x[2][:k], y[2][:k], LOGIT_BOUNDS["inner_product"])


# --- slots: a bound on texts generating at once ---------------------------------------------

@pytest.fixture
def one_slot(loaded, demo):
    """An engine with one slot, and two texts on it: the first holding the slot (its
    generation begun, ``should_stop`` its stop event), the second's generation queued in a
    thread. -> (engine, first's generation, first's stop, second, second's stop, {"steps"}, thread)"""
    store, key = loaded(demo)
    demo_engine = open_engine(store, demo.name, key, scheduler=Scheduler(max_running=1))
    first, second = Text(demo_engine.open()), Text(demo_engine.open())
    stops, got = (threading.Event(), threading.Event()), {}
    try:
        first.append(tokenizer.encode("The list"))
        second.append(tokenizer.encode("A man"))
        gen = first.generate(50, Sampling(0.0), should_stop=stops[0].is_set)
        next(gen)  # the first holds the slot
        th = threading.Thread(target=lambda: got.setdefault(
            "steps", list(second.generate(3, Sampling(0.0), should_stop=stops[1].is_set))))
        th.start()
        wait_for(lambda: demo_engine.scheduler.status()["queued"] == 1)
        yield demo_engine, gen, stops[0], second, stops[1], got, th
    finally:
        stops[1].set()
        first.close()
        second.close()


def test_a_queued_generation_waits_its_turn_and_a_stop_frees_the_slot(one_slot):
    """One slot: the second text waits (queued) while the first generates; the first's Stop
    frees the slot at its next token, and the second then runs to the end."""
    engine, gen, stop_first, _, _, got, th = one_slot
    assert engine.scheduler.status() == {"running": 1, "queued": 1, "max_running": 1}
    next(gen)  # the first goes on while the second waits
    assert "steps" not in got
    stop_first.set()
    assert list(gen) == []  # stopped at its next token, before computing it
    th.join(60)
    assert len(got["steps"]) == 3
    assert engine.scheduler.status() == {"running": 0, "queued": 0, "max_running": 1}


def test_a_stop_while_queued_leaves_the_queue(one_slot):
    engine, gen, _, second, stop_second, got, th = one_slot
    stop_second.set()  # a Stop, or a client that left
    th.join(10)
    assert got["steps"] == [] and second.length == len(tokenizer.encode("A man"))
    assert engine.scheduler.status()["queued"] == 0
    gen.close()  # a closed generation frees its slot too
    assert engine.scheduler.status()["running"] == 0


@pytest.mark.parametrize("bad", [0, 1001, True, 2.5])
def test_a_scheduler_needs_a_bound_of_1_to_1000(bad):
    with pytest.raises(ValueError, match="max_running must be in 1..1000"):
        Scheduler(bad)


def wait_for(cond, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.01)
