"""The playground in a real browser (Debian's Chromium through Playwright), on the demo
model: generate, inspect a token's candidates, branch, step back, move the temperature
with no request, the waterfall and phases, Compare, text that stays text, the How
page, and the learning views: attention per layer and head, the lens, the embedding
space (neighbours, analogy, the 2D map), the KV cache, and a 400 px wide phone.

Screenshots go to artifacts/ at the repository root."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from puffergpt.model.reference import NumpyWeights
from puffergpt.model.session import Run
from puffergpt.search.manifest import open_engine
from puffergpt.server import create_app
from puffergpt.server.app import serving

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
TIMEOUT_MS = 20_000
expect.set_options(timeout=TIMEOUT_MS)  # a loaded 2-core machine: the first token can take seconds

# The rows of the selected step's own requests in the waterfall: the sections below it (the
# probabilities over all tokens, looking inside, a rerun) hold extra requests, counted apart.
EXTRA_ROWS = ".wf-all tr, .wf-extra tr, .wf-ablate tr"
OWN_ROWS = f"tr.wf-row[data-kind]:not({EXTRA_ROWS})"  # the step's own requests
OWN_LARGEST = f"tr.largest:not({EXTRA_ROWS})"  # the slowest of them (each section marks its own)


@pytest.fixture(scope="module")
def server(loaded, demo):
    """The app over the demo model in an embedded store, served on a free port."""
    store, key = loaded(demo)
    app = create_app(open_engine(store, demo.name, key), reference=lambda: Run(NumpyWeights(demo)))
    with serving(app) as url:
        yield url


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


def open_page(browser, url, width=1440, height=1000, **kw):
    """A new browser context on the playground at url, its model's figures shown: (ctx, Watched page)."""
    ctx = browser.new_context(viewport={"width": width, "height": height}, **kw)
    ctx.set_default_timeout(TIMEOUT_MS)
    w = Watched(ctx.new_page())
    w.page.goto(url + "/")
    expect(w.page.locator("#info")).to_contain_text("requests/token")
    return ctx, w


@pytest.fixture
def page(browser, server):
    ctx, w = open_page(browser, server)
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


def in_view(el, box) -> bool:
    """Whether element el lies inside box's visible rectangle (box scrolls its own content)."""
    return el.evaluate("(e, b) => { const r = e.getBoundingClientRect(), v = b.getBoundingClientRect();"
                       " return r.top >= v.top - 1 && r.bottom <= v.bottom + 1; }", box.element_handle())


def test_generate_inspect_branch_step_back_and_temperature(page):
    p = page.page
    # A prompt whose continuations (the greedy one and the branch) reach no <|endoftext|> on the demo model.
    generate(p, "He said to me that she", n=6)
    expect(generated(p)).to_have_count(6)
    assert p.locator("#tokens .token.prompt").count() >= 5
    expect(page.page.locator("#error")).to_be_empty()

    first = generated(p).first
    pos = int(first.get_attribute("data-position"))
    first.click()
    rows = p.locator("#candidates tbody tr")
    expect(rows).to_have_count(40)
    expect(p.locator("#candidates tbody tr.chosen")).to_have_count(1)
    head = p.locator("#candidates thead").inner_text()
    # the model's own over all tokens at T = 1 and at the slider's T, and the sampler's over the top k
    assert head.count("p at T=") == 3 and head.count("over all 50,257 tokens") == 2, head
    assert head.count("the sampler's, over the top 40") == 1, head
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
    # At T = 1 the slider's column over all tokens equals the model's own column.
    assert [rows.nth(i).locator(".p-all").inner_text() for i in range(5)] == \
        [rows.nth(i).locator(".p-all1").inner_text() for i in range(5)]
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
    # More tokens than the demo model's context of 256: the server's 400 is shown as text.
    generate(p, "A man", n=300)  # a prompt the demo model continues past 100 tokens (no <|endoftext|>)
    expect(p.locator("#error")).to_contain_text("would not fit the model's context of 256 tokens")
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


def test_waterfall_and_phases(page, server):
    p = page.page
    generate(p, "one two three one two three one two", n=4)
    expect(generated(p)).to_have_count(4)
    info = httpx.get(p.url.rstrip("/") + "/api/info").json()
    per_token = info["requests_per_token"]

    generated(p).first.click()  # the prefill step
    wf = p.locator("#waterfall")
    expect(wf.locator(OWN_ROWS)).to_have_count(per_token)
    # Opening the step's candidates asked once for the probabilities over all tokens: one search more,
    # in a section of its own below the step's requests.
    expect(wf.locator(".wf-all tr.wf-row[data-kind]")).to_have_count(1)
    assert wf.locator(".wf-all tr.wf-row").get_attribute("data-kind") == "wte.all"
    kinds = wf.locator(OWN_ROWS).evaluate_all("rs => rs.map(r => r.dataset.kind)")
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
    trips = httpx.get(server + "/api/info").json()["round_trips_per_token"]
    expect(phases.locator(".phase-decode")).to_contain_text(f"{trips} round trips/token (one after another)")
    expect(phases.locator(".phase-decode")).to_contain_text("per token")
    expect(phases.locator(".saving")).to_be_visible()

    generated(p).nth(1).click()  # a decode step
    expect(wf).to_contain_text("Decode")
    expect(wf.locator(OWN_ROWS)).to_have_count(per_token)
    # The slowest round trip is marked, named in the summary, and in view without scrolling:
    # the slowest of the requests on the critical path (a concurrent key write makes no one wait).
    log = wf.locator(OWN_ROWS).evaluate_all(
        "rs => rs.map(r => r.classList.contains('concurrent') ? -1 : parseFloat(r.querySelector('td:nth-child(7)').textContent))"
    )
    largest = wf.locator(OWN_LARGEST)
    expect(largest).to_have_count(1)
    assert int(largest.locator("td.idx").inner_text()) - 1 == log.index(max(log))
    expect(wf.locator(".stat-largest")).to_contain_text(largest.get_attribute("data-kind"))
    assert in_view(largest, wf.locator(".wf-scroll").first), "the slowest request is scrolled out of its box"
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
    # The result comes into view by itself (the button is far above it).
    p.wait_for_function("() => { const r = document.querySelector('#compare-result').getBoundingClientRect();"
                        " return r.top >= 0 && r.top < window.innerHeight; }")
    shot(p, "playground-compare")


def test_markup_in_prompts_stays_text(page):
    p = page.page
    prompt = "<img src=x onerror=alert(1)> and <script>window.__pwned=1</script> is"  # continued, not ended
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
    expect(p.locator('[data-live="lens_searches"]')).to_have_text(str(info["config"]["n_layer"] + 1))
    for words in ("(M² + |q|² − distance) / 2", "inner-product variant", "layer, head", "50,257",
                  "layer norm", "GELU", "Prefill", "Decode", "t + 1", "logit lens", "wte[B] − wte[A] + wte[C]",
                  "The KV cache is a namespace"):
        expect(p.locator("main")).to_contain_text(words)
    shot(p, "how")


# --- the learning views (issue 10) ---

def api_get(page: Page, path: str):
    root = re.match(r"https?://[^/]+", page.url).group(0)
    r = httpx.get(root + path, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def text_id(page: Page) -> str:
    tid = page.get_attribute("#tokens", "data-text-id")
    assert tid, "the page has no open text"
    return tid


def open_inside(page: Page, nth: int = 1):
    """Select the nth generated token and look inside it; the API's view of the same step."""
    tok = generated(page).nth(nth)
    tok.click()
    position = int(tok.get_attribute("data-position"))
    with page.expect_response(lambda r: "/inspect" in r.url) as got:
        page.click("#look-inside")
    expect(page.locator("#inside .attn-cell").first).to_be_visible()
    assert got.value.ok, got.value.text()
    return position, got.value.json()  # what the page was given, searches and all


def test_first_run_teaches(page, server):
    p = page.page
    info = httpx.get(server + "/api/info").json()
    # The header says which model this is, what the demo is and how to get GPT-2 small.
    about = p.locator("#about")
    expect(about).to_contain_text(info["about"]["name"])
    assert info["about"]["is_demo"]
    expect(about).to_contain_text(info["about"]["description"])
    expect(about).to_contain_text(info["about"]["how_to_get_gpt2"])
    # The starters are the server's, chosen for this model.
    starters = p.locator("#starters .starter")
    expect(starters).to_have_count(len(info["starters"]))
    assert starters.evaluate_all("bs => bs.map(b => b.dataset.prompt)") == [s["prompt"] for s in info["starters"]]
    # The embedding panel starts from the server's words for this model.
    words = info["embedding_words"]
    assert p.locator("#nb-word").input_value() == words["neighbours"]
    assert [p.locator(f"#an-{x}").input_value() for x in "abc"] == words["analogy"]
    assert p.locator("#map-words").input_value().split("\n") == words["map"]
    # A token that is only spaces or a newline is visible; a split character shows its bytes.
    generate(p, "def f():\n\n    return 日本", n=2)
    tokens = p.locator("#tokens")
    expect(tokens.locator(".token.prompt .ws").first).to_be_visible()
    assert "↵" in tokens.inner_text() and "·" in tokens.inner_text()
    shown = tokens.inner_text()
    assert "\ufffd" not in shown and re.search(r"<e[0-9a-f]>", shown), shown  # 日 is 3 bytes over 2 tokens
    shot(p, "playground-first-run")


def test_attention_grid_and_one_head(page):
    p = page.page
    generate(p, "one two three one two three one two", n=4)
    position, want = open_inside(p, 1)
    L, H = len(want["attention"]), len(want["attention"][0])
    cells = p.locator("#inside .attn-cell")
    expect(cells).to_have_count(L * H)
    expect(p.locator("#inside")).to_contain_text("position t's output predicts token t + 1")
    # Open one head: its keys best first, with the weights and scores the search returned.
    layer, head = L - 1, H - 1
    p.click(f'#inside .attn-cell[data-layer="{layer}"][data-head="{head}"]')
    rows = p.locator("#inside .attn-head tbody tr")
    weights, scores = want["attention"][layer][head], want["scores"][layer][head]
    assert len(weights) == position and abs(sum(weights) - 1) < 1e-5
    order = sorted(range(position), key=lambda j: -weights[j])
    expect(rows).to_have_count(min(position, 16))
    shown = rows.evaluate_all("rs => rs.map(r => Number(r.dataset.position))")
    assert [weights[j] for j in shown] == sorted(weights, reverse=True)[: len(shown)], (shown, order)
    for i, j in enumerate(shown[:3]):
        assert abs(float(rows.nth(i).locator("td").nth(3).inner_text()) - scores[j]) < 5e-4
    # The extra searches are counted in the waterfall.
    expect(p.locator("#waterfall .wf-extra h3")).to_contain_text(f"{len(want['requests'])} extra request")
    shot(p, "playground-attention")


def test_lens_table(page):
    p = page.page
    generate(p, "The for statement is used to", n=3)
    position, want = open_inside(p, 0)
    rows = p.locator("#inside .lens-table tbody tr")
    expect(rows).to_have_count(len(want["lens"]))
    assert len(want["lens"]) == len(want["attention"]) + 1  # the embedding, each block, the final candidates
    for i, entry in enumerate(want["lens"]):
        chips = rows.nth(i).locator(".lens-chip")
        expect(chips).to_have_count(len(entry["top"]))
        rank = rows.nth(i).locator("td.rank").inner_text()
        assert rank == (
            str(entry["chosen_rank"] + 1) if entry["chosen_rank"] is not None else f"not in top {len(entry['top'])}"
        )
    # The decided layer: the smallest from which every layer's top-1 is the final top-1.
    tops = [entry["top"][0]["token_id"] for entry in want["lens"]]
    decided = min(l for l in range(len(tops)) if all(t == tops[-1] for t in tops[l:]))
    assert want["decided_layer"] == decided
    expect(p.locator("#inside .lens-table tr.decided")).to_have_attribute("data-layer", str(decided))
    expect(p.locator("#inside .decided-note")).to_contain_text(f"The decided layer is layer {decided}")
    shot(p, "playground-lens")


def test_analogy_neighbours_and_a_multi_token_word(page, server):
    p = page.page
    for field, value in (("#an-a", " man"), ("#an-b", " king"), ("#an-c", " woman"), ("#an-k", "5")):
        p.fill(field, value)
    p.click("#an-go")
    want = httpx.post(server + "/api/analogy", json={"a": " man", "b": " king", "c": " woman", "k": 5}).json()
    rows = p.locator("#analogy-result tbody tr")
    expect(rows).to_have_count(5)
    assert rows.evaluate_all("rs => rs.map(r => Number(r.dataset.tokenId))") == [r["token_id"] for r in want["results"]]
    ops = [r["op"] for r in want["requests"]]
    assert ops == ["fetch", "search"]  # the words' vectors, then one search over all the token vectors
    expect(p.locator("#analogy-result .searched")).to_contain_text(
        "1 fetch of the words' vectors by id, then 1 exact search over"
    )
    # A word of several tokens: the server's message, naming its tokens, shown as it is.
    p.fill("#an-a", "puffergpt")
    p.click("#an-go")
    bad = httpx.post(server + "/api/analogy", json={"a": "puffergpt", "b": " king", "c": " woman", "k": 5})
    assert bad.status_code == 400
    expect(p.locator("#analogy-result .emb-error")).to_have_text(bad.json()["error"]["message"])
    p.fill("#nb-word", " king")
    p.click("#nb-go")
    expect(p.locator("#neighbours-result tbody tr")).to_have_count(10)
    shot(p, "playground-analogy")


def test_map_with_a_path(page):
    p = page.page
    generate(p, "The for statement is used to", n=2)
    generated(p).first.click()
    p.click("#map-go")
    words = [w for w in p.locator("#map-words").input_value().split("\n") if w.strip()]
    expect(p.locator("#map-result svg.map .map-point")).to_have_count(len(words))
    L = int(httpx.get(p.url.rstrip("/") + "/api/info").json()["config"]["n_layer"])
    expect(p.locator("#map-result svg.map .map-step")).to_have_count(L + 1)
    # Every point is labelled, or counted as left off where its label would cover another.
    labels = p.locator("#map-result svg.map .map-point text").evaluate_all("ts => ts.map(t => t.textContent)")
    assert set(labels) <= {w.replace(" ", "·") for w in words}
    if len(labels) < len(words):
        expect(p.locator("#map-result .map-hidden")).to_contain_text(f"{len(words) - len(labels)} label")
    shot(p, "playground-map")


def test_kv_cache_panel(page):
    p = page.page
    generate(p, "one two three one two three", n=3)
    kv = p.locator("#kv")
    expect(kv.locator(".kv-pos")).not_to_have_count(0)
    want = api_get(p, f"/api/texts/{text_id(p)}/kv")
    expect(kv.locator(".kv-pos")).to_have_count(want["known"])
    stored = kv.locator(".kv-pos").evaluate_all("es => es.map(e => [e.dataset.stored === 'true', e.dataset.phase])")
    assert stored == [[q["stored"], q["written_by"]["phase"] if q["stored"] else "none"] for q in want["positions"]]
    expect(kv.locator(".kv-writes tbody tr")).to_have_count(len(want["writes"]))
    expect(kv).to_contain_text("Why decode reads only the new token")
    # A step back keeps the keys after it: they are shown as kept. (The last token has
    # none yet: the model reads it when it writes the next one; so step back twice.)
    p.click("#step-back")
    expect(p.locator("#step-back")).to_be_enabled()
    p.click("#step-back")
    expect(kv.locator(".kv-pos.kv-kept")).not_to_have_count(0)
    shot(p, "playground-kv")


def test_a_400px_phone(browser, server):
    ctx = browser.new_context(viewport={"width": 400, "height": 860}, is_mobile=True, device_scale_factor=1)
    ctx.set_default_timeout(TIMEOUT_MS)
    p = ctx.new_page()
    errors = []
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.goto(server + "/")
    expect(p.locator("#info")).to_contain_text("requests/token")
    generate(p, "The for statement is used to", n=4)
    open_inside(p, 1)
    p.locator("#inside .attn-cell").first.click()
    p.click("#an-go")
    expect(p.locator("#analogy-result tbody tr").first).to_be_visible()
    p.click("#map-go")
    expect(p.locator("#map-result svg.map")).to_be_visible()
    p.fill("#prompt", "1, 2, 3, 4, 5,")
    p.fill("#top-k", "10")
    p.click("#compare")
    expect(p.locator("#compare-result tbody tr")).to_have_count(10)
    # No element wider than the screen, and none reaching past its right edge.
    wide = p.evaluate("""() => { const vw = document.documentElement.clientWidth;
      return [...document.querySelectorAll('body *')].filter(e => e.scrollWidth > vw || e.getBoundingClientRect().right > vw + 0.5)
        .map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.getAttribute('class')} ${e.scrollWidth}`); }""")
    assert wide == [], wide
    assert p.evaluate("() => document.documentElement.scrollWidth") <= 400
    # No hidden columns: every cell of every table is displayed, each naming its column.
    # (A row the candidates' fold hides, tr[hidden] until "show 40", is not a hidden column.)
    hidden = p.evaluate("""() => [...document.querySelectorAll('tbody td')].filter(td => td.offsetParent === null
      && !td.closest('tr[hidden]')
      && td.closest('.card') && getComputedStyle(td.closest('.card')).display !== 'none').length""")
    assert hidden == 0
    unnamed = p.evaluate(
        "() => [...document.querySelectorAll('.table-scroll tbody td')].filter(td => td.dataset.label === undefined).length"
    )
    assert unnamed == 0
    shot(p, "playground-phone")
    assert not errors, errors
    ctx.close()
