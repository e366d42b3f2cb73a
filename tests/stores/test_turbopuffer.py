"""The turbopuffer backend's own logic. Against the real service it runs in the contract
suite when TURBOPUFFER_API_KEY is set; nothing here pretends to be the service."""

import numpy as np
import pytest

from puffergpt.stores.base import StoreError
from puffergpt.stores.turbopuffer import MULTI_QUERY, TurbopufferStore, tpuf_filter


def test_filters_translate_to_turbopuffer():
    assert tpuf_filter((("matrix", "=", "h.0.mlp.c_fc"),)) == ("matrix", "Eq", "h.0.mlp.c_fc")
    assert tpuf_filter((("layer", "=", np.int64(3)), ("pos", "<=", 7), ("head", "in", (1, 2)))) == (
        "And", [("layer", "Eq", 3), ("pos", "Lte", 7), ("head", "In", [1, 2])])
    assert isinstance(tpuf_filter((("layer", "=", np.int64(3)),))[2], int)  # JSON-ready, not numpy
    assert tpuf_filter(()) is None


def test_needs_an_api_key():
    with pytest.raises(StoreError, match="TURBOPUFFER_API_KEY"):
        TurbopufferStore(api_key=None, region="gcp-us-central1")


def test_limits_match_the_service():
    assert MULTI_QUERY == 16  # the service takes at most 16 sub-queries a request
    assert TurbopufferStore.metrics == ("cosine_distance", "euclidean_squared")  # no inner product there


class Row(dict):
    """A row as the client returns it: attributes by key, id and vector as attributes."""

    def __getattr__(self, k):
        return self[k]


class Recorder:
    """Records the requests the store sends and answers with given rows. It checks what
    the store asks for and how it reads answers; it is not the service (the contract
    suite runs against the service when TURBOPUFFER_API_KEY is set)."""

    def __init__(self, answer):
        self.calls, self.answer = [], answer

    def namespace(self, name):
        rec = self

        class Ns:
            def multi_query(self, queries):
                rec.calls.append(("multi_query", name, queries))
                return type("R", (), {"results": [type("Q", (), {"rows": rec.answer(q)}) for q in queries]})

            def query(self, **kw):
                rec.calls.append(("query", name, kw))
                return type("R", (), {"rows": rec.answer(kw), "aggregations": {"n": 3}})

            def write(self, **kw):
                rec.calls.append(("write", name, kw))

        return Ns()

    def close(self):
        pass


def store_with(answer) -> tuple[TurbopufferStore, Recorder]:
    s = TurbopufferStore.__new__(TurbopufferStore)
    from concurrent.futures import ThreadPoolExecutor

    s.region, s.prefix, s._pool = "test", "p-", ThreadPoolExecutor(2)
    s.client = rec = Recorder(answer)
    s._info = {"m": {"dim": 3, "schema": {"matrix": "str", "row": "int"}, "metric": "euclidean_squared"}}
    return s, rec


def test_a_batch_goes_out_in_requests_of_16_exact_queries():
    from puffergpt.stores.base import Query

    def answer(q):
        i = int(q["rank_by"][2][0])  # the query's number rides in its first coordinate
        return [Row({"id": f"w.{r}", "$dist": float(i * 10 + r), "row": r}) for r in range(2)]

    s, rec = store_with(answer)
    qs = [Query(np.array([i, 0, 0], np.float32), (("matrix", "=", "w"),)) for i in range(40)]
    hits = s.search("m", qs, "euclidean_squared", include=("row",))
    sent = [c for c in rec.calls if c[0] == "multi_query"]
    assert [len(c[2]) for c in sent] == [16, 16, 8] and all(c[1] == "p-m" for c in sent)
    q0 = sent[0][2][0]
    assert q0["rank_by"][:2] == ("vector", "kNN") and q0["filters"] == ("matrix", "Eq", "w")  # exact, never ANN
    assert q0["top_k"] == 10_000 and q0["include_attributes"] == ["row"]
    assert list(hits.query) == [i for i in range(40) for _ in range(2)]  # answers go back to their queries
    assert list(hits.distance[:4]) == [0.0, 1.0, 10.0, 11.0] and list(hits.attrs["row"][:2]) == [0, 1]


def test_more_rows_than_a_query_returns_is_an_error():
    from puffergpt.stores.base import Query

    s, _ = store_with(lambda q: [Row({"id": str(r), "$dist": 0.0}) for r in range(10_000)])
    with pytest.raises(StoreError, match="more than 10000"):
        s.search("m", [Query(np.zeros(3, np.float32))], "euclidean_squared")


def test_a_metric_other_than_the_namespaces_is_refused():
    from puffergpt.stores.base import Query

    s, rec = store_with(lambda q: [])
    with pytest.raises(StoreError, match="written for euclidean_squared"):
        s.search("m", [Query(np.zeros(3, np.float32))], "cosine_distance")
    assert rec.calls == []


def test_fetch_keeps_the_order_asked_and_names_what_is_missing():
    s, _ = store_with(lambda kw: [Row({"id": i, "vector": [float(n)] * 3}) for n, i in enumerate(kw["filters"][2]) if i != "w.9"])
    np.testing.assert_array_equal(s.fetch("m", ["w.2", "w.1"]), [[0, 0, 0], [1, 1, 1]])
    with pytest.raises(StoreError, match="no document 'w.9'"):
        s.fetch("m", ["w.1", "w.9"])


def test_upserts_go_in_batches_with_the_namespace_metric():
    s, rec = store_with(lambda kw: [])
    n = 1100
    s.upsert("m", [f"w.{i}" for i in range(n)], np.zeros((n, 3), np.float32), {"matrix": ["w"] * n, "row": np.arange(n)})
    writes = [c[2] for c in rec.calls if c[0] == "write"]
    assert [len(w["upsert_columns"]["id"]) for w in writes] == [512, 512, 76]
    assert all(w["distance_metric"] == "euclidean_squared" for w in writes)
    assert isinstance(writes[0]["upsert_columns"]["row"][0], int)  # plain JSON values
    with pytest.raises(StoreError, match="length 3"):
        s.upsert("m", ["x"], np.zeros((1, 4), np.float32), {"matrix": ["w"], "row": [0]})
