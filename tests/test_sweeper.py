"""The sweep of texts' key namespaces (issue 32, item 2): a text in use keeps its keys however
long it lives, an idle one loses them (and its server then says it is gone), and the keys of
a text whose server died are dropped by another server. On a clock the test moves, over the
embedded store; tests/stores/test_pg_servers.py does it with real servers on PostgreSQL.

Two "servers" here are two engines over one store: what a server holds of a text is its
``Texts``; the namespace of a text's keys is the store's, which every server sees."""

from __future__ import annotations

import json
import logging
import threading
import time

import httpx
import numpy as np
import pytest

from puffergpt.app.completion import choice_text
from puffergpt.model import tokenizer
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import KeysExpired, Run
from puffergpt.search import sweeper
from puffergpt.search.engine import KEY_SCHEMA
from puffergpt.search.manifest import open_engine
from puffergpt.search.scheduler import Scheduler
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import serving
from puffergpt.stores.base import StoreError
from puffergpt.texts.registry import Texts
from puffergpt.texts.text import Text, TextNotFound

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
    with pytest.raises(TextNotFound, match="unused past their TTL"):
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


# --- a text held is never swept (issue 43, item 3): kept while it waits and while it works ----------

def reference_ids(ckpt, ids: list[int], n: int) -> list[int]:
    """n greedy tokens after ids, through numpy: the independent reference."""
    t = Text(Run(NumpyWeights(ckpt)))
    t.append(list(ids))
    return [st.token_id for st in t.generate(n, Sampling(0, 40))]


def slowed(store, monkeypatch, delay_s: float) -> None:
    """Each search of the store made delay_s slower: a generation outlasts the TTL on any machine."""
    search = store.search

    def slow(*a, **k):
        time.sleep(delay_s)
        return search(*a, **k)

    monkeypatch.setattr(store, "search", slow)


def test_a_queued_text_and_a_v1_request_behind_it_are_not_swept(loaded, tiny, monkeypatch):
    """The issue's run: --text-ttl 2 --max-running 1, two texts asking many tokens at once and a
    /v1 request behind them, each waiting far past the TTL while the server sweeps every 0.5 s:
    all finish, with the reference's tokens."""
    store, key = loaded(tiny)
    slowed(store, monkeypatch, 0.02)  # ~0.25 s a token: each generation takes ~3 s, past the TTL
    engine = open_engine(store, tiny.name, key, text_ttl_s=2, scheduler=Scheduler(1))
    prompts, n = {"a": "He said", "b": "She said", "v1": "The list"}, 12
    with serving(create_app(engine, ServerConfig(max_open_texts=4))) as url:
        def generate(name: str):
            if name == "v1":
                time.sleep(0.5)  # behind both texts in the queue
                r = httpx.post(url + "/v1/completions", json={"model": tiny.name, "prompt": prompts[name],
                                                               "max_tokens": n, "temperature": 0}, timeout=120)
                return r.status_code, r.json()
            tid = httpx.post(url + "/api/texts", json={"prompt": prompts[name]}).json()["id"]
            r = httpx.post(url + f"/api/texts/{tid}/generate", json={"max_tokens": n, "temperature": 0}, timeout=120)
            evs = [(e, json.loads(d)) for e, d in sse_events(r.text)]
            assert evs[-1][0] == "done", evs[-1]  # no error event: not "namespace ... does not exist"
            return httpx.get(url + f"/api/texts/{tid}").json()  # still held: no 404
        got = run_together(generate, list(prompts))
    for name in ("a", "b"):
        ids = tokenizer.encode(prompts[name])
        assert [t["token_id"] for t in got[name]["tokens"]] == ids + reference_ids(tiny, ids, n)
    status, body = got["v1"]
    assert status == 200, body  # not 503 "the store failed"
    want = reference_ids(tiny, tokenizer.encode(prompts["v1"]), n)
    assert body["choices"][0]["text"] == choice_text(want)[0]


def sse_events(text: str) -> list[tuple[str | None, str]]:
    out, event = [], None
    for line in text.splitlines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            out.append((event, line[6:]))
    return out


def test_a_text_waiting_for_its_turn_keeps_its_lease_on_the_real_clock(loaded, tiny, monkeypatch):
    """In-process: a text queued behind a long generation, with another server sweeping all the
    while, keeps its keys until its generation ends (then, idle past the TTL, it may go), and
    generates what the reference does."""
    store, key = loaded(tiny)
    slowed(store, monkeypatch, 0.02)
    engine = open_engine(store, tiny.name, key, text_ttl_s=1, scheduler=Scheduler(1))
    sweep, stop, dropped = sweeper.Sweeper(store, 1), threading.Event(), {}

    def sweeping():
        while not stop.is_set():
            dropped.update((ns, time.monotonic()) for ns in sweep.sweep())
            time.sleep(0.1)

    texts = Texts(engine.open)
    ids = {p: tokenizer.encode(p) for p in ("He said", "She said")}
    made, ended = {p: texts.create(i) for p, i in ids.items()}, {}

    def generate(p):
        out = [s.token_id for s in made[p].generate(8, Sampling(0, 40))]
        ended[made[p].session.keys_ns] = time.monotonic()
        return out

    sweeper_thread = threading.Thread(target=sweeping, daemon=True)
    sweeper_thread.start()
    try:
        got = run_together(generate, list(ids))
    finally:
        stop.set()
        sweeper_thread.join(10)
        texts.close_all()
    assert max(ended.values()) - min(ended.values()) > 1  # the second waited more than the TTL
    assert not [ns for ns, at in dropped.items() if ns in ended and at < ended[ns]]
    for p, i in ids.items():
        assert got[p] == reference_ids(tiny, i, 8)


def run_together(fn, args):
    """fn(arg) for each arg in a thread of its own, started together: {arg: result}."""
    out, errors = {}, []

    def one(a):
        try:
            out[a] = fn(a)
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=one, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    return out


class Failing:
    """A store whose upserts fail while ``failing`` (the expiry's writes among them)."""

    def __init__(self, store):
        self.store, self.failing, self.tries = store, False, 0

    def __getattr__(self, name):
        return getattr(self.store, name)

    def upsert(self, ns, *args):
        if self.failing:
            self.tries += 1
            raise StoreError("the database is not answering")
        return self.store.upsert(ns, *args)


def test_a_failed_renewal_is_retried_and_reported_then_the_text_says_it_expired(clock, loaded, demo, caplog):
    store, _ = loaded(demo)
    ns = "text-00112233445566ff"
    store.create_namespace(ns, 8, KEY_SCHEMA, "inner_product", ephemeral=True)
    flaky = Failing(store)
    try:
        lease = sweeper.Lease(flaky, ns, KEY_SCHEMA, 8, TTL, clock)
        flaky.failing = True
        clock.now += TTL * sweeper.RENEW + 1  # a renewal is due
        with caplog.at_level(logging.WARNING, "puffergpt"):
            assert lease.keep() and lease.keep()  # failed, not lapsed: tried again at the next call
        assert flaky.tries == 2 and lease.failures == 2 and "renewing the lease" in caplog.text
        flaky.failing = False
        assert lease.keep() and lease.failures == 0  # the store is back: renewed
        assert sweeper.read_expiry(store, ns) == pytest.approx(clock.now + TTL, abs=1)
        flaky.failing = True
        clock.now += TTL * sweeper.RENEW + 1
        assert lease.keep()
        clock.now += TTL  # it kept failing until the expiry came near
        with caplog.at_level(logging.ERROR, "puffergpt"):
            assert not lease.keep()
        assert "could not be renewed" in lease.lapsed and "not answering" in lease.lapsed
        assert "expired" in caplog.text
        flaky.failing = False
        assert not lease.keep()  # over for good: another server may have dropped the keys
    finally:
        store.drop_namespace(ns)


def test_a_text_whose_keys_are_swept_mid_generation_says_it_expired(servers, clock):
    """Its lease over (renewals that kept failing) and its keys dropped by another server: the
    generation ends with KeysExpired saying so, never a store failure; the server lets go of it."""
    (a,), (texts,) = servers(1)
    t = texts.create(tokenizer.encode("He said"))
    list(t.generate(1, Sampling(0, 40)))
    a.store.drop_namespace(t.session.keys_ns)  # swept by another server
    with pytest.raises(KeysExpired, match="expired or was closed"):
        list(t.generate(2, Sampling(0, 40)))
    t.session.lease.lapsed = "its keys' lease could not be renewed"
    with pytest.raises(KeysExpired, match="this text expired: its keys' lease could not be renewed"):
        list(t.generate(1, Sampling(0, 40)))
    with pytest.raises(TextNotFound, match="expired"):
        texts.get(t.id)
    assert t.id not in texts._texts


def test_an_expired_text_is_a_404_text_not_found_and_a_v1_request_a_503_text_expired(loaded, tiny, monkeypatch):
    store, key = loaded(tiny)
    engine = open_engine(store, tiny.name, key)
    with serving(create_app(engine, ServerConfig(max_open_texts=4))) as url:
        tid = httpx.post(url + "/api/texts", json={"prompt": "He said"}).json()["id"]
        served = next(iter(ns for ns in store.namespaces("text-")))
        store.drop_namespace(served)  # the text's keys swept under it
        r = httpx.post(url + f"/api/texts/{tid}/generate", json={"max_tokens": 3, "temperature": 0}, timeout=60)
        event, data = sse_events(r.text)[-1]
        data = json.loads(data)
        assert event == "error" and data["code"] == "text_not_found" and "expired" in data["detail"]
        assert "store failed" not in data["detail"]
        def lapse(lease):  # every new lease over at once, as after renewals that kept failing
            lease.lapsed = "its keys' lease could not be renewed (3 tries failed)"
            return False

        monkeypatch.setattr(sweeper.Lease, "renew", lapse)
        r = httpx.post(url + "/v1/completions", json={"model": tiny.name, "prompt": "Hi", "max_tokens": 2}, timeout=60)
        assert r.status_code == 503 and r.json()["error"]["code"] == "text_expired", r.text
