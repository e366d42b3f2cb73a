"""The turbopuffer backend's own logic, against the local emulator (tests/tpuf_emulator.py),
which is not the service: what the store refuses before it sends anything, how it keeps to
the documented limits, and how it reads answers. The contract suite runs the same store
on the real service when TURBOPUFFER_API_KEY is set and TURBOPUFFER_BASE_URL is not."""

import json
import uuid

import numpy as np
import pytest

from puffergpt.stores.base import Query, StoreError
from puffergpt.stores.turbopuffer import IN_FLIGHT, MAX_TOP_K, MULTI_QUERY, TurbopufferStore, tpuf_filter
from tpuf_emulator import running

SCHEMA = {"matrix": "str", "row": "int"}


@pytest.fixture(autouse=True)
def no_service_settings(monkeypatch):
    for var in ("TURBOPUFFER_REGION", "TURBOPUFFER_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


def store_on(emu, **settings) -> TurbopufferStore:
    return TurbopufferStore(emu.api_key, base_url=emu.url, prefix=f"t{uuid.uuid4().hex[:6]}-", **settings)


@pytest.fixture
def emu():
    with running() as e:
        yield e
        assert e.internal_errors == []


def test_filters_translate_to_turbopuffer():
    assert tpuf_filter((("matrix", "=", "h.0.mlp.c_fc"),)) == ("matrix", "Eq", "h.0.mlp.c_fc")
    f = tpuf_filter((("layer", "=", np.int64(3)), ("pos", "<=", 7), ("head", "in", np.array([1, 2]))))
    assert f == ("And", [("layer", "Eq", 3), ("pos", "Lte", 7), ("head", "In", [1, 2])])
    assert json.dumps(f)  # numpy integers inside an In list would break the client's JSON
    assert tpuf_filter(()) is None


def test_settings_that_are_missing_are_clear_errors(monkeypatch):
    with pytest.raises(StoreError, match="TURBOPUFFER_API_KEY"):
        TurbopufferStore(api_key=None, region="gcp-us-central1")
    with pytest.raises(StoreError, match="needs a region: set TURBOPUFFER_REGION"):
        TurbopufferStore(api_key="k", region=None)
    monkeypatch.setenv("TURBOPUFFER_REGION", "gcp-us-central1")  # and a base URL: the client refuses both
    with pytest.raises(StoreError, match="can't set up the turbopuffer client: region is set"):
        TurbopufferStore(api_key="k", base_url="http://127.0.0.1:9")


def test_limits_match_the_documentation():
    assert (MULTI_QUERY, IN_FLIGHT, MAX_TOP_K) == (16, 16, 10_000)
    assert TurbopufferStore.metrics == ("cosine_distance", "euclidean_squared")  # no inner product there
    assert TurbopufferStore.max_top_k < MAX_TOP_K  # a full answer means "too many matched"


def test_a_fresh_account_is_empty_not_an_error(emu):
    s = store_on(emu)
    assert s.namespaces() == [] and s.get_meta("manifest:gpt2") is None  # 404s: nothing written yet
    s.create_namespace("m", 3, SCHEMA)
    assert s.namespaces() == ["m"] and s.count("m") == 0
    with pytest.raises(StoreError, match="no document 'w.0'"):
        s.fetch("m", ["w.0"])
    assert s.search("m", [Query(np.ones(3, np.float32), (("matrix", "=", "w"),))], "cosine_distance").query.size == 0
    assert [e["path"] for e in emu.log if e["status"] == 404]  # it did ask, and read the 404 as empty
    assert all(e["path"].startswith(f"/v2/namespaces/{s.prefix}") or e["path"] == "/v1/namespaces" for e in emu.log)


def test_metadata_larger_than_a_filterable_value(emu):
    s = store_on(emu)
    manifest = {"matrices": {f"h.{i}.mlp.c_fc": {"sha256": "ab" * 32, "rows": 3072} for i in range(48)}}
    assert len(json.dumps(manifest)) > 4096  # GPT-2's manifest is about 11 KB
    s.put_meta("manifest:gpt2", manifest)
    assert s.get_meta("manifest:gpt2") == manifest
    assert emu.namespaces[s.prefix + "_meta"].schema["value"]["filterable"] is False
    assert emu.limit_errors == []


def test_what_the_service_would_refuse_is_refused_before_sending(emu):
    s = store_on(emu)
    s.create_namespace("m", 3, SCHEMA)
    sent = len(emu.log)
    cases = [
        (
            lambda: s.upsert("m", ["x" * 65], np.zeros((1, 3)), {"matrix": ["a"], "row": [0]}),
            "over turbopuffer's 64 bytes",
        ),
        (lambda: s.upsert("m", ["x"], np.zeros((1, 3)), {"matrix": ["a" * 5000], "row": [0]}), "at most 4096"),
        (lambda: s.search("m", [Query(np.ones(3, np.float32))], "cosine_distance"), "needs a filter"),
        (
            lambda: s.search("m", [Query(np.ones(3, np.float32), (("row", "=", 0),))], "euclidean_squared"),
            "fixes the metric",
        ),
        (
            lambda: s.search(
                "m", [Query(np.ones(3, np.float32), (("row", "=", 0),), top_k=MAX_TOP_K + 1)], "cosine_distance"
            ),
            "top_k",
        ),
        (lambda: s.create_namespace("n" * 130, 3, SCHEMA), "invalid namespace|over turbopuffer's 128 bytes"),
        (lambda: s.create_namespace("n" * 60, 3, SCHEMA), "over 54 bytes"),
        (lambda: s.create_namespace("big", 10_753, SCHEMA), "1 to 10752"),
        (lambda: s.create_namespace("bad", 3, {"x": "complex"}), "has type 'complex'"),
        (lambda: s.put_meta("manifest:" + "k" * 60, {}), "64-byte id limit"),
    ]
    for call, words in cases:
        with pytest.raises(StoreError, match=words):
            call()
    assert len(emu.log) == sent  # nothing of it reached the service


def test_a_batch_keeps_to_16_queries_in_flight_and_answers_each_query():
    with running(query_delay=0.02) as emu:
        s = store_on(emu)
        rng = np.random.default_rng(0)
        docs = rng.standard_normal((30, 4)).astype(np.float32)
        s.create_namespace("m", 4, SCHEMA, "euclidean_squared")
        s.upsert("m", [f"w.{i}" for i in range(30)], docs, {"matrix": ["w"] * 30, "row": np.arange(30)})
        q = rng.standard_normal((200, 4)).astype(np.float32)
        hits = s.search("m", [Query(v, (("matrix", "=", "w"), ("row", "<", 10 + i % 20))) for i, v in enumerate(q)],
                        "euclidean_squared", include=("row",))
        assert emu.limit_errors == [] and emu.max_in_flight[s.prefix + "m"] == IN_FLIGHT  # used, never passed
        want = ((q[:, None].astype(np.float64) - docs[None]) ** 2).sum(-1)
        for i in range(200):
            sel = hits.query == i
            assert sorted(hits.attrs["row"][sel]) == list(range(10 + i % 20))
            np.testing.assert_allclose(hits.distance[sel], want[i, hits.attrs["row"][sel]], rtol=1e-5, atol=1e-5)
        multi = [e for e in emu.log if e["kind"] == "query" and e["status"] == 200]
        assert len(multi) == -(-200 // MULTI_QUERY)


def test_billing_is_counted_from_the_answers(emu):
    s = store_on(emu)
    s.create_namespace("m", 4, SCHEMA)
    s.upsert("m", ["a", "b"], np.ones((2, 4), np.float32), {"matrix": ["w", "w"], "row": [0, 1]})
    written = s.billed["written"]
    assert written >= 2 * 16  # at least the vectors, as the emulator bills logical bytes
    s.search("m", [Query(np.ones(4, np.float32), (("matrix", "=", "w"),))], "cosine_distance")
    assert s.billed["queried"] > 0 and s.billed["returned"] > 0 and s.billed["written"] == written


def test_writes_go_in_batches_under_the_request_size():
    with running() as emu:
        s = store_on(emu)
        dim, n = 3074, 1500  # GPT-2's mlp.c_proj documents
        s.create_namespace("m", dim, SCHEMA)
        s.upsert(
            "m", [f"w.{i}" for i in range(n)], np.ones((n, dim), np.float32), {"matrix": ["w"] * n, "row": np.arange(n)}
        )
        writes = [e for e in emu.log if e["kind"] == "write" and e["path"].endswith("-m")]
        assert len(writes) == -(-n // 512) and s.count("m") == n and emu.limit_errors == []


def test_reads_after_a_write_see_all_of_it_while_the_index_lags(capsys):
    """turbopuffer's reads see at most 128 MiB of unindexed writes: the store waits for the
    index before it would write more (here scaled down: 100 kB visible, indexing 200 kB/s)."""
    with running(index_rate=2e5, visible_unindexed=100_000) as emu:
        n, dim = 1000, 64  # 256 kB of vectors
        docs = np.random.default_rng(1).standard_normal((n, dim)).astype(np.float32)
        attrs = {"matrix": ["w"] * n, "row": np.arange(n)}
        ids = [f"w.{i}" for i in range(n)]
        careless = store_on(emu, unindexed_limit=10**12)  # never waits: what a read would miss
        careless.create_namespace("m", dim, SCHEMA)
        careless.upsert("m", ids, docs, attrs)
        assert careless.count("m") < n
        s = store_on(emu, unindexed_limit=80_000, index_poll_s=0.02)
        s.create_namespace("m", dim, SCHEMA)
        s.upsert("m", ids, docs, attrs)
        assert s.count("m") == n
        np.testing.assert_array_equal(s.fetch("m", ids), docs)
        assert "turbopuffer is indexing" in capsys.readouterr().err
        assert emu.limit_errors == []
