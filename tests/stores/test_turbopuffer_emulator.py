"""The emulator (tests/tpuf_emulator.py, not the service) refuses what turbopuffer documents
as over a limit, one test a limit, through the official client with no retries; and its
exact kNN agrees with numpy, so the rest of the suite can trust it."""

import threading

import numpy as np
import pytest
import turbopuffer

import tpuf_emulator
from tpuf_emulator import running


@pytest.fixture
def emu():
    with running(query_delay=0.0) as e:
        yield e
        assert e.internal_errors == []


@pytest.fixture
def ns(emu, monkeypatch):
    """A namespace with 3 documents of length 2, cosine, attribute ``tag``."""
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    client = turbopuffer.Turbopuffer(api_key=emu.api_key, base_url=emu.url, max_retries=0)
    n = client.namespace("limits")
    n.write(
        upsert_columns={"id": ["a", "b", "c"], "vector": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], "tag": ["x", "y", "x"]},
        distance_metric="cosine_distance",
    )
    yield n
    client.close()


def refused(emu, call, status, words):
    """``call`` gets ``status``, its message names the limit, and the emulator recorded it."""
    before = len(emu.limit_errors)
    with pytest.raises(turbopuffer.APIStatusError) as e:
        call()
    assert e.value.status_code == status and words in str(e.value.message), e.value.message
    assert len(emu.limit_errors) == before + 1


KNN = ("vector", "kNN", [1.0, 0.0])
FLT = ("tag", "Eq", "x")


def test_more_than_16_queries_in_a_multi_query(emu, ns):
    q = {"rank_by": KNN, "top_k": 1, "filters": FLT}
    assert len(ns.multi_query(queries=[q] * 16).results) == 16
    refused(emu, lambda: ns.multi_query(queries=[q] * 17), 400, "at most 16")


def test_more_than_16_queries_in_flight_on_a_namespace(emu, ns):
    emu.query_delay = 0.5
    clients = [turbopuffer.Turbopuffer(api_key=emu.api_key, base_url=emu.url, max_retries=0) for _ in range(17)]
    start, errors = threading.Barrier(17), []

    def one(client):  # a client each: one client's connection pool would queue them itself
        start.wait()
        try:
            client.namespace("limits").query(rank_by=KNN, top_k=1, filters=FLT)
        except turbopuffer.RateLimitError as e:
            errors.append(e)

    threads = [threading.Thread(target=one, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 1 and "at most 16" in errors[0].message, errors
    assert emu.max_in_flight["limits"] == 16 and len(emu.limit_errors) == 1
    for c in clients:
        c.close()


def test_top_k_over_10000(emu, ns):
    refused(emu, lambda: ns.query(rank_by=KNN, top_k=10_001, filters=FLT), 400, "1 to 10000")


def test_knn_without_a_filter(emu, ns):
    refused(emu, lambda: ns.query(rank_by=KNN, top_k=3), 400, "kNN (exact search) needs filters")


def test_the_metric_is_fixed_per_namespace(emu, ns):
    refused(emu, lambda: ns.write(upsert_columns={"id": ["d"], "vector": [[1.0, 2.0]], "tag": ["x"]},
                                  distance_metric="euclidean_squared"), 400, "can't be changed")
    refused(
        emu,
        lambda: ns.query(rank_by=KNN, top_k=1, filters=FLT, distance_metric="euclidean_squared"),
        400,
        "distance_metric is cosine",
    )


def test_vectors_of_another_length_or_too_long(emu, ns):
    refused(emu, lambda: ns.write(upsert_columns={"id": ["d"], "vector": [[1.0, 2.0, 3.0]], "tag": ["x"]},
                                  distance_metric="cosine_distance"), 400, "the namespace's have 2")
    refused(
        emu,
        lambda: ns.query(rank_by=("vector", "kNN", [1.0, 0.0, 0.0]), top_k=1, filters=FLT),
        400,
        "the namespace's have 2",
    )
    wide = ns._client.namespace("wide")
    refused(
        emu,
        lambda: wide.write(upsert_columns={"id": ["d"], "vector": [[0.5] * 10_753]}, distance_metric="cosine_distance"),
        400,
        "at most 10752",
    )


def test_ids_over_64_bytes(emu, ns):
    refused(emu, lambda: ns.write(upsert_columns={"id": ["é" * 33], "vector": [[1.0, 2.0]], "tag": ["x"]},
                                  distance_metric="cosine_distance"), 400, "over 64 bytes")


def test_namespace_names_over_128_bytes(emu, ns):
    long = ns._client.namespace("n" * 129)
    refused(emu, lambda: long.query(aggregate_by={"n": ("Count",)}), 400, "invalid namespace name")


def test_filterable_values_over_4_kib(emu, ns):
    row = lambda tag: {"id": ["d"], "vector": [[1.0, 2.0]], "tag": [tag]}  # noqa: E731
    refused(
        emu,
        lambda: ns.write(upsert_columns=row("t" * 4097), distance_metric="cosine_distance"),
        400,
        "filterable: false",
    )
    meta = ns._client.namespace("meta")
    meta.write(
        upsert_columns={"id": ["k"], "value": ["v" * 20_000]}, schema={"value": {"type": "string", "filterable": False}}
    )
    assert (
        meta.query(filters=("id", "Eq", "k"), rank_by=("id", "asc"), top_k=1, include_attributes=["value"]).rows[0][
            "value"
        ]
        == "v" * 20_000
    )
    refused(
        emu, lambda: meta.query(filters=("value", "Eq", "v"), rank_by=("id", "asc"), top_k=1), 400, "not filterable"
    )


def test_filters_on_ids_only_as_documented(emu, ns):
    for op, value in (("Glob", "a*"), ("NotEq", "a")):
        refused(emu, lambda op=op, value=value: ns.query(filters=("id", op, value), rank_by=("id", "asc"), top_k=3),
                400, "not documented for ids")
    got = ns.query(filters=("And", [("id", "Gte", "a"), ("id", "Lt", "c")]), rank_by=("id", "asc"), top_k=3).rows
    assert [r.id for r in got] == ["a", "b"]


def test_request_bodies_over_the_size_limit(emu, ns, monkeypatch):
    monkeypatch.setitem(tpuf_emulator.LIMITS, "request_bytes", 1000)  # 256 MB, scaled down
    refused(emu, lambda: ns.write(upsert_columns={"id": ["d"], "vector": [[1.0, 2.0]], "tag": ["x" * 2000]},
                                  distance_metric="cosine_distance"), 413, "over 1000")


def test_bodies_that_are_not_the_clients_types(emu, ns):
    for call in (lambda: ns.query(rank_by=KNN, top_k="many", filters=FLT),
                 lambda: ns.query(rank_by=KNN, top_k=1, filters=("tag", "Frob", 1)),
                 lambda: ns.write(upsert_columns={"vector": [[1.0, 2.0]]}, distance_metric="cosine_distance"),
                 lambda: ns.query(rank_by=KNN, top_k=1, filters=FLT, extra_body={"bogus": 1})):
        with pytest.raises(turbopuffer.BadRequestError):
            call()
    assert emu.limit_errors == []  # malformed, not over a limit


def test_exact_knn_agrees_with_numpy(emu, monkeypatch):
    monkeypatch.delenv("TURBOPUFFER_REGION", raising=False)
    client = turbopuffer.Turbopuffer(api_key=emu.api_key, base_url=emu.url, max_retries=0)
    rng = np.random.default_rng(3)
    docs, q = rng.standard_normal((40, 6)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    for metric in ("cosine_distance", "euclidean_squared"):
        n = client.namespace(metric)
        n.write(upsert_columns={"id": [f"d{i}" for i in range(40)], "vector": docs.tolist(), "row": list(range(40))},
                distance_metric=metric)
        rows = n.query(
            rank_by=("vector", "kNN", q.tolist()), top_k=40, filters=("row", "Lt", 30), include_attributes=["row"]
        ).rows
        d, a = docs[:30].astype(np.float64), q.astype(np.float64)
        want = (
            ((d - a) ** 2).sum(1)
            if metric == "euclidean_squared"
            else 1 - d @ a / np.linalg.norm(d, axis=1) / np.linalg.norm(a)
        )
        got = np.array([r["$dist"] for r in rows])
        assert [r["row"] for r in rows] == list(np.argsort(want))
        np.testing.assert_allclose(got, np.sort(want), rtol=1e-5, atol=1e-6, err_msg=metric)
    assert emu.limit_errors == []
    client.close()
