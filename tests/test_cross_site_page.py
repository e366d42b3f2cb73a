"""Cross-site request forgery from a real browser (Debian's Chromium through Playwright):
a page on another origin (another port of 127.0.0.1, served by http.server) sends the
puffergpt server what any page can send without asking first: a form (text/plain, with
the JSON smuggled in a field's name, and url-encoded), a text/plain fetch, a ``no-cors``
fetch and a beacon, to the routes that change state or cost work (a text, a completion,
the tokenizer, an insight, the notebook's push). Each reaches the server and gets a 403;
nothing runs (no store call, no text, no commit in the notebook or its remote). A JSON
fetch is preflighted, and the preflight is refused. A page on an origin allowed with
``--cors-origin`` drives the API (but never the notebook), and the server's own page too."""

from __future__ import annotations

import contextlib
import functools
import subprocess
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from puffergpt import notebook as nb
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.session import Run
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import serving
from test_cross_site import STORE_CALLS, Served, evidence
from test_playground import TIMEOUT_MS, browser  # noqa: F401  (browser: a fixture)

# What a hostile page sends, each way it can: (path, JSON body)
TARGETS = [("/api/texts", {"prompt": "forged"}), ("/v1/completions", {"prompt": "forged", "max_tokens": 2}),
           ("/tokenize", {"prompt": "forged"}), ("/api/insights", {"title": "forged"}), ("/api/insights/push", {})]
ATTACK = """async ([target, routes]) => {
  const sent = [];
  const form = (path, body, enctype) => new Promise((done) => {
    const name = "sink" + sent.length, frame = document.createElement("iframe");
    frame.name = name;
    frame.onload = () => done();
    document.body.append(frame);
    const f = document.createElement("form"), input = document.createElement("input");
    Object.assign(f, {method: "POST", action: target + path, target: name, enctype});
    const json = JSON.stringify({...body, pad: ""});  // {"prompt":"forged","pad":""}: split where a value goes
    Object.assign(input, {type: "hidden", name: json.slice(0, -2), value: json.slice(-2)});
    f.append(input);
    document.body.append(f);
    f.submit();
    sent.push(`form ${enctype} ${path}`);
  });
  const quietly = async (p) => { try { await p; } catch (_) {} };
  for (const [path, body] of routes) {
    const text = JSON.stringify(body);
    await form(path, body, "text/plain");
    await form(path, body, "application/x-www-form-urlencoded");
    await quietly(fetch(target + path, {method: "POST", headers: {"content-type": "text/plain"}, body: text}));
    await quietly(fetch(target + path, {method: "POST", mode: "no-cors", body: text,
                                        headers: {"content-type": "application/json"}}));
    await quietly(fetch(target + path, {method: "POST", headers: {"content-type": "application/json"}, body: text}));
    navigator.sendBeacon(target + path, new Blob([text], {type: "text/plain"}));
    sent.push(`fetches and a beacon ${path}`);
  }
  await new Promise((r) => setTimeout(r, 500));  // the beacons go out after the page asks
  return sent;
}"""
FRIEND = """async ([target]) => {
  const post = async (path, body) => {
    const r = await fetch(target + path, {method: "POST", headers: {"content-type": "application/json"},
                                          body: JSON.stringify(body)});
    return [r.status, await r.json()];
  };
  const completion = await post("/v1/completions", {prompt: "hello", max_tokens: 2, temperature: 0});
  const text = await post("/api/texts", {prompt: "hello"});
  const push = await post("/api/insights/push", {});
  const closed = await fetch(target + "/api/texts/" + text[1].id, {method: "DELETE"});
  return {completion, text, push, closed: closed.status};
}"""


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def static_origin(folder) -> Iterator[str]:
    """A page's origin: http.server on a free port of 127.0.0.1, serving ``folder``."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        thread.join(10)


@pytest.fixture(scope="module")
def sites(loaded, tiny, tmp_path_factory):
    """(the puffergpt server, a hostile origin, an origin allowed with --cors-origin)."""
    tmp = tmp_path_factory.mktemp("cross-site-page")
    (tmp / "index.html").write_text("<!doctype html><title>elsewhere</title><body></body>")
    store, key = loaded(tiny)
    engine = open_engine(store, tiny.name, key)
    book = nb.Notebook(tmp / "notebook")
    insight = book.save("an insight", "saved by the learner", [], evidence(engine, tiny.name)).id
    remote = tmp / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    subprocess.run(["git", "-C", str(book.path), "remote", "add", "origin", str(remote)], check=True)
    with static_origin(tmp) as hostile, static_origin(tmp) as friend:
        app = create_app(engine, ServerConfig(max_open_texts=8, cors_origins=(friend,)),
                         reference=lambda: Run(NumpyWeights(tiny)), notebook=book)
        with serving(app) as url:
            yield Served(app, store, book.path, remote, url, insight), hostile, friend
    for name in STORE_CALLS:
        vars(store).pop(name, None)


def visit(browser, origin: str):  # noqa: F811  (browser: the fixture's value)
    ctx = browser.new_context()
    ctx.set_default_timeout(TIMEOUT_MS)
    page = ctx.new_page()
    page.goto(origin + "/")
    return ctx, page


def test_a_page_elsewhere_sends_what_it_can_and_nothing_runs(browser, sites):  # noqa: F811
    served, hostile, _ = sites
    before = served.state()
    ctx, page = visit(browser, hostile)
    answered = []
    page.on("response", lambda r: answered.append((r.request.method, r.url[len(served.url):], r.status))
            if r.url.startswith(served.url) else None)
    try:
        sent = page.evaluate(ATTACK, [served.url, [[p, b] for p, b in TARGETS]])
    finally:
        ctx.close()
    assert len(sent) == 3 * len(TARGETS), sent
    assert served.state() == before, "a request from another origin ran"
    posts = [(path, status) for method, path, status in answered if method == "POST"]
    for path, _ in TARGETS:  # each reached the server (two forms and at least the text/plain fetch) and was refused
        got = [status for p, status in posts if p == path]
        assert len(got) >= 3 and set(got) == {403}, (path, got)
    print(f"{len(posts)} POSTs from {hostile} answered, all 403; nothing ran")


def test_a_page_on_an_allowed_origin_drives_the_api_but_not_the_notebook(browser, sites):  # noqa: F811
    served, _, friend = sites
    commits = served.state()[2:]
    ctx, page = visit(browser, friend)
    try:
        got = page.evaluate(FRIEND, [served.url])
    finally:
        ctx.close()
    status, completion = got["completion"]
    assert status == 200 and completion["choices"][0]["finish_reason"] == "length", got
    assert got["text"][0] == 201 and got["closed"] == 200, got
    assert got["push"][0] == 403 and "notebook only from its own page" in got["push"][1]["error"]["message"], got
    assert served.state()[2:] == commits  # no commit, nothing pushed


def test_the_servers_own_page_still_drives_it(browser, sites):  # noqa: F811
    """A same-origin fetch sends Origin and Sec-Fetch-Site: same-origin: it passes."""
    served, _, _ = sites
    insights = served.state()[4]
    ctx, page = visit(browser, served.url)
    try:
        got = page.evaluate("""async () => {
          const r = await fetch("/api/texts", {method: "POST", headers: {"content-type": "application/json"},
                                               body: JSON.stringify({prompt: "hello"})});
          const t = await r.json();
          const saved = await fetch("/api/insights", {method: "POST", headers: {"content-type": "application/json"},
                                                      body: JSON.stringify({title: "from the page"})});
          const closed = await fetch("/api/texts/" + t.id, {method: "DELETE", keepalive: true});
          return [r.status, saved.status, closed.status];
        }""")
    finally:
        ctx.close()
    assert got == [201, 201, 200], got
    assert served.state()[4] == insights + 1
