"""The probes of issue 13, kept: disconnect storms against a real server on 127.0.0.1,
shutdown while generating, a user's Stop, a body that stops arriving, concurrent texts
against the numpy reference, a PostgreSQL crash under the server, store damage (a
dropped namespace, a missing document, a broken manifest) and checkpoint names.
Bounded in count and time, loopback only.

Kept elsewhere, not repeated here: bad JSON values and bad inputs (tests/test_server.py),
an altered vector or attribute (tests/test_loading.py), a load killed with SIGKILL and
resumed (tests/stores/test_embedded.py, tests/stores/test_pgvector.py), a backend killed
or stopped mid-generation at the engine level (tests/stores/test_pgvector.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from puffergpt.model import checkpoints, tokenizer
from puffergpt.model.reference import Reference
from puffergpt.model.sampling import Sampling
from puffergpt.search import documents, load, manifest, verify
from puffergpt.search.manifest import open_engine
from puffergpt.search.scheduler import Scheduler
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import server
from puffergpt.stores import open_store
from puffergpt.texts.text import opened

PROMPT = "The quick brown fox"


class Running:
    """A uvicorn server in a thread, on a free port of 127.0.0.1."""

    def __init__(self, app):
        self.app = app
        self.server = server(app, "127.0.0.1", 0)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the server did not start"
            time.sleep(0.02)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def shutdown(self, within_s: float) -> float:
        t0 = time.monotonic()
        self.server.should_exit = True  # what SIGTERM sets
        self.thread.join(within_s)
        assert not self.thread.is_alive(), f"the server did not shut down within {within_s} s"
        return time.monotonic() - t0

    def __exit__(self, *exc):
        if self.thread.is_alive():
            self.shutdown(30)

    def request(self, method: str, path: str, body: dict | None = None, timeout: float = 10) -> tuple[int, bytes]:
        s = self.send(method, path, body, timeout)
        with s:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        return int(head.split()[1]), rest

    def send(self, method: str, path: str, body: dict | None = None, timeout: float = 10,
             raw: bytes | None = None, headers: dict | None = None) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        h = {"Host": "127.0.0.1", "Content-Type": "application/json", "Content-Length": str(len(payload)),
             "Connection": "close", **(headers or {})}
        s.sendall(f"{method} {path} HTTP/1.1\r\n".encode() + "".join(f"{k}: {v}\r\n" for k, v in h.items()).encode()
                  + b"\r\n" + payload)
        return s


def read_events(s: socket.socket, n: int) -> bytes:
    """Read until n server-sent events have come (the events are split by blank lines)."""
    data = b""
    while data.count(b"\n\n") < n + 1:  # the response head ends with one too (\r\n\r\n holds no \n\n)
        chunk = s.recv(4096)
        assert chunk, f"the stream ended early: {data[-300:]!r}"
        data += chunk
    return data


def wait_for(cond, within_s: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < within_s, f"{what}: not within {within_s} s"
        time.sleep(0.01)
    return time.monotonic() - t0


@pytest.fixture
def served(loaded, tiny):
    store, key = loaded(tiny)
    engine = open_engine(store, tiny.name, key)
    app = create_app(engine, ServerConfig(max_open_texts=8, max_new_tokens=400, read_timeout_s=0.5))
    with Running(app) as r:
        r.store = store
        yield r


def open_texts(store) -> set[str]:
    return set(store.namespaces("text-"))


def abandoned_generators() -> list[str]:
    """puffergpt's generators started and never closed: each would be closed by the garbage
    collector, in whatever thread it runs, taking the store's lock there (the deadlock)."""
    import gc
    import inspect

    return [g.gi_code.co_qualname for g in gc.get_objects()
            if inspect.isgenerator(g) and g.gi_frame is not None and g.gi_frame.f_lasti >= 0
            and "puffergpt" in g.gi_code.co_filename and inspect.getgeneratorstate(g) == "GEN_SUSPENDED"]


def test_a_disconnect_storm_on_generate_ends_each_generation(served):
    """40 rounds of: generate (stream), read 2 events, close the socket. Each generation
    ends within about a token, the text is free again, and the server still answers."""
    texts = served.app.state.texts
    code, body = served.request("POST", "/api/texts", {"prompt": PROMPT})
    assert code == 201, body
    tid = json.loads(body)["id"]
    text = texts.get(tid)
    ns = text.session.keys_ns
    ended = []
    for _ in range(40):
        s = served.send("POST", f"/api/texts/{tid}/generate", {"max_tokens": 100, "temperature": 1.0, "top_k": 40})
        read_events(s, 2)
        s.close()
        ended.append(wait_for(lambda: not text.generating, 5, "the generation ended after its client left"))
        assert text.length < 5 + 100  # it stopped: had it run on, it would have written 100
        code, body = served.request("POST", f"/api/texts/{tid}/cut", {"position": 5})  # room for the next round
        assert code == 200, body
    assert abandoned_generators() == []
    assert served.request("GET", "/api/info")[0] == 200
    assert len(served.app.state.generations) == 0
    code, _ = served.request("DELETE", f"/api/texts/{tid}")
    assert code == 200 and ns not in open_texts(served.store)
    print(f"generation ended {max(ended) * 1e3:.0f} ms at most after its client left (40 rounds)")


def test_a_disconnect_storm_on_completions_frees_every_text(served):
    before = open_texts(served.store)
    for _ in range(40):
        s = served.send("POST", "/v1/completions", {"prompt": "The module", "max_tokens": 100, "stream": True})
        read_events(s, 2)
        s.close()
    wait_for(lambda: open_texts(served.store) == before, 5, "every completion's text closed after its client left")
    assert abandoned_generators() == []
    assert served.request("GET", "/api/info")[0] == 200


def test_shutdown_cancels_running_generations(served):
    code, body = served.request("POST", "/api/texts", {"prompt": PROMPT})
    tid = json.loads(body)["id"]
    text = served.app.state.texts.get(tid)
    ns = text.session.keys_ns
    s = served.send("POST", f"/api/texts/{tid}/generate", {"max_tokens": 100, "temperature": 1.0})
    read_events(s, 2)  # generating, its client still reading
    took = served.shutdown(within_s=8)
    s.close()
    assert ns not in open_texts(served.store)  # closed by the lifespan's shutdown
    assert abandoned_generators() == []
    assert text.length < 4 + 100, "the generation ran to its end: shutdown did not stop it"
    print(f"shutdown with a generation running took {took:.2f} s")


def test_a_queued_learner_runs_when_the_running_one_leaves(loaded, tiny):
    """One slot: a second learner's generation waits (``/api/status``: 1 running, 1 queued),
    sends nothing, and starts as soon as the first learner's client goes away."""
    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key, scheduler=Scheduler(1)), ServerConfig(max_open_texts=4))
    with Running(app) as r:
        ids = [json.loads(r.request("POST", "/api/texts", {"prompt": PROMPT})[1])["id"] for _ in range(2)]
        first = r.send("POST", f"/api/texts/{ids[0]}/generate", {"max_tokens": 100, "temperature": 1.0, "top_k": 40})
        read_events(first, 2)
        second = r.send("POST", f"/api/texts/{ids[1]}/generate", {"max_tokens": 3, "temperature": 0})

        def status():
            return json.loads(r.request("GET", "/api/status")[1])

        wait_for(lambda: status()["queued"] == 1, 5, "the second generation queued")
        got = status()
        assert (got["running"], got["queued"], got["max_running"], got["open_texts"]) == (1, 1, 1, 2), got
        assert got["workers"] == 1  # one process unless serve --workers
        second.settimeout(0.3)
        waited = b""
        with contextlib.suppress(TimeoutError):
            while chunk := second.recv(4096):
                waited += chunk
        assert b"event:" not in waited, waited  # its response may have begun; no token while it waits
        t0 = time.monotonic()
        first.close()  # the first learner leaves
        second.settimeout(10)
        while b"event: done" not in waited:
            chunk = second.recv(4096)
            assert chunk, f"the stream ended early: {waited[-300:]!r}"
            waited += chunk
        took = time.monotonic() - t0
        assert waited.count(b"event: token") == 3
        wait_for(lambda: status()["running"] == 0 and status()["queued"] == 0, 5, "the slots freed")
        assert abandoned_generators() == []
        print(f"the queued learner's three tokens and done came {took:.2f} s after the first left")


def test_a_body_that_stops_arriving_is_408(served):
    """Content-Length 100, 10 bytes sent: the server answers 408 after its read timeout
    (0.5 s here) instead of holding the connection."""
    t0 = time.monotonic()
    s = served.send("POST", "/api/texts", raw=b'{"prompt":', headers={"Content-Length": "100"})
    with s:
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    took = time.monotonic() - t0
    assert data.startswith(b"HTTP/1.1 408"), data[:200]
    assert b"stopped arriving" in data and took < 5, took
    assert served.request("GET", "/api/info")[0] == 200



def sse_stream(lines) -> Iterator[tuple[str, dict]]:
    """(event, data) of each server-sent event, from a response's lines as they come."""
    event = None
    for line in lines:
        if line.startswith("event: "):
            event = line[7:]
        elif line.startswith("data: "):
            yield event, json.loads(line[6:])


def test_stop_lets_the_generation_say_done(served):
    """The playground's Stop: the generation ends at its next token and its last event is
    still ``done`` with ``stopped: true`` and the text (a disconnect may cut it; a Stop not)."""
    base = f"http://127.0.0.1:{served.port}"
    with httpx.Client(base_url=base, timeout=10) as c:
        tid = c.post("/api/texts", json={"prompt": PROMPT}).json()["id"]
        evs = []
        body = {"max_tokens": 100, "temperature": 1.0, "seed": 3}
        with c.stream("POST", f"/api/texts/{tid}/generate", json=body) as r:
            assert r.status_code == 200, r.read()
            for ev in sse_stream(r.iter_lines()):
                evs.append(ev)
                if len(evs) == 2:  # generating: the user presses Stop
                    assert httpx.post(f"{base}/api/texts/{tid}/stop", timeout=10).status_code == 200
        kind, last = evs[-1]
        assert kind == "done", [k for k, _ in evs]
        assert last["stopped"] is True and last["tokens"] == len(evs) - 1 < 100
        assert last["text"]["id"] == tid and last["text"]["length"] == len(last["text"]["tokens"])
        assert c.delete(f"/api/texts/{tid}").status_code == 200


@pytest.mark.parametrize("method, path, raw, headers, status", [
    ("POST", "/tokenize", b"not json", {}, 400),
    ("POST", "/tokenize", b'{"prompt": "\\ud800"}', {}, 400),
    ("POST", "/tokenize", b'{"prompt": 5}', {}, 400),
    ("POST", "/tokenize", b'{"prompt": "' + b"a" * 70_000 + b'"}', {}, 413),
    ("POST", "/tokenize", b'{"prompt": "hi"}', {"Content-Type": "text/plain"}, 415),
    ("POST", "/tokenize", b'{"prompt": "hi"}', {"Origin": "https://evil.example"}, 403),
    ("GET", "/tokenize", b"", {}, 405),
    ("POST", "/detokenize", b'{"tokens": [-1]}', {}, 400),
    ("POST", "/detokenize", b"[", {}, 400),
    ("GET", "/detokenize", b"", {}, 405),
    ("POST", "/tokenizer_info", b"{}", {}, 405),
])
def test_the_tokenizer_routes_answer_every_error_in_openais_shape(served, method, path, raw, headers, status):
    """Issue 31 (6): /tokenize answered some errors as {"detail": ...} (the body's bound, a
    body that is not JSON, a wrong method) and others in OpenAI's shape: now all in OpenAI's."""
    s = served.send(method, path, raw=raw, headers=headers)
    with s:
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert int(head.split()[1]) == status, data[:300]
    err = json.loads(body)
    assert set(err) == {"error"} and set(err["error"]) == {"message", "type", "param", "code"}, err
    assert err["error"]["message"] and err["error"]["type"] == "invalid_request_error", err


# --- store damage: each kind is named, repaired by the command it names, refused until then ---
# (an altered vector and an altered attribute: tests/test_loading.py; a load killed with
# SIGKILL and resumed: tests/stores/test_embedded.py and tests/stores/test_pgvector.py)

@pytest.fixture
def damaged(tmp_path, tiny):
    """A store of its own holding the tiny model, to damage: (store, key, manifest)."""
    store = open_store("embedded", tmp_path / "store")
    key = manifest.model_key(tiny.name)
    m = load.load(store, tiny, key, progress=False)
    yield store, key, m
    store.close()


def greedy_on(store, tiny, key, n: int = 4) -> list[int]:
    with opened(open_engine(store, tiny.name, key).open, tokenizer.encode(PROMPT)) as t:
        return [s.token_id for s in t.generate(n, Sampling(0, 40))]


def test_a_dropped_namespace_is_named_refused_and_repaired(damaged, tiny):
    store, key, m = damaged
    ns = documents.namespace(key, tiny.config.n_embd)
    store.drop_namespace(ns)
    with pytest.raises(manifest.NotLoaded,
                       match=rf"namespace {re.escape(ns)} is missing .*run `puffergpt load --model "):
        open_engine(store, tiny.name, key)
    bad = verify.verify(store, m)  # every matrix of the namespace, by name, not a raw store error
    assert set(bad) == {name for name, info in m["matrices"].items() if info["namespace"] == ns}
    assert all(f"namespace {ns} is missing" in why for why in bad.values()), bad
    assert load.load(store, tiny, key, progress=False) == m  # a plain load puts it back
    assert verify.verify(store, m) == {}
    assert greedy_on(store, tiny, key) == Reference(tiny).greedy(tokenizer.encode(PROMPT), 4)


def test_a_missing_document_is_named_refused_and_repaired(damaged, tiny):
    store, key, m = damaged
    ns = m["matrices"]["wte"]["namespace"]
    store.delete(ns, (("matrix", "=", "wte"), ("row", "=", 17)))
    with pytest.raises(manifest.NotLoaded, match=rf"namespace {re.escape(ns)} holds .*run `puffergpt load --model "):
        open_engine(store, tiny.name, key)
    assert list(verify.verify(store, m)) == ["wte"]
    load.load(store, tiny, key, progress=False, repair=True)
    assert verify.verify(store, m) == {}
    assert greedy_on(store, tiny, key) == Reference(tiny).greedy(tokenizer.encode(PROMPT), 4)


@pytest.mark.parametrize("broken", ["{not json", {"complete": True}, ["a", "list"], "raise"])
def test_a_broken_manifest_names_the_repair(damaged, tiny, broken, monkeypatch):
    """Invalid JSON under manifest:KEY (a remote store's text that does not parse), a dict
    missing its fields, something else: a message naming `load --repair`, which fixes it."""
    store, key, m = damaged
    if broken == "raise":  # the store's own JSON parse fails, as turbopuffer's get_meta does on bad text
        real = store.get_meta
        monkeypatch.setattr(store, "get_meta", lambda k: json.loads("{broken") if k == f"manifest:{key}" else real(k))
    else:
        store.put_meta(f"manifest:{key}", broken)
    with pytest.raises(manifest.NotLoaded,
                       match=r"manifest of model .* is broken .*`puffergpt load --model \S+ .*--repair`"):
        open_engine(store, tiny.name, key)
    monkeypatch.undo()
    assert load.load(store, tiny, key, progress=False, repair=True) == m
    assert open_engine(store, tiny.name, key).manifest == m


@pytest.mark.parametrize("name", ["_private", "модель", "-dash", "日本語 model"])
def test_a_checkpoint_directory_of_any_name_loads(tmp_path, tiny_dir, tiny, name):
    import shutil

    d = shutil.copytree(tiny_dir, tmp_path / name)
    key = manifest.model_key(str(d))
    assert key.isascii() and key[0].isalnum(), key
    assert key != manifest.model_key(str(shutil.copytree(tiny_dir, tmp_path / "other" / name)))  # its path decides
    store = open_store("embedded", tmp_path / "store")
    try:
        ckpt = checkpoints.load(str(d))
        load.load(store, ckpt, key, progress=False)
        assert greedy_on(store, ckpt, key) == Reference(tiny).greedy(tokenizer.encode(PROMPT), 4)
    finally:
        store.close()


# --- concurrency ---

CONCURRENT_PROMPTS = ["The quick brown fox", "Hello world", "for i in range(10):", "Once upon a time",
                      "import numpy as np", "The capital of France is", "1, 2, 3, 4,", "Dear Sir or Madam"]


def test_concurrent_texts_equal_each_alone(served, tiny):
    """8 texts generating at once through the HTTP API, greedy: each gives the tokens of the
    numpy reference (what it gives alone), so no text reads another's keys."""
    base = f"http://127.0.0.1:{served.port}"
    got, errors = {}, []

    def one(prompt: str) -> None:
        try:
            with httpx.Client(base_url=base, timeout=60) as c:
                tid = c.post("/api/texts", json={"prompt": prompt}).json()["id"]
                with c.stream("POST", f"/api/texts/{tid}/generate", json={"max_tokens": 8, "temperature": 0}) as r:
                    got[prompt] = [d["token_id"] for e, d in sse_stream(r.iter_lines()) if e == "token"]
                c.delete(f"/api/texts/{tid}")
        except Exception as e:  # reported below, with the prompt
            errors.append((prompt, repr(e)))

    threads = [threading.Thread(target=one, args=(p,)) for p in CONCURRENT_PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    ref = Reference(tiny)
    for p in CONCURRENT_PROMPTS:
        assert got[p] == ref.greedy(tokenizer.encode(p), 8), p
    assert open_texts(served.store) == set()


# --- pgvector: PostgreSQL crashes and comes back under a running server ---
from stores.conftest import new_database, pg  # noqa: E402,F401 - the session's PostgreSQL (tests/stores/conftest.py)


def test_a_postgresql_crash_under_the_server(pg, new_database, tiny):
    """PostgreSQL stops the hard way (immediate: UNLOGGED key tables are emptied) and starts
    again, between two generate calls of a text. The text never continues with wrong
    tokens: the client gets an ``error`` event naming the missing keys. The first request
    after PostgreSQL returns works (a connection idle across the restart is checked before
    use), and a new text gives the reference's tokens."""
    store = open_store("pgvector", dsn=new_database())
    key = manifest.model_key(tiny.name)
    load.load(store, tiny, key, progress=False)
    ref = Reference(tiny)
    want = ref.greedy(tokenizer.encode(PROMPT), 6)
    try:
        with Running(create_app(open_engine(store, tiny.name, key))) as r, \
                httpx.Client(base_url=f"http://127.0.0.1:{r.port}", timeout=30) as c:
            tid = c.post("/api/texts", json={"prompt": PROMPT}).json()["id"]

            def generate(text_id: str, n: int) -> list[tuple[str, dict]]:
                body = {"max_tokens": n, "temperature": 0}
                with c.stream("POST", f"/api/texts/{text_id}/generate", json=body) as resp:
                    assert resp.status_code == 200, resp.read()
                    return list(sse_stream(resp.iter_lines()))

            first = generate(tid, 3)
            assert [d["token_id"] for e, d in first if e == "token"] == want[:3]
            pg.stop("immediate")
            try:
                time.sleep(1.2)  # the server's connection lies idle across the restart
            finally:
                pg.start()
            time.sleep(1.2)
            fresh = c.post("/api/texts", json={"prompt": PROMPT})  # the first request after PostgreSQL returns
            assert fresh.status_code == 201, fresh.text
            after = generate(tid, 3)
            assert [e for e, _ in after] == ["error"], after  # no token, right or wrong
            assert "missing" in after[0][1]["detail"] and "open it again" in after[0][1]["detail"], after
            new = generate(fresh.json()["id"], 6)
            assert [d["token_id"] for e, d in new if e == "token"] == want
            for t in (tid, fresh.json()["id"]):
                c.delete(f"/api/texts/{t}")
    finally:
        store.close()


# --- the third probe (issue 19): JSON past the standard library, static names, lone
# surrogates, notebook files read as untrusted ---

from fastapi.testclient import TestClient  # noqa: E402

from puffergpt import notebook as nb  # noqa: E402
from puffergpt.notebook import Notebook  # noqa: E402

GOOD = {  # a body each route accepts
    "/v1/completions": {"prompt": "hi", "max_tokens": 1, "temperature": 0},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
    "/api/texts": {"prompt": "hi"},
    "/api/map": {"words": [" man", " woman"]},
    "/api/analogy": {"a": " man", "b": " woman", "c": " king", "k": 3},
    "/api/contexts": {"word": " mole", "prompts": ["a mole", "the mole"], "k": 3},
}
UNREPRESENTABLE = [  # (JSON text put in a field's place, words the answer must hold)
    ("1" * 5000, "5000 digits"),  # past Python's int() limit (4300 digits): ValueError in json
    ("-" + "9" * 5000, "5000 digits"),
    ("[" * 3000 + "]" * 3000, "nested"),  # past the recursion limit: RecursionError in json
    ("{\"a\":" * 3000 + "1" + "}" * 3000, "nested"),
    ("[" * 200 + "]" * 200, "nested"),  # parses, and is past any field's depth
    ("NaN", "NaN"),
    ("-Infinity", "-Infinity"),
    ("1e400", "1e400"),
]


@pytest.fixture(scope="module")
def probed(loaded, tiny, tmp_path_factory):
    """The whole app, with a notebook, under Starlette's TestClient: a 500 is an answer."""
    store, key = loaded(tiny)
    book = Notebook(tmp_path_factory.mktemp("probe") / "nb")
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(max_open_texts=8), notebook=book)
    with TestClient(app, raise_server_exceptions=False) as c:
        c.book = book
        yield c


def field_of(good: dict) -> str:
    return next(iter(good))


def post_raw(c, path: str, raw: bytes):
    return c.post(path, content=raw, headers={"content-type": "application/json"})


def message(r) -> str:
    """The error's message: OpenAI's shape on every path."""
    return r.json()["error"]["message"]


@pytest.mark.parametrize("path", [*GOOD, "/api/insights"])
@pytest.mark.parametrize("value, words", UNREPRESENTABLE)
def test_json_past_the_standard_library_is_400_on_every_route(probed, path, value, words):
    """A 5,000-digit integer, JSON nested 3,000 deep, NaN or 1e400 in a field: a 400 that
    says what, in the route's error shape (the probe found 500s on /v1)."""
    good = GOOD.get(path, {"title": "t", "evidence": {}})
    raw = json.dumps({**good, field_of(good): "@@"}).replace('"@@"', value).encode()
    r = post_raw(probed, path, raw)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert words in message(r) and field_of(good) in message(r), message(r)
    if path.startswith("/v1"):
        assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["param"] == field_of(good)
    assert probed.get("/api/info").status_code == 200


@pytest.mark.parametrize("path", [*GOOD, "/api/insights"])
@pytest.mark.parametrize("raw, words", [(b'{"prompt": "caf\xe9"}', "not UTF-8"), (b'{"prompt": ', "not JSON"),
                                        (b'\xef\xbb\xbf{"prompt": "hi"}', "not UTF-8"), (b"[" * 3000, "nested")])
def test_a_body_that_is_not_json_is_400_on_every_route(probed, path, raw, words):
    r = post_raw(probed, path, raw)
    assert r.status_code == 400 and words in message(r), (r.status_code, r.text[:300])


@pytest.mark.parametrize("path, body, field", [
    ("/api/map", {"words": ["\ud800", " dict"]}, "words[0]"),  # mapped a word the client did not send
    ("/api/map", {"words": [" man", " woman"], "text_id": "\udfff"}, "text_id"),
    ("/api/texts", {"prompt": "ok \ud83d"}, "prompt"),
    ("/api/analogy", {"a": " man", "b": "\udc00", "c": " king"}, "b"),
    ("/api/insights", {"title": "t\ud800", "evidence": {}}, "title"),
    ("/api/insights", {"title": "t", "evidence": {"kind": "token", "\ud800": 1}}, "evidence"),
    ("/v1/completions", {"prompt": "hi", "stop": "\ud800"}, "stop"),  # was accepted
    ("/v1/completions", {"prompt": "hi", "stop": ["\n", "x\udbff"]}, "stop[1]"),
    ("/v1/completions", {"prompt": ["fine", "\udfff"]}, "prompt[1]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "user": "\ud800"}, "user"),
])
def test_a_lone_surrogate_in_any_field_is_400_naming_it(probed, path, body, field):
    r = post_raw(probed, path, json.dumps(body).encode())  # json.dumps writes a lone surrogate as \udXXX
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert field in message(r) and "surrogate" in message(r), message(r)
    if path.startswith("/v1"):
        assert r.json()["error"]["param"] == field.split("[")[0].split(".")[0]


@pytest.mark.parametrize("name", ["a" * 5000, "x." * 200 + "js", "%ff%fe", "a%0ab", "%2e%2e", "index.html%00",
                                  "con", "\u00e9" * 300])
@pytest.mark.parametrize("prefix", ["/static/", "/docs-assets/"])
def test_a_long_or_odd_static_name_is_404(probed, prefix, name):
    r = probed.get(prefix + name)
    assert r.status_code == 404 and message(r) == "no such file", (r.status_code, r.text[:200])
    assert probed.get("/static/main.js").status_code == 200
    assert probed.get("/docs-assets/swagger-ui.css").status_code == 200


# --- notebook files read as untrusted ---

@pytest.fixture
def book_client(tmp_path, loaded, tiny):
    """A served notebook holding one insight: (client, notebook, insight id)."""
    store, key = loaded(tiny)
    book = Notebook(tmp_path / "nb")
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(), notebook=book)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/api/insights", json={"title": "t", "body": "words", "tags": [], "evidence": evidence_of(tiny)})
        assert r.status_code == 201, r.text
        yield c, book, r.json()["id"]


def evidence_of(tiny) -> dict:
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.session import Run
    from puffergpt.texts.text import Text

    text = Text(Run(NumpyWeights(tiny)))
    try:
        text.append(tokenizer.encode(PROMPT))
        step = list(text.generate(1, Sampling(0, 5)))[-1]
        return {"kind": "token", "model": tiny.name, "prompt_ids": text.tokens[:text.length], "position": step.position,
                "token_id": step.token_id, "sampling": {"temperature": 0.0, "top_k": 5, "seed": None},
                "candidates": [{"token_id": int(i), "logit": float(v)}
                               for i, v in zip(step.ids, step.logits, strict=True)]}
    finally:
        text.close()


def test_an_insight_file_that_is_not_utf8_is_409_naming_it(book_client):
    c, book, iid = book_client
    f = book.path / "insights" / f"{iid}.md"
    f.write_bytes(f.read_bytes().replace(b"words", b"w\xffrds"))
    for r in (c.get(f"/api/insights/{iid}"), c.post(f"/api/insights/{iid}/replay")):
        assert r.status_code == 409, (r.status_code, r.text[:300])
        assert f"insights/{iid}.md" in message(r) and "UTF-8" in message(r), r.json()
    assert c.get("/api/insights").json()["insights"] == []  # listed without it (a warning in the log)


@contextlib.contextmanager
def read_only(folder: Path):
    """folder made read-only: its mode, and for root (whom modes do not bind) the
    immutable attribute; a machine where neither binds is skipped with the reason."""
    folder.chmod(0o555)
    immutable = False
    try:
        try:
            (folder / ".probe").touch()
            (folder / ".probe").unlink()
            r = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
            immutable = r.returncode == 0
            if not immutable:
                pytest.skip(f"cannot make a folder read-only here (root, and chattr +i failed: {r.stderr.strip()})")
        except PermissionError:
            pass  # the mode binds
        yield
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


def test_a_read_only_notebook_is_503_with_the_reason(book_client, tiny):
    c, book, iid = book_client
    before = sorted(p.name for p in (book.path / "insights").iterdir())
    body = {"title": "t2", "body": "", "tags": [], "evidence": evidence_of(tiny)}
    with read_only(book.path / "insights"):
        r = c.post("/api/insights", json=body)
        assert r.status_code == 503, (r.status_code, r.text[:300])
        assert "could not write" in message(r) and "insights" in message(r), r.json()
        assert sorted(p.name for p in (book.path / "insights").iterdir()) == before  # nothing half-written
    assert c.post("/api/insights", json=body).status_code == 201  # writable again: saves again


def test_a_symlinked_insights_folder_is_never_written_through(book_client, tiny, tmp_path):
    c, book, iid = book_client
    outside = tmp_path / "outside"
    outside.mkdir()
    (book.path / "insights").rename(tmp_path / "kept")
    (book.path / "insights").symlink_to(outside)
    r = c.post("/api/insights", json={"title": "t", "body": "", "tags": [], "evidence": evidence_of(tiny)})
    assert r.status_code == 409 and "symbolic link" in message(r), (r.status_code, r.text[:300])
    assert list(outside.iterdir()) == []  # nothing written outside the notebook
    (tmp_path / "kept" / f"{iid}.md").rename(outside / f"{iid}.md")  # an insight outside, through the link
    for r in (c.get("/api/insights"), c.get(f"/api/insights/{iid}"), c.post(f"/api/insights/{iid}/replay")):
        assert r.status_code == 409 and "symbolic link" in message(r), (r.status_code, r.text[:300])


def test_a_symlinked_insight_file_is_not_served(book_client, tmp_path):
    c, book, iid = book_client
    f = book.path / "insights" / f"{iid}.md"
    secret = tmp_path / "secret.md"
    f.rename(secret)  # a file outside the notebook that reads as an insight
    f.symlink_to(secret)
    for r in (c.get(f"/api/insights/{iid}"), c.post(f"/api/insights/{iid}/replay")):
        assert r.status_code == 409, (r.status_code, r.text[:300])
        assert "symbolic link" in message(r) and f"insights/{iid}.md" in message(r), r.json()
    assert c.get("/api/insights").json()["insights"] == []  # not listed either


def test_insight_files_past_what_a_save_writes_are_refused_naming_them(book_client):
    """A YAML alias bomb in the front matter (a title a million strings deep: a billion
    at 9 levels), a file over MAX_FILE_BYTES, a FIFO (reading one waits for a writer
    forever): each a 409 naming the file, and the list goes on without them."""
    c, book, iid = book_client
    folder = book.path / "insights"
    text = (folder / f"{iid}.md").read_text()
    levels = (["&l0 [" + ", ".join(["lol"] * 10) + "]"]
              + [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, 6)])
    bomb, big, fifo = (f"{iid[:-6]}{x}" for x in ("aaaaaa", "bbbbbb", "cccccc"))
    (folder / f"{bomb}.md").write_text(text.replace("title: t\n", f"title: [{', '.join(levels)}]\n", 1))
    (folder / f"{big}.md").write_text(text.replace("words", "w" * (nb.MAX_FILE_BYTES + 1), 1))
    os.mkfifo(folder / f"{fifo}.md")
    for name, words in ((bomb, "must be text"), (big, "more than"), (fifo, "not a regular file")):
        r = c.get(f"/api/insights/{name}")
        detail = message(r)
        assert r.status_code == 409 and f"insights/{name}.md" in detail and words in detail, r.text[:300]
    got = []
    listing = threading.Thread(target=lambda: got.append(c.get("/api/insights")), daemon=True)
    listing.start()
    listing.join(10)
    assert got, "listing the notebook hung on a FIFO"
    assert [i["id"] for i in got[0].json()["insights"]] == [iid]
