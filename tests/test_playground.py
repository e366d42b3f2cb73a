"""The playground in a real browser (Debian's Chromium through Playwright): generate,
inspect a token's candidates, branch, step back, move the temperature with no request,
the waterfall and phases, Compare, text that stays text, and the How page.

Screenshots go to artifacts/ at the repository root."""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from playwright.sync_api import Page, expect, sync_playwright

from puffergpt import checkpoints, loading
from puffergpt.engine import Engine
from puffergpt.reference import NumpyProducts
from puffergpt.server import create_app
from puffergpt.stores import open_store

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
TIMEOUT_MS = 20_000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The app over the tiny model in a temp embedded store, served on a free port."""
    tmp = tmp_path_factory.mktemp("playground")
    ckpt_dir = checkpoints.make_model(tmp / "tiny", "tiny", seed=0)
    ckpt = checkpoints.load(str(ckpt_dir))
    store = open_store("embedded", tmp / "store")
    loading.load(store, ckpt, loading.model_key(ckpt.name), progress=False)
    engine = Engine(store, ckpt.name)
    app = create_app(engine, reference=lambda: NumpyProducts(ckpt))
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the playground server did not start")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)
    store.close()


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"the browser tests need Debian's Chromium at {CHROMIUM}: run `make test`, which installs it")
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run", "--disable-quic"])
        yield b
        b.close()


class Watched:
    """A page with what it did recorded: API requests, dialogs, console errors."""

    def __init__(self, page: Page):
        self.page = page
        self.api: list[str] = []
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.api.append(f"{r.method} {r.url}") if "/api/" in r.url else None)
        page.on("dialog", self._dialog)
        page.on("pageerror", lambda e: self.errors.append(str(e)))

    def _dialog(self, d):
        self.dialogs.append(d.message)
        d.dismiss()


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(viewport={"width": 1440, "height": 1000})
    ctx.set_default_timeout(TIMEOUT_MS)
    p = ctx.new_page()
    w = Watched(p)
    p.goto(server + "/")
    expect(p.locator("#info")).to_contain_text("requests/token")
    yield w
    assert not w.errors, f"the page raised: {w.errors}"
    ctx.close()


def shot(page: Page, name: str) -> None:
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def generate(page: Page, prompt: str, n: int = 6, temperature: str = "0") -> None:
    page.fill("#prompt", prompt)
    page.fill("#max-tokens", str(n))
    page.fill("#top-k", "40")
    set_temperature(page, temperature)
    page.click("#generate")
    wait_idle(page)


def wait_idle(page: Page) -> None:
    expect(page.locator("#generate")).to_be_enabled()
    expect(page.locator("#stop")).to_be_disabled()


def set_temperature(page: Page, value: str) -> None:
    page.locator("#temperature").fill(value)
    expect(page.locator("#temperature-value")).to_have_text(f"{float(value):.2f}")


def generated(page: Page):
    return page.locator("#tokens .token.generated")


def test_generate_inspect_branch_step_back_and_temperature(page):
    p = page.page
    generate(p, "The capital of France is", n=6)
    expect(generated(p)).to_have_count(6)
    assert p.locator("#tokens .token.prompt").count() >= 5
    expect(page.page.locator("#error")).to_be_empty()

    first = generated(p).first
    pos = int(first.get_attribute("data-position"))
    first.click()
    rows = p.locator("#candidates tbody tr")
    expect(rows).to_have_count(40)
    expect(p.locator("#candidates tbody tr.chosen")).to_have_count(1)
    assert p.locator("#candidates thead").inner_text().count("p at T=") == 2
    # At T = 0 the best candidate took all the mass; the cumulative column ends at 100%.
    expect(rows.nth(0).locator(".p-t")).to_have_text("100%")
    expect(rows.nth(39).locator(".cum")).to_have_text("100%")
    shot(p, "playground-generated")

    # Branch to the second-best candidate: the token there changes, and generation continues.
    old_id = first.get_attribute("data-token-id")
    want_id = rows.nth(1).get_attribute("data-token-id")
    assert want_id != old_id
    p.click('#candidates .branch[data-rank="1"]')
    wait_idle(p)
    at = p.locator(f'#tokens .token[data-position="{pos}"]')
    expect(at).to_have_attribute("data-token-id", want_id)
    expect(at).to_have_class(re.compile(r"\bbranched\b"))
    expect(generated(p)).to_have_count(7)  # the branched token and 6 more
    expect(p.locator("#tree .tree-node")).to_have_count(2)  # two continuations fork at pos
    shot(p, "playground-branched")

    # Step back: the text is one token shorter, and the token stays known (Forward is on).
    before = generated(p).count()
    p.click("#step-back")
    expect(generated(p)).to_have_count(before - 1)
    expect(p.locator("#tokens .token.ghost")).to_have_count(1)
    expect(p.locator("#step-forward")).to_be_enabled()
    p.click("#step-forward")
    expect(generated(p)).to_have_count(before)

    # The temperature slider recomputes the open table from the stored logits: no request.
    generated(p).first.click()
    expect(rows).to_have_count(40)
    set_temperature(p, "0")
    t0 = [rows.nth(i).locator(".p-t").inner_text() for i in range(5)]
    n_api = len(page.api)
    set_temperature(p, "1")
    expect(p.locator("#p-temp-head")).to_have_text("p at T=1.00")
    t1 = [rows.nth(i).locator(".p-t").inner_text() for i in range(5)]
    assert t1 != t0, (t0, t1)
    # At T = 1 the slider's column equals the model's own column.
    assert t1 == [rows.nth(i).locator(".p-t1").inner_text() for i in range(5)]
    set_temperature(p, "1.5")
    t15 = [rows.nth(i).locator(".p-t").inner_text() for i in range(5)]
    assert t15 != t1
    p.wait_for_timeout(200)
    assert len(page.api) == n_api, f"moving the slider made requests: {page.api[n_api:]}"

    # Going back in the tree restores the first continuation.
    p.locator("#tree .tree-node").nth(0).click()
    expect(p.locator(f'#tokens .token[data-position="{pos}"]')).to_have_attribute("data-token-id", old_id)
    expect(p.locator("#tokens .token:not(.ghost)")).to_have_count(pos + 6)
    expect(page.page.locator("#error")).to_be_empty()

    # Cut at a selected token: it and everything after it go.
    p.locator(f'#tokens .token[data-position="{pos + 2}"]').click()
    p.click("#cut")
    expect(p.locator("#tokens .token")).to_have_count(pos + 2)
    expect(p.locator("#tokens .token.ghost")).to_have_count(0)


def test_stop_and_api_errors(page):
    p = page.page
    # More tokens than the tiny model's context of 128: the server's 400 is shown as text.
    generate(p, "1, 2, 3, 4, 5,", n=200)
    expect(p.locator("#error")).to_contain_text("would not fit the model's context of 128 tokens")
    expect(generated(p)).to_have_count(0)

    # Stop ends a long generation early and leaves a consistent text.
    p.fill("#max-tokens", "100")
    p.click("#generate")
    expect(p.locator("#error")).to_be_empty()
    expect(generated(p).nth(2)).to_be_attached()
    p.click("#stop")
    wait_idle(p)
    expect(p.locator("#status")).to_contain_text("stopped")
    n = generated(p).count()
    assert 3 <= n < 100


def test_waterfall_and_phases(page):
    p = page.page
    generate(p, "one two three one two three one two", n=4)
    expect(generated(p)).to_have_count(4)
    info = httpx.get(p.url.rstrip("/") + "/api/info").json()
    per_token = info["requests_per_token"]

    generated(p).first.click()  # the prefill step
    wf = p.locator("#waterfall")
    expect(wf.locator("tr.wf-row[data-kind]")).to_have_count(per_token)
    kinds = wf.locator("tr.wf-row[data-kind]").evaluate_all("rs => rs.map(r => r.dataset.kind)")
    assert kinds[0] == "embed" and kinds[-1] == "wte.top_k"
    assert "h.0.mlp.c_fc" in kinds and "h.0.attn.scores" in kinds
    expect(wf).to_contain_text("h.0.mlp.c_fc")
    expect(wf).to_contain_text("Prefill")
    expect(wf.locator(".track .bar").first).to_be_visible()
    expect(wf).to_contain_text("$")

    phases = p.locator("#phases")
    prompt_tokens = p.locator("#tokens .token.prompt").count()
    expect(phases.locator(".phase-prefill")).to_contain_text(f"{prompt_tokens} tokens read in {per_token} requests")
    expect(phases.locator(".phase-decode")).to_contain_text(f"{per_token} requests/token")
    expect(phases.locator(".phase-decode")).to_contain_text("per token")
    expect(phases.locator(".saving")).to_be_visible()

    generated(p).nth(1).click()  # a decode step
    expect(wf).to_contain_text("Decode")
    expect(wf.locator("tr.wf-row[data-kind]")).to_have_count(per_token)
    shot(p, "playground-waterfall")


def test_compare_shows_the_max_difference(page):
    p = page.page
    p.fill("#prompt", "1, 2, 3, 4, 5,")
    p.fill("#top-k", "10")
    p.click("#compare")
    result = p.locator("#compare-result")
    expect(result.locator(".max-diff")).to_have_text(re.compile(r"^\d\.\d\de[-+]\d+$"))
    expect(result.locator("tbody tr")).to_have_count(10)
    expect(result).to_contain_text("max |search − numpy|")
    diff = float(result.locator(".max-diff").inner_text())
    assert diff < 1e-3
    result.scroll_into_view_if_needed()
    shot(p, "playground-compare")


def test_markup_in_prompts_stays_text(page):
    p = page.page
    prompt = "<img src=x onerror=alert(1)> and <script>window.__pwned=1</script>"
    generate(p, prompt, n=3)
    tokens = p.locator("#tokens")
    expect(generated(p)).to_have_count(3)
    shown = "".join(p.locator("#tokens .token.prompt").all_inner_texts())
    assert shown == prompt
    expect(tokens).to_contain_text("<img src=x onerror=alert(1)>")
    expect(tokens).to_contain_text("<script>window.__pwned=1</script>")
    assert p.locator("img").count() == 0
    assert p.locator("#tokens script, #candidates script, #tree script").count() == 0
    # The tree and the error box also show it as text.
    expect(p.locator("#tree .tree-prompt")).to_contain_text("<script>")
    # An error is shown as text too.
    p.fill("#prompt", "")
    p.click("#generate")
    expect(p.locator("#error")).to_contain_text("type a prompt first")
    p.wait_for_timeout(300)
    assert page.dialogs == []
    assert p.evaluate("() => typeof window.__pwned") == "undefined"
    shot(p, "playground-markup")


def test_how_page_shows_live_figures(page, server):
    p = page.page
    p.click("#how-link")
    p.wait_for_url(server + "/how")
    info = httpx.get(server + "/api/info").json()
    figures = p.locator("#how-figures")
    expect(figures).to_have_class(re.compile(r"\bloaded\b"))
    expect(figures.locator('[data-live="documents"]')).to_have_text(f"{info['documents']:,}")
    expect(figures.locator('[data-live="megabytes"]')).to_have_text(f"{info['megabytes']} MB")
    expect(figures.locator('[data-live="requests_per_token"]')).to_have_text(str(info["requests_per_token"]))
    expect(figures.locator('[data-live="layers"]')).to_have_text(str(info["config"]["n_layer"]))
    expect(figures.locator('[data-live="width"]')).to_have_text(str(info["config"]["n_embd"]))
    for words in ("(M² + |q|² − distance) / 2", "inner-product variant", "layer, head", "50,257",
                  "layer norm", "GELU", "Prefill", "Decode"):
        expect(p.locator("main")).to_contain_text(words)
    shot(p, "how")
