"""Only the page and the clients the server allows drive it (issue 31, item 1): every route
that changes state or costs work, sent each kind of request a page on another site can
make (an Origin of its own, Sec-Fetch-Site cross-site or same-site, a body that is not
JSON: text/plain, a form, none, application/vnd.evil+json, charset latin-1), is refused
(403 naming the origin and ``--cors-origin``; 415 naming application/json), and nothing
runs: no store call, no text opened or changed, no commit in the notebook or its remote.
The server's own origin, clients that send no Origin, and ``--cors-origin`` origins work.
Tested over HTTP against a real server on 127.0.0.1 (the browser's side:
tests/test_cross_site_page.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from helpers import message
from puffergpt import notebook as nb
from puffergpt.cli import main
from puffergpt.model import tokenizer
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.search.engine import Engine
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import serving
from puffergpt.server.guards.cross_site import check_origin

ALLOWED = "http://localhost:3000"
# What a request's work calls on the store (a text's keys are upserted off the critical path, maybe after
# its response: a forged generation would search first)
STORE_CALLS = ("search", "fetch", "create_namespace", "drop_namespace", "delete")
# (method, path, body): every route that changes state or costs work ({id}: an open text, {insight}: a saved one)
ROUTES = [
    ("POST", "/api/texts", {"prompt": "hello there"}),
    ("POST", "/api/texts/{id}/append", {"text": " more"}),
    ("POST", "/api/texts/{id}/generate", {"max_tokens": 2, "temperature": 0}),
    ("POST", "/api/texts/{id}/step_back", {"position": 1}),
    ("POST", "/api/texts/{id}/step_forward", {"position": 1}),
    ("POST", "/api/texts/{id}/cut", {"position": 1}),
    ("POST", "/api/texts/{id}/branch", {"position": 1, "rank": 1}),
    ("POST", "/api/texts/{id}/stop", {}),
    ("POST", "/api/texts/{id}/steps/3/ablate", {"parts": ["mlp 0"], "mode": "mean"}),
    ("POST", "/api/texts/{id}/steps/3/probabilities", {}),
    ("POST", "/api/texts/{id}/steps/3/writes", {"head": "0.0"}),
    ("DELETE", "/api/texts/{id}", {}),
    ("POST", "/api/compare", {"prompt": "hello", "top_k": 5}),
    ("POST", "/api/analogy", {"a": " man", "b": " woman", "c": " king", "k": 3}),
    ("POST", "/api/analogy/card", {}),
    ("POST", "/api/neighbours", {"word": " man", "k": 3}),
    ("POST", "/api/map", {"words": [" man", " woman"]}),
    ("POST", "/api/contexts", {"word": " mole", "prompts": ["a mole", "the mole"]}),
    ("POST", "/api/patching/propose", {"clean": "a = 7", "corrupt": "a = 5"}),
    ("POST", "/api/patching", {"clean": "a = 7", "corrupt": "a = 5", "answer": " 7", "wrong": " 5"}),
    ("POST", "/api/lessons/copying-head/run", {}),
    ("POST", "/api/output_search", {"text_id": "text-0123456789abcdef", "position": 1}),
    ("POST", "/api/insights", {"title": "forged", "body": "from elsewhere"}),
    ("POST", "/api/insights/push", {}),
    ("POST", "/api/insights/{insight}/replay", {}),
    ("POST", "/v1/completions", {"prompt": "hello", "max_tokens": 2}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("POST", "/tokenize", {"prompt": "hello"}),
    ("POST", "/detokenize", {"tokens": [31373]}),
]
JSON_TYPE = {"content-type": "application/json"}
# kind -> (headers, status): what a page on another site can send, and the refusal it must get
KINDS = {
    "origin evil": ({**JSON_TYPE, "origin": "https://evil.example"}, 403),
    "origin null": ({**JSON_TYPE, "origin": "null"}, 403),
    "another port": ({**JSON_TYPE, "origin": "http://127.0.0.1:9", "sec-fetch-site": "same-site"}, 403),
    "sec-fetch-site cross-site": ({**JSON_TYPE, "sec-fetch-site": "cross-site"}, 403),
    "text/plain": ({"content-type": "text/plain;charset=UTF-8"}, 415),
    "form": ({"content-type": "application/x-www-form-urlencoded"}, 415),
    "multipart": ({"content-type": "multipart/form-data; boundary=x"}, 415),
    "missing type": ({}, 415),
    "vnd.evil+json": ({"content-type": "application/vnd.evil+json"}, 415),
    "charset latin-1": ({"content-type": "application/json; charset=latin-1"}, 415),
}


def openai_path(path: str) -> bool:
    return path.startswith("/v1/") or path in ("/tokenize", "/detokenize")


def git_count(*args: str) -> int:
    r = subprocess.run(["git", *args, "rev-list", "--all", "--count"], capture_output=True, text=True, check=True)
    return int(r.stdout)


class Served:
    """A server on 127.0.0.1 with a notebook that has a remote, and what can change: the
    store's calls, the open texts and their tokens, the notebook's and its remote's commits."""

    def __init__(self, app, store, book: Path, remote: Path, url: str, insight: str):
        self.app, self.book, self.remote, self.url, self.insight = app, book, remote, url, insight
        self.calls = {"n": 0}
        for name in STORE_CALLS:
            method = getattr(store, name)

            def counted(*a, _m=method, **k):
                self.calls["n"] += 1
                return _m(*a, **k)

            setattr(store, name, counted)

    def state(self) -> tuple:
        texts = sorted((i, t.length, tuple(t.tokens)) for i, t in list(self.app.state.texts._texts.items()) if t)
        return (self.calls["n"], texts,
                git_count("-C", str(self.book)), git_count("--git-dir", str(self.remote)),
                len(list((self.book / "insights").glob("*.md"))))

    def path(self, path: str, tid: str) -> str:
        return self.url + path.replace("{id}", tid).replace("{insight}", self.insight)


def evidence(engine: Engine, name: str) -> dict:
    """An insight's evidence: the model's top 5 after "hello there"."""
    ids = tokenizer.encode("hello there")
    top, logits = nb.candidates_from_runs(engine.open)(ids, len(ids), 5, Sampling(), [])
    return {"kind": "token", "model": name, "prompt_ids": ids, "position": len(ids), "token_id": top[0],
            "sampling": {"temperature": 1.0, "top_k": 5, "seed": None},
            "candidates": [{"token_id": i, "logit": v} for i, v in zip(top, logits, strict=True)]}


@pytest.fixture(scope="module")
def served(loaded, tiny, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cross-site")
    store, key = loaded(tiny)
    engine = open_engine(store, tiny.name, key)
    book = nb.Notebook(tmp / "notebook")
    insight = book.save("an insight", "saved by the learner", [], evidence(engine, tiny.name)).id  # replay: searches
    remote = tmp / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    subprocess.run(["git", "-C", str(book.path), "remote", "add", "origin", str(remote)], check=True)
    app = create_app(engine, ServerConfig(max_open_texts=8, cors_origins=(ALLOWED,)),
                     reference=lambda: Run(NumpyWeights(tiny)), notebook=book)
    with serving(app) as url:
        s = Served(app, store, book.path, remote, url, insight)
        yield s
        for name in STORE_CALLS:
            vars(store).pop(name, None)


@pytest.fixture
def text_id(served) -> str:
    """An open text of four tokens, two of them generated (so step_back and branch have work)."""
    r = httpx.post(served.url + "/api/texts", json={"prompt": "hello there"})
    tid = r.json()["id"]
    httpx.post(served.url + f"/api/texts/{tid}/generate", json={"max_tokens": 2, "temperature": 0}, timeout=30)
    yield tid
    httpx.delete(served.url + f"/api/texts/{tid}")


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("method, path, body", ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_a_request_another_site_can_send_is_refused_and_nothing_runs(served, text_id, method, path, body, kind):
    headers, status = KINDS[kind]
    before = served.state()
    r = httpx.request(method, served.path(path, text_id), content=json.dumps(body).encode(), headers=headers,
                      timeout=30)
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert served.state() == before, "the refused request ran"
    message = r.json()["error"]["message"]
    if openai_path(path):
        assert r.json()["error"]["code"] in ("cross_site_request", "unsupported_media_type"), r.json()
    if status == 403:
        assert "--cors-origin" in message or "own page" in message, message
        assert headers.get("origin", "Sec-Fetch-Site") in message, message
    else:
        assert "application/json" in message and (headers.get("content-type", "no Content-Type") in message), message


def test_every_route_that_changes_state_or_costs_work_is_listed(served):
    """The list above is every route the app answers to a POST, PUT, PATCH or DELETE: a new one
    is checked here the day it is added."""
    def template(path: str) -> str:
        path = re.sub(r"/steps/[0-9]+/", "/steps/{position}/", path).replace("/copying-head/", "/{lesson_id}/")
        return path.replace("{id}", "{text_id}").replace("{insight}", "{insight_id}")

    listed = {(m, template(p)) for m, p, _ in ROUTES}
    doc = httpx.get(served.url + "/openapi.json").json()  # every route the app documents
    routes = {(m.upper(), p) for p, item in doc["paths"].items() for m in item if m not in ("get", "head", "options")}
    assert routes - listed == set() and listed - routes == set()


def test_the_notebook_takes_its_own_page_only(served, text_id):
    """An origin allowed with --cors-origin drives the API, never the notebook: a push,
    a save or a replay from it is a 403, and nothing is committed or pushed."""
    for method, path, body in [r for r in ROUTES if r[1].startswith("/api/insights")]:
        before = served.state()
        r = httpx.request(method, served.path(path, text_id), json=body, headers={"origin": ALLOWED})
        assert r.status_code == 403 and "notebook only from its own page" in message(r), r.text
        assert served.state() == before


@pytest.mark.parametrize("origin", ["own", ALLOWED, None])
def test_the_own_page_an_allowed_origin_and_clients_without_origin_work(served, origin):
    own = served.url
    headers = {} if origin is None else {"origin": own if origin == "own" else origin,
                                         "sec-fetch-site": "same-origin" if origin == "own" else "cross-site"}
    r = httpx.post(served.url + "/api/texts", json={"prompt": "hi"}, headers=headers)
    assert r.status_code == 201, r.text
    httpx.delete(served.url + f"/api/texts/{r.json()['id']}", headers=headers).raise_for_status()
    r = httpx.post(served.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "temperature": 0},
                   headers=headers)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"], r.text
    assert r.headers.get("access-control-allow-origin") == (ALLOWED if origin == ALLOWED else None)
    assert httpx.post(served.url + "/tokenize", json={"prompt": "hi"}, headers=headers).json()["count"] == 1
    if origin != ALLOWED:  # the notebook: its own page and clients without an Origin
        before = git_count("-C", str(served.book))
        r = httpx.post(served.url + "/api/insights", json={"title": f"saved by {origin}"}, headers=headers)
        assert r.status_code == 201, r.text
        assert git_count("-C", str(served.book)) == before + 1


@pytest.mark.parametrize("kind", ["application/json", "application/json; charset=utf-8",
                                  "Application/JSON;charset=UTF-8", 'application/json; charset="utf-8"'])
def test_json_in_utf8_is_taken_in_any_spelling(served, kind):
    r = httpx.post(served.url + "/tokenize", content=b'{"prompt": "hi"}', headers={"content-type": kind})
    assert r.status_code == 200, r.text


def test_a_post_without_a_body_needs_no_type(served, text_id):
    """The page's Stop and push send no body and so no Content-Type (api.js): they pass."""
    r = httpx.post(served.url + f"/api/texts/{text_id}/stop")
    assert r.status_code == 200, r.text


def test_preflights_are_answered_for_allowed_origins_only(served):
    ask = {"access-control-request-method": "POST", "access-control-request-headers": "content-type"}
    ok = httpx.options(served.url + "/v1/completions", headers={"origin": ALLOWED, **ask})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ALLOWED
    evil = httpx.options(served.url + "/v1/completions", headers={"origin": "https://evil.example", **ask})
    assert evil.status_code >= 400 and "access-control-allow-origin" not in evil.headers


def test_without_cors_origins_no_preflight_is_answered(loaded, tiny):
    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(max_open_texts=2))
    with serving(app) as url:
        r = httpx.options(url + "/v1/completions", headers={"origin": ALLOWED, "access-control-request-method": "POST"})
        assert r.status_code == 405 and "access-control-allow-origin" not in r.headers
        r = httpx.post(url + "/v1/completions", json={"prompt": "hi"}, headers={"origin": ALLOWED})
        assert r.status_code == 403 and "--cors-origin" in r.json()["error"]["message"]


@pytest.mark.parametrize("value, want", [
    ("http://localhost:3000", "http://localhost:3000"), ("HTTPS://Example.COM", "https://example.com"),
    ("http://example.com:80", "http://example.com"), ("https://[::1]:8443", "https://[::1]:8443"),
])
def test_an_origin_is_normalised_as_browsers_send_it(value, want):
    assert check_origin(value) == want


@pytest.mark.parametrize("value, words", [
    ("http://localhost:3000/", "no path"), ("http://x.example/app", "no path"), ("localhost:3000", "http://"),
    ("*", "http://"), ("ftp://x.example", "http://"), ("http://x.example:99999", "not an origin"),
    ("http://user:pw@x.example", "no user"), ("http://x.example?q=1", "no path"), ("http://", "a host"),
])
def test_a_bad_cors_origin_is_refused_naming_the_form(value, words):
    with pytest.raises(ValueError, match="scheme://host") as e:
        check_origin(value)
    assert words in str(e.value)
    r = CliRunner().invoke(main, ["serve", "--model", "demo", "--cors-origin", value], env={"PUFFERGPT_DATA": None})
    assert r.exit_code == 2 and "--cors-origin" in r.output and "scheme://host" in r.output, r.output
    assert "Traceback" not in r.output
