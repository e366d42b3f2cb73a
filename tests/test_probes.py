"""What balancers and Prometheus ask (issue 33, item 4: ``server/probes.py``): ``/health``
answers while the process does; ``/ready`` is 200 while the store answers a one-row search
and holds the manifest served, and 503 with the reason while the store fails; ``/metrics``
(prometheus_client's text format, read back with its own parser) moves with a request:
the request counted by route and status, the tokens the completion reports, the store's
searches in the counter and the latency histogram alike. Behind ``serve --workers 2``:
tests/test_workers.py::test_probes_and_metrics_add_up_through_the_front."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.stores.base import StoreError


def samples(text: str) -> dict[tuple, float]:
    """(sample name, sorted labels) -> value, from Prometheus' text format."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(got: dict, name: str, **labels) -> float:
    return got.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture(scope="module")
def probed(loaded, tiny):
    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(trusted_hosts=("127.0.0.1", "localhost")))
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        yield c, store


def test_health_and_ready_and_ready_fails_while_the_store_is_down(probed, monkeypatch):
    c, store = probed
    assert (c.get("/health").status_code, c.get("/health").json()) == (200, {"status": "ok"})
    r = c.get("/ready")
    assert (r.status_code, r.json()) == (200, {"status": "ready"})

    def down(*args, **kwargs):
        raise StoreError("connection refused (the database is stopped)")

    monkeypatch.setattr(store, "search", down)  # the store stops answering searches
    r = c.get("/ready")
    assert r.status_code == 503 and r.json()["status"] == "unavailable", r.text
    assert "connection refused" in r.json()["reason"], r.text
    assert c.get("/health").status_code == 200  # alive, not ready: a balancer sends nothing, nobody restarts it
    monkeypatch.setattr(store, "get_meta", lambda key: None)  # and the model's manifest gone from it
    assert "not loaded" in c.get("/ready").json()["reason"]
    monkeypatch.undo()
    assert c.get("/ready").status_code == 200
    # probes answer any Host (a balancer asks by address); the API does not
    with TestClient(c.app, base_url="http://10.0.0.7:8000") as other:
        assert other.get("/health").status_code == 200 and other.get("/ready").status_code == 200
        assert other.get("/api/info").status_code == 400


def test_metrics_move_with_a_request(probed):
    c, _ = probed
    r = c.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text[:200]
    before = samples(r.text)
    r = c.post("/v1/completions", json={"prompt": "hello there", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    tokens = r.json()["usage"]["completion_tokens"]
    after = samples(c.get("/metrics").text)

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("puffergpt_http_requests_total", method="POST", route="/v1/completions", status="200") == 1
    model = tiny_name(c)
    assert tokens > 0 and moved("puffergpt_tokens_generated_total", model=model) == tokens
    # what a dashboard plots, by model and route: the first token's time, the others', the tokens read and written
    route = {"model": model, "route": "/v1/completions"}
    assert moved("puffergpt_time_to_first_token_seconds_count", **route) == 1
    assert moved("puffergpt_time_between_tokens_seconds_count", **route) == tokens - 1
    assert moved("puffergpt_time_to_first_token_seconds_bucket", **route, le="+Inf") == 1
    assert moved("puffergpt_prompt_tokens_total", **route) == r.json()["usage"]["prompt_tokens"]
    assert moved("puffergpt_generation_tokens_total", **route) == tokens
    assert value(after, "puffergpt_model_info", model=model) == 1
    searches = moved("puffergpt_store_requests_total", op="search", outcome="ok")
    assert searches > 0 and moved("puffergpt_store_request_seconds_count", op="search") == searches
    assert moved("puffergpt_store_request_seconds_bucket", op="search", le="+Inf") == searches
    assert moved("puffergpt_text_searches_total") >= searches  # asked by the text, some may share a request
    for gauge in ("puffergpt_texts_running", "puffergpt_texts_queued", "puffergpt_texts_open"):
        assert value(after, gauge) == 0, gauge  # the completion's text ran and closed
    # a refusal is counted too, by its status
    assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": -1}).status_code == 400
    got = samples(c.get("/metrics").text)
    assert value(got, "puffergpt_http_requests_total", method="POST", route="/v1/completions", status="400") == 1
    # no family is a header alone, and no *_created sample (a start time, which no dashboard plots)
    families = list(text_string_to_metric_families(c.get("/metrics").text))
    assert all(f.samples for f in families) and not [f.name for f in families if f.name.endswith("_created")]
    assert not [s.name for f in families for s in f.samples if s.name.endswith("_created")]


def tiny_name(c) -> str:
    return c.get("/v1/models").json()["data"][0]["id"]


def test_refusals_are_counted_under_their_routes(loaded, tiny):
    """A 401 (a key missing) and a 400 for an unknown Host are answered before routing: counted under
    the route they were refused from, never "unrouted"; the page's generations are timed too."""
    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(api_keys=("probe-key-0123",)))
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        assert c.post("/v1/completions", json={"prompt": "hi"}).status_code == 401
        assert c.post("/api/texts", json={"prompt": "hi"}).status_code == 401
        auth = {"Authorization": "Bearer probe-key-0123"}
        t = c.post("/api/texts", json={"prompt": "hello there"}, headers=auth).json()
        gen = c.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 3, "temperature": 0}, headers=auth)
        assert gen.status_code == 200 and "event: done" in gen.text
        got = samples(c.get("/metrics").text)
    for route in ("/v1/completions", "/api/texts"):
        assert value(got, "puffergpt_http_requests_total", method="POST", route=route, status="401") == 1, route
    assert not [k for k in got if k[0] == "puffergpt_http_requests_total" and ("route", "unrouted") in k[1]]
    page = {"model": tiny_name_of(tiny), "route": "/api/texts/{text_id}/generate"}
    assert value(got, "puffergpt_time_to_first_token_seconds_count", **page) == 1
    assert value(got, "puffergpt_prompt_tokens_total", **page) == 2  # "hello there": 2 tokens, read once
    assert value(got, "puffergpt_generation_tokens_total", **page) == 3


def tiny_name_of(ckpt) -> str:
    from puffergpt.model.info import model_name
    return model_name(ckpt.name)


def test_ready_answers_within_a_second_while_the_store_is_busy(loaded, tiny, monkeypatch):
    """One process under load (issue 43: a balancer's check timed out at a load average of 9):
    /ready answers within about a second whatever the store does, from the last probe while it
    was recent, then says the store does not answer; and ready again once it does."""
    import threading
    import time

    from puffergpt.server.processes import probes

    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(trusted_hosts=("127.0.0.1",)))
    monkeypatch.setattr(probes, "RECENT_S", 2.0)
    free, search = threading.Event(), store.search

    def held(*args, **kwargs):  # every search waits, as on a machine whose cores are all busy
        free.wait(30)
        return search(*args, **kwargs)

    def timed(c) -> tuple[float, int, dict]:
        t = time.monotonic()
        r = c.get("/ready")
        return time.monotonic() - t, r.status_code, r.json()

    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        assert c.get("/ready").status_code == 200
        monkeypatch.setattr(store, "search", held)
        got = [timed(c) for _ in range(4)]  # ~4 s: the first ones from the last probe, then not ready
        assert all(s < probes.READY_S + 0.5 for s, _, _ in got), got
        assert got[0][1] == 200 and got[-1][1] == 503 and "did not answer within 1 s" in got[-1][2]["reason"], got
        free.set()
        time.sleep(0.2)
        assert timed(c)[1] == 200
