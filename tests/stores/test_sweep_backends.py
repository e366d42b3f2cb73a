"""The sweep over every backend (issue 32, item 2): written once over the Store seam
(``sweeper.py``), so each backend must carry a text namespace's expiry, read it back, list the
``text-`` namespaces by prefix, and drop the expired ones, leaving the rest. Two stores on one
database play two servers where the backend is shared (pgvector, turbopuffer)."""

from __future__ import annotations

import numpy as np
import pytest

from puffergpt.search import sweeper
from puffergpt.search.engine import KEY_SCHEMA
from puffergpt.stores import backends, open_store

TTL = 60.0
HD = 8


class Clock:
    now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=[b for b in backends() if b != "zvec"])  # zvec: the contract suite runs it where it can
def stores(request, tmp_path):
    """Two stores on one backend: on one database where it is shared, else the same object."""
    options = {}
    if request.param == "pgvector":
        options = {"dsn": request.getfixturevalue("pg_dsn")}
    if request.param == "turbopuffer":
        options = request.getfixturevalue("tpuf_options")
    a = open_store(request.param, tmp_path, **options)
    b = open_store(request.param, tmp_path, **options) if request.param in ("pgvector", "turbopuffer") else a
    yield a, b
    for ns in a.namespaces():
        a.drop_namespace(ns)
    if request.param == "turbopuffer":
        a.forget()
    for s in {id(a): a, id(b): b}.values():
        s.close()


def text_ns(store, name: str, metric: str) -> str:
    schema = KEY_SCHEMA if metric == "inner_product" else KEY_SCHEMA | {"norm2": "float"}
    store.create_namespace(name, HD, schema, metric, ephemeral=True)
    keys = np.random.default_rng(0).standard_normal((3, HD)).astype(np.float32)
    attrs = {"layer": [0, 0, 0], "head": [0, 0, 0], "pos": [0, 1, 2]}
    if "norm2" in schema:
        attrs["norm2"] = (keys.astype(np.float64) ** 2).sum(axis=1)
    store.upsert(name, ["h.0.0.0", "h.0.0.1", "h.0.0.2"], keys, attrs)
    return name


def test_any_server_drops_an_expired_text_and_keeps_the_others(stores):
    a, b = stores
    metric = a.metrics[0]
    schema = KEY_SCHEMA if metric == "inner_product" else KEY_SCHEMA | {"norm2": "float"}
    clock = Clock()
    used = text_ns(a, "text-00000000000000a1", metric)
    dead = text_ns(a, "text-00000000000000d1", metric)
    keep = sweeper.Lease(a, used, schema, HD, TTL, clock)
    sweeper.Lease(a, dead, schema, HD, TTL, clock)  # its server dies: never renewed
    other = text_ns(a, "text-keys-made-by-hand", metric)  # not a text's name: never swept
    assert sweeper.read_expiry(b, dead) == pytest.approx(clock.now + TTL, abs=1)
    sweep = sweeper.Sweeper(b, TTL, clock)  # the other server
    assert sweep.sweep() == []
    for _ in range(5):  # past the dead one's TTL, the used one renewed every half
        clock.now += TTL / 2
        assert keep.renew()
        sweep.sweep()
    assert set(b.namespaces("text-")) == {used, other}
    assert b.count(used, (("layer", "=", 0),)) == 3  # its keys untouched by the expiry
