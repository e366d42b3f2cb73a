"""The sweep of texts' key namespaces (issue 32, item 2): a text in use keeps its keys however
long it lives, an idle one loses them (and its server then says it is gone), and the keys of
a text whose server died are dropped by another server. On a clock the test moves, over the
embedded store; tests/stores/test_pg_servers.py does it with real servers on PostgreSQL.

Two "servers" here are two engines over one store: what a server holds of a text is its
``Texts``; the namespace of a text's keys is the store's, which every server sees."""

from __future__ import annotations

import numpy as np
import pytest

from puffergpt.model import tokenizer
from puffergpt.model.sampling import Sampling
from puffergpt.search import sweeper
from puffergpt.search.engine import KEY_SCHEMA
from puffergpt.search.manifest import open_engine
from puffergpt.texts.registry import Texts
from puffergpt.texts.text import TextNotFound

TTL = 100.0


class Clock:
    def __init__(self):
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def servers(loaded, demo, clock):
    """servers(n) -> n engines over one store, on the test's clock; their texts closed at the end."""
    store, key = loaded(demo)
    made: list[Texts] = []

    def make(n: int) -> list:
        engines = [open_engine(store, demo.name, key, text_ttl_s=TTL, clock=clock) for _ in range(n)]
        made.extend(Texts(e.open) for e in engines)
        return engines, made[-n:]

    yield make
    for texts in made:
        texts.close_all()
    for ns in store.namespaces("text-"):  # what a test left behind on purpose (a dead server's)
        store.drop_namespace(ns)


def keys_of(store) -> set[str]:
    return {ns for ns in store.namespaces("text-")}


def test_a_text_in_use_keeps_its_keys_an_idle_one_loses_them(servers, clock):
    (a, b), (texts_a, _) = servers(2)
    sweep = sweeper.Sweeper(b.store, TTL, clock)  # the other server's sweep
    busy = texts_a.create(tokenizer.encode("He said"))
    idle = texts_a.create(tokenizer.encode("She said"))
    for _ in range(12):  # three TTLs, a use every quarter of one
        clock.now += TTL / 4
        texts_a.get(busy.id)
        list(busy.generate(1, Sampling(0, 40)))
        assert sweep.sweep() in ([], [idle.session.keys_ns])
    assert busy.session.keys_ns in keys_of(a.store) and idle.session.keys_ns not in keys_of(a.store)
    # The idle text's server says it is gone (a 404 text_not_found: the page reopens it) and lets go of it.
    with pytest.raises(TextNotFound, match="unused past its TTL"):
        texts_a.get(idle.id)
    assert idle.id not in texts_a._texts
    assert texts_a.get(busy.id) is busy


def test_the_keys_of_a_dead_servers_text_are_dropped_by_another_server(servers, clock):
    (dead, alive), (texts_dead, texts_alive) = servers(2)
    lost = texts_dead.create(tokenizer.encode("He said"))
    list(lost.generate(2, Sampling(0, 40)))
    ns = lost.session.keys_ns
    texts_dead._texts.clear()  # kill -9: the server is gone, nothing closes its text
    mine = texts_alive.create(tokenizer.encode("She said"))
    sweep = sweeper.Sweeper(alive.store, TTL, clock)
    assert sweep.sweep() == [] and ns in keys_of(alive.store)  # within its TTL: kept
    clock.now += TTL * (1 - sweeper.RENEW)
    texts_alive.get(mine.id)  # the living server's text is used
    clock.now += TTL * sweeper.RENEW + 1
    assert sweep.sweep() == [ns]  # past the dead server's TTL: dropped
    assert keys_of(alive.store) == {mine.session.keys_ns}
    assert sweeper.read_expiry(alive.store, mine.session.keys_ns) > clock.now


def test_the_expiry_moves_on_at_most_once_a_quarter_of_the_ttl(servers, clock):
    (a,), (texts,) = servers(1)
    t = texts.create(tokenizer.encode("He said"))
    ns = t.session.keys_ns
    first = sweeper.read_expiry(a.store, ns)
    assert first == pytest.approx(clock.now + TTL, abs=1)
    clock.now += TTL * sweeper.RENEW / 2
    texts.get(t.id)
    assert sweeper.read_expiry(a.store, ns) == first  # not written again so soon
    clock.now += TTL * sweeper.RENEW
    texts.get(t.id)
    assert sweeper.read_expiry(a.store, ns) == pytest.approx(clock.now + TTL, abs=1)


def test_the_expiry_is_no_key(servers, clock):
    """The expiry document lives in the text's namespace, and no attention search or key count sees it."""
    (a,), (texts,) = servers(1)
    t = texts.create(tokenizer.encode("He said to me"))
    list(t.generate(2, Sampling(0, 40)))
    c = a.config
    assert t.session.key_counts() == [c.n_head * t.read_upto] * c.n_layer
    assert a.store.count(t.session.keys_ns) == c.n_layer * c.n_head * t.read_upto + 1  # and the expiry


def test_a_namespace_without_an_expiry_goes_a_ttl_after_it_was_first_seen(servers, clock):
    (a,), _ = servers(1)
    ns = "text-0123456789abcdef"  # made by an older puffergpt, or a server that died making it
    a.store.create_namespace(ns, a.config.head_dim, a.key_schema, a.key_metric, ephemeral=True)
    other = "text-made-by-hand"  # not a text's name: never swept
    a.store.create_namespace(other, 4, KEY_SCHEMA, a.key_metric, ephemeral=True)
    sweep = sweeper.Sweeper(a.store, TTL, clock)
    assert sweep.sweep() == []
    clock.now += TTL / 2
    assert sweep.sweep() == []
    clock.now += TTL / 2 + 1
    assert sweep.sweep() == [ns] and keys_of(a.store) == {other}


def test_the_holder_stops_using_a_text_a_little_before_its_expiry(clock, loaded, demo):
    store, _ = loaded(demo)
    ns = "text-fedcba9876543210"
    store.create_namespace(ns, 8, KEY_SCHEMA, "inner_product", ephemeral=True)
    try:
        lease = sweeper.Lease(store, ns, KEY_SCHEMA, 8, TTL, clock)
        clock.now += TTL * (1 - sweeper.GRACE) - 1
        assert lease.renew()  # used in time: moved on
        clock.now += TTL * (1 - sweeper.GRACE) + 1
        assert not lease.renew()  # too late: another server may be dropping it now
        assert sweeper.read_expiry(store, ns) < clock.now + sweeper.GRACE * TTL  # and nothing was written
    finally:
        store.drop_namespace(ns)


@pytest.mark.parametrize("ttl", [0, -1, float("nan")])
def test_a_ttl_must_be_positive(loaded, demo, ttl):
    store, key = loaded(demo)
    with pytest.raises(ValueError, match="positive number of seconds"):
        open_engine(store, demo.name, key, text_ttl_s=ttl)


def test_the_expiry_document_fits_every_key_schema():
    ids, v, attrs = sweeper.expiry_document(KEY_SCHEMA | {"norm2": "float"}, 16, 12.2)
    assert ids == ["expiry"] and v.shape == (1, 16) and attrs["pos"] == [13] and attrs["norm2"] == [16.0]
    assert np.all(v == 1) and attrs["layer"] == [sweeper.EXPIRY_LAYER] and sweeper.EXPIRY_LAYER < 0
