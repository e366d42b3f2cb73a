"""Read replicas of the weights (``stores/replicas.py``): worker processes over copies of the
weights where the embedded store keeps them on Qdrant Edge (its fallback mode: Qdrant holds
Python's lock; on zvec the store needs none) give the same numbers as the store itself and as
numpy, a dead replica costs no search, and every replica and copy goes when they close."""

from __future__ import annotations

import time

import numpy as np
import pytest

from puffergpt import loading
from puffergpt.engine import Engine
from puffergpt.loading import open_engine
from puffergpt.reference import Reference
from puffergpt.sampling import Sampling
from puffergpt.stores import Query, StoreError, open_store
from puffergpt.stores.embedded import EmbeddedStore
from puffergpt.stores.replicas import Replicas
from puffergpt.text import opened


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_dir, tiny):
    store = EmbeddedStore(tmp_path_factory.mktemp("replicas"), fallback=True)
    loading.load(store, tiny, loading.model_key(str(tiny_dir)), progress=False)
    yield open_engine(store, str(tiny_dir))
    store.close()


def product(engine: Engine, name: str, x: np.ndarray) -> np.ndarray:
    with opened(engine.views) as text:
        return text.products.linear(name, x)


def test_products_on_replicas_equal_the_store_and_numpy(engine, tiny):
    """Five rows of c_fc, split between two replicas: the same numbers as the store's own
    search, bit for bit, and x @ W + b from the checkpoint within float32 rounding."""
    x = np.random.default_rng(0).standard_normal((5, tiny.config.n_embd)).astype(np.float32)
    alone = product(engine, "h.0.mlp.c_fc", x)
    with engine.replicated(2) as n:
        assert n == 2 and len(engine.batcher.replicas) == 2
        on_replicas = product(engine, "h.0.mlp.c_fc", x)
        ns = loading.namespace(engine.key, tiny.config.n_embd)
        q = [Query(engine.encoding.queries(x)[0], (("matrix", "=", "wte"),), top_k=7)]
        a = engine.store.search(ns, q, engine.encoding.metric, ("row",))
        b = engine.batcher.replicas.search(ns, q, engine.encoding.metric, ("row",))
    np.testing.assert_array_equal(on_replicas, alone)
    assert a.attrs["row"].tolist() == b.attrs["row"].tolist() and np.array_equal(a.distance, b.distance)
    p = tiny.params
    want = x @ p["h.0.mlp.c_fc.weight"] + p["h.0.mlp.c_fc.bias"]
    diff = np.abs(on_replicas - want)
    assert diff.max() < 1e-4, f"max difference {diff.max():.3g} at {np.unravel_index(diff.argmax(), diff.shape)}"


def test_greedy_tokens_on_replicas_equal_numpy(engine, tiny):
    prompt = [464, 3290, 286, 4881]
    want = Reference(tiny).greedy(prompt, 6)
    with engine.replicated(2):
        with opened(engine.open, prompt) as text:
            steps = list(text.generate(6, Sampling(0.0, 40)))
            shared = engine.batcher.stats()
    assert [s.token_id for s in steps] == want
    assert shared.asks > 0


def test_a_dead_replica_costs_no_search_and_is_started_again(engine, tiny):
    x = np.random.default_rng(1).standard_normal((4, tiny.config.n_embd)).astype(np.float32)
    alone = product(engine, "h.1.attn.c_attn", x)
    with engine.replicated(2):
        reps = engine.batcher.replicas
        victim = reps._all[0]
        victim.process.kill()
        victim.process.wait(10)
        np.testing.assert_array_equal(product(engine, "h.1.attn.c_attn", x), alone)  # its part: the store's
        deadline = time.monotonic() + 60
        while reps.restarts < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reps.restarts == 1 and len(reps._idle) == 2 and victim not in reps._all
        np.testing.assert_array_equal(product(engine, "h.1.attn.c_attn", x), alone)


def test_a_refused_search_is_the_stores_own_error(engine, tiny):
    ns = loading.namespace(engine.key, tiny.config.n_embd)
    q = [Query(np.zeros(tiny.config.n_embd + 1, np.float32), (("matrix", "=", "wte"),))]
    with pytest.raises(StoreError) as direct:
        engine.store.search(ns, q, "inner_product", ("nope",))
    with engine.replicated(1):
        with pytest.raises(StoreError) as replicated:
            engine.batcher.replicas.search(ns, q, "inner_product", ("nope",))
        assert len(engine.batcher.replicas._idle) == 1  # it answered, and is free again
    assert str(replicated.value) == str(direct.value)


def test_replicas_and_their_copies_go_when_closed(engine):
    tmp = engine.store.root / "tmp"
    with engine.replicated(2):
        reps = engine.batcher.replicas
        copies = [r.root for r in reps._all]
        assert all((c / "qdrant").is_dir() and c.parent == tmp for c in copies)
    assert engine.batcher.replicas is None
    assert all(r.process.poll() is not None for r in reps._all)
    assert not any(c.exists() for c in copies)


def test_a_replica_that_cannot_open_its_copy_is_a_clear_error(tmp_path, engine):
    with pytest.raises(StoreError, match=r"could not open its copy .*does not exist.*--replicas 0"):
        Replicas(engine.store, [tmp_path / "empty"], "puffergpt.stores.embedded:EmbeddedStore", ["no.such"])
    with pytest.raises(StoreError, match=r"between 1 and 64"):
        engine.store.replicas(engine.weight_namespaces(), 0)
    on_zvec = open_store("embedded", tmp_path / "zvec")
    assert on_zvec.replicas(["any.768"], 2) is None  # zvec lets go of Python's lock: threads, not processes
    on_zvec.close()

