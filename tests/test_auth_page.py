"""A real browser (Debian's Chromium through Playwright) against a server started with an
API key and one allowed origin (issue 33, items 1 and 2):

- a page on the allowed origin (another port of 127.0.0.1) calls ``/v1/completions`` with
  ``fetch`` and ``Authorization: Bearer KEY``: the browser's preflight is answered
  (Starlette's CORSMiddleware), the answer carries ``Access-Control-Allow-Origin``, and the
  page reads the completion; without the key it reads the 401 and its code;
- the server's own page shows the key field; without a key Generate says why (401), with the
  key typed in it generates, the key is kept in the browser (``localStorage``) and still
  there after a reload, and it was sent only to this server."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect

from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import serving
from test_cross_site_page import static_origin
from test_playground import TIMEOUT_MS, browser, generate, generated, open_page  # noqa: F401  (browser: a fixture)

KEY = "page-key-0123456789"
CALL = """async ([target, key]) => {
  const ask = async (headers) => {
    const r = await fetch(target + "/v1/completions", {method: "POST",
      headers: {"content-type": "application/json", ...headers},
      body: JSON.stringify({prompt: "hello", max_tokens: 2, temperature: 0})});
    return [r.status, await r.json()];
  };
  return {without: await ask({}), with: await ask({authorization: "Bearer " + key})};
}"""


@pytest.fixture(scope="module")
def sites(loaded, demo, tmp_path_factory):
    """(the puffergpt server with KEY and the allowed origin, the allowed origin)."""
    tmp = tmp_path_factory.mktemp("auth-page")
    (tmp / "index.html").write_text("<!doctype html><title>a client elsewhere</title><body></body>")
    store, key = loaded(demo)
    with static_origin(tmp) as friend:
        app = create_app(open_engine(store, demo.name, key), ServerConfig(api_keys=(KEY,), cors_origins=(friend,)))
        with serving(app) as url:
            yield url, friend


def test_a_page_elsewhere_calls_v1_with_the_key(browser, sites):  # noqa: F811
    url, friend = sites
    ctx = browser.new_context()
    ctx.set_default_timeout(TIMEOUT_MS)
    page = ctx.new_page()
    seen = []
    page.on("response", lambda r: seen.append((r.request.method, r.status,
                                               r.headers.get("access-control-allow-origin")))
            if r.url.startswith(url) else None)
    try:
        page.goto(friend + "/")
        got = page.evaluate(CALL, [url, KEY])
    finally:
        ctx.close()
    status, body = got["with"]
    assert status == 200 and body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 2
    status, body = got["without"]
    assert status == 401 and body["error"]["code"] == "invalid_api_key", got  # readable: CORS headers on a 401 too
    assert {(m, s, o) for m, s, o in seen if m == "POST"} == {("POST", 200, friend), ("POST", 401, friend)}, seen
    # a JSON POST with Authorization is preflighted first (Chromium sends it from its network service, which
    # Playwright does not show): the POSTs above ran, so it was answered; here is what the browser was told
    r = httpx.options(url + "/v1/completions", headers={"origin": friend, "access-control-request-method": "POST",
                                                        "access-control-request-headers": "authorization,content-type"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == friend, r.text
    assert "authorization" in r.headers["access-control-allow-headers"].lower(), r.headers
    r = httpx.options(url + "/v1/completions", headers={"origin": "http://evil.example",
                                                        "access-control-request-method": "POST"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers  # another origin: no


def test_the_pages_key_field_keeps_the_key_in_the_browser(browser, sites):  # noqa: F811
    url, _ = sites
    ctx, w = open_page(browser, url)
    p = w.page
    sent = []
    p.on("request", lambda r: sent.append((r.url, r.headers.get("authorization"))))
    try:
        expect(p.locator("#key-form")).to_be_visible()
        generate(p, "The list", n=3)
        expect(p.locator("#error")).to_contain_text("API key")  # the 401's own words: which header, where
        expect(generated(p)).to_have_count(0)
        p.fill("#api-key", KEY)
        p.locator("#api-key").dispatch_event("change")
        generate(p, "The list", n=3)
        expect(generated(p)).to_have_count(3)
        assert p.evaluate("() => localStorage.getItem('puffergpt.apiKey')") == KEY
        p.reload()
        expect(p.locator("#api-key")).to_have_value(KEY)  # kept in the browser, filled in again
        assert all(u.startswith(url) for u, a in sent if a), "the key went somewhere else"
        assert (f"Bearer {KEY}" in {a for _, a in sent}), sent
    finally:
        ctx.close()
    assert not w.errors, w.errors
