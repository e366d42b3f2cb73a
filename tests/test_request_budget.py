"""A budget for every request (issue 31, item 2): the work a /v1 request asks for is
counted before anything runs (tokens read, scored over the whole vocabulary, generated,
over its choices: ``serve --max-request-tokens``) and a request over it is a 400 naming
the limit; a generation or completion still running after ``--max-request-seconds`` is
ended with an error naming that limit (a stream's last event; a whole answer's status),
and the work stops when the client goes, whole answers included. Against a real server
on 127.0.0.1 over the tiny model; the slow store (a sleep a search) makes a generation
outlast the limit whatever the machine's speed."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from puffergpt import settings
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import serving

# The issue's body: 64 prompts of 250 token ids (48 KB), echoed with logprobs: 16,000 all-vocabulary searches
ISSUE_BODY = {"prompt": [[5] * 250] * 64, "max_tokens": 0, "echo": True, "logprobs": 5}


def events(r: httpx.Response) -> list[tuple[str | None, str]]:
    """(event, data) of each server-sent event of a whole response."""
    out, event = [], None
    for line in r.text.splitlines():
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            out.append((event, line[6:]))
    return out


class Counted:
    """The store's searches counted, each made ``delay_s`` slower."""

    def __init__(self, store, monkeypatch, delay_s: float = 0.0):
        self.n, search = 0, store.search

        def slow(*a, **k):
            self.n += 1
            time.sleep(delay_s)
            return search(*a, **k)

        monkeypatch.setattr(store, "search", slow)


def wait_for(cond, within_s: float, what: str) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {within_s} s"
        time.sleep(0.02)


def quiet(counted: Counted, store) -> None:
    """The work has stopped: the text closed, then no search for a while (a token's at most)."""
    wait_for(lambda: not store.namespaces("text-"), 10, "the text closed")
    n = counted.n
    time.sleep(0.5)
    assert counted.n == n, "searches went on after the request ended"


@pytest.fixture(params=[1.0])
def server(loaded, tiny, monkeypatch, request):
    """(url, app, counted searches, store) of a server over the tiny model whose limit is
    ``request.param`` s of work (1 s; None: none) and whose store sleeps 20 ms a search (a
    token: ~12 searches, ~0.25 s)."""
    store, key = loaded(tiny)
    counted = Counted(store, monkeypatch, 0.02)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(max_open_texts=4, max_request_s=request.param))
    with serving(app) as url:
        yield url, app, counted, store


def test_the_issues_48_kb_echo_body_is_refused_up_front_naming_the_limit(loaded, demo, monkeypatch):
    """On the demo model (a context of 256: each 250-id prompt fits), with the default budget."""
    store, key = loaded(demo)
    counted = Counted(store, monkeypatch)
    raw = json.dumps(ISSUE_BODY).encode()
    assert 40_000 < len(raw) < 64 * 1024  # under the body's bound: it is the work that is refused
    with serving(create_app(open_engine(store, demo.name, key), ServerConfig(max_open_texts=4))) as url:
        r = httpx.post(url + "/v1/completions", content=raw, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text[:300]
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and err["param"] == "prompt"
    assert f"{64 * 500:,} tokens" in err["message"] and f"{settings.default('max_request_tokens'):,}" in err["message"]
    assert "--max-request-tokens" in err["message"] and "--batch_size" in err["message"]
    assert counted.n == 0, "the refused request searched"


@pytest.mark.parametrize("body, work", [
    ({"prompt": [[5] * 60] * 8, "max_tokens": 4}, 8 * 64),  # read + new
    ({"prompt": [[5] * 10] * 8, "max_tokens": 0, "echo": True, "logprobs": 1}, 8 * 20),  # read + scored
])
def test_a_request_within_the_budget_runs(loaded, tiny, body, work):
    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(max_open_texts=4, max_request_tokens=work))
    with serving(app) as url:
        r = httpx.post(url + "/v1/completions", json={**body, "temperature": 0}, timeout=120)
        assert r.status_code == 200, r.text[:300]
        assert len(r.json()["choices"]) == 8
        one_more = body["prompt"][:-1] + [body["prompt"][-1] + [5]]  # one token more: over
        over = httpx.post(url + "/v1/completions", json={**body, "prompt": one_more}, timeout=30)
        assert over.status_code == 400 and f"at most {work:,} a request" in over.json()["error"]["message"]


def test_chat_choices_count_against_the_budget(loaded, tiny):
    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(max_open_texts=4, max_request_tokens=100))
    with serving(app) as url:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "n": 8}
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 400 and "8 choice(s)" in r.json()["error"]["message"], r.text


def test_a_generation_past_the_time_limit_ends_with_an_error_naming_it(server):
    url, app, _, store = server
    tid = httpx.post(url + "/api/texts", json={"prompt": "hello"}).json()["id"]
    r = httpx.post(url + f"/api/texts/{tid}/generate", json={"max_tokens": 100, "temperature": 0}, timeout=60)
    evs = events(r)
    kind, last = evs[-1]
    assert kind == "error" and "--max-request-seconds" in json.loads(last)["detail"], evs[-3:]
    assert "1 s" in json.loads(last)["detail"] and "done" not in [k for k, _ in evs]
    text = httpx.get(url + f"/api/texts/{tid}").json()  # the text stays consistent, and free to generate again
    assert 2 <= text["length"] < 2 + 100 and not app.state.texts.get(tid).generating


@pytest.mark.parametrize("stream", [True, False])
def test_a_completion_past_the_time_limit_is_an_openai_error_naming_it(server, stream):
    url, app, counted, store = server
    body = {"prompt": "hello", "max_tokens": 100, "temperature": 0, "stream": stream}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    if stream:
        evs = [d for _, d in events(r)]
        assert evs[-1] == "[DONE]", evs[-3:]
        err = json.loads(evs[-2])["error"]
    else:
        assert r.status_code == 400, r.text
        err = r.json()["error"]
    assert err["code"] == "request_too_long" and "--max-request-seconds" in err["message"], err
    quiet(counted, store)  # the worker stopped within a token and closed its text


@pytest.mark.parametrize("server", [None], indirect=True)  # no time limit: only the client's going ends it
def test_a_whole_answer_stops_when_its_client_goes(server):
    """A completion not streamed: the client hangs up and the server's searches stop (within
    a token), and its text is closed."""
    url, app, counted, store = server
    host, port = url.removeprefix("http://").split(":")
    raw = json.dumps({"prompt": "hello", "max_tokens": 100, "temperature": 0}).encode()
    s = socket.create_connection((host, int(port)))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(raw)}\r\n\r\n".encode() + raw)
    wait_for(lambda: counted.n >= 10, 10, "the completion began")
    s.close()
    quiet(counted, store)
    assert len(app.state.generations) == 0


# --- a budget that fits the time limit (issue 43, item 6) ---------------------------------------------

@pytest.mark.parametrize("server", [5.0], indirect=True)
def test_work_within_the_token_budget_that_cannot_finish_in_time_is_refused_up_front(server):
    """The issue's body: 64 x 64 ids, echo, logprobs: 8,192 tokens, within the default budget, but
    far past 5 s at the pace the server measured on a small request: a 400 naming both limits at
    once, nothing run; a request that fits the time still runs."""
    url, app, counted, store = server
    small = {"prompt": [5, 6, 7], "max_tokens": 2, "echo": True, "logprobs": 1, "temperature": 0}
    assert httpx.post(url + "/v1/completions", json=small, timeout=60).status_code == 200
    pace = app.state.served.engine.pace.seconds()
    assert set(pace) == {"read", "scored", "new"} and all(s > 0.01 for s in pace.values()), pace  # 20 ms a search
    n, t = counted.n, time.monotonic()
    r = httpx.post(url + "/v1/completions", json={"prompt": [[5] * 64] * 64, "max_tokens": 0, "echo": True,
                                                  "logprobs": 5}, timeout=60)
    assert r.status_code == 400 and time.monotonic() - t < 1, r.text
    err = r.json()["error"]
    assert err["code"] == "request_too_long", err
    assert "8,192 tokens" in err["message"] and "--max-request-tokens" in err["message"], err
    assert "of 5 s a request (puffergpt serve --max-request-seconds)" in err["message"], err
    assert "measured pace" in err["message"] and "ms a position scored" in err["message"], err
    assert counted.n == n and not store.namespaces("text-")  # refused before anything ran
    assert httpx.post(url + "/v1/completions", json={**small, "max_tokens": 1}, timeout=60).status_code == 200


def test_the_pace_is_read_from_a_blocks_requests():
    from puffergpt.search.pace import Pace, Work
    from puffergpt.search.session import Request

    def req(kind, queries, extra=False):
        return Request(kind, "search", queries, 0, 0, 0, 1.0, extra=extra)

    pace = Pace()
    assert pace.estimate(Work(10, 0, 0)) is None  # nothing measured: nothing refused on a guess
    pace.observe([req("h.0.attn.c_attn", 10), req("wte.top_k", 1)], 0.5)  # a prefill of 10 tokens
    assert pace.seconds() == {"read": pytest.approx(0.05)}
    assert pace.estimate(Work(0, 0, 4)) == pytest.approx(0.2)  # not measured: at the cheapest kind
    pace.observe([req("h.0.attn.c_attn", 1), req("wte.top_k", 1)], 0.3)  # a decode step
    pace.observe([req("wte.all", 1)], 0.1)  # a position scored
    pace.observe([req("h.0.attn.c_attn", 1, extra=True)], 9.0)  # a learning view's: left out
    assert pace.seconds() == {"read": pytest.approx(0.05), "new": pytest.approx(0.3), "scored": pytest.approx(0.1)}
    pace.observe([req("h.0.attn.c_attn", 1)], 0.8)
    assert pace.seconds()["new"] == pytest.approx(0.8 * 0.3 + 0.2 * 0.8)  # a moving average
    assert pace.estimate(Work(100, 99, 2)) == pytest.approx(100 * 0.05 + 99 * 0.1 + 2 * 0.4)
