"""The lessons and the patching view in a real browser (Debian's Chromium through Playwright), on
the demo model with a notebook, at 1,400 and 400 px: the copy starter's heatmap, where the patched
value position restores the answer; the copying-head lesson clicked through (each step's view
opened on the text, each claim holding), a step saved as an insight, the step kept across a
reload; on a prompt where the copy fails, the lesson says so.

Screenshots go to /tmp/wt-lessons-shots/ (PUFFERGPT_SHOTS) and artifacts/."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import expect

from puffergpt.model import tokenizer
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.session import Run
from puffergpt.notebook import Notebook
from puffergpt.search.manifest import open_engine
from puffergpt.server import create_app
from puffergpt.server.app import serving
from test_demo_model import COPY_HEAD, COPY_LAYER, COPY_PROMPT
from test_playground import ARTIFACTS, TIMEOUT_MS, browser, open_page  # noqa: F401  (browser: a fixture)

SHOTS = Path(os.environ.get("PUFFERGPT_SHOTS", "/tmp/wt-lessons-shots"))
WIDTHS = [1400, 400]
FAILS = "x = 4\nk = 8\nm = 2\nx = 4\nk ="


@pytest.fixture(scope="module")
def served(loaded, demo, tmp_path_factory):
    store, key = loaded(demo)
    book = tmp_path_factory.mktemp("notebook")
    app = create_app(open_engine(store, demo.name, key), reference=lambda: Run(NumpyWeights(demo)),
                     notebook=Notebook(book))
    with serving(app) as url:
        yield url, book


def shot(page, name: str, selector: str | None = None) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    ARTIFACTS.mkdir(exist_ok=True)
    for where in (SHOTS, ARTIFACTS):
        if selector:
            page.locator(selector).screenshot(path=str(where / f"{name}.png"))
        else:
            page.screenshot(path=str(where / f"{name}.png"), full_page=True)


def nothing_wider_than(page, width: int) -> None:
    wide = page.evaluate("""() => { const vw = document.documentElement.clientWidth;
      return [...document.querySelectorAll('body *')]
        .filter(e => e.scrollWidth > vw || e.getBoundingClientRect().right > vw + 0.5)
        .map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.getAttribute('class')} ${e.scrollWidth}`); }""")
    assert wide == [], wide
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width


def cell(p, layer: int, position: int) -> float:
    return float(p.locator(f"#patch-result .patch-cell[data-layer='{layer}'][data-position='{position}']")
                 .get_attribute("data-restored"))


@pytest.mark.parametrize("width", WIDTHS)
def test_the_copy_starters_heatmap_shows_the_value_position(browser, served, demo, width):
    ctx, w = open_page(browser, served[0], width=width, height=1000)
    p = w.page
    p.locator("#patch-starters .starter").first.click()
    expect(p.locator("#patch-answer")).to_have_value(" 3")
    expect(p.locator("#patch-wrong")).to_have_value(" 5")
    runs = 2 + (demo.config.n_layer + 1) * len(tokenizer.encode(COPY_PROMPT))
    expect(p.locator("#patch-cost")).to_contain_text(f"costs {runs} forward passes")
    p.click("#patch-run")
    expect(p.locator("#patch-result .patch-progress .status")).to_contain_text("done", timeout=4 * TIMEOUT_MS)
    value = tokenizer.encode(COPY_PROMPT).index(tokenizer.encode(" 3")[0])
    assert all(cell(p, l, value) > 0.9 for l in range(COPY_LAYER + 1))  # the value's position carries the answer
    assert cell(p, demo.config.n_layer, len(tokenizer.encode(COPY_PROMPT)) - 1) == pytest.approx(1.0)
    expect(p.locator("#patch-result .patch-head .patch-axis").nth(value)).to_have_attribute("title", 'position 6: " 3"')
    expect(p.locator("#patch-result .patch-reading")).to_contain_text('position 6 (" 3")')
    p.locator("#patching-card").scroll_into_view_if_needed()
    shot(p, f"patching-{width}", "#patching-card")
    p.select_option("#patch-mode", "heads")
    p.click("#patch-run")
    expect(p.locator("#patch-result .patch-progress .status")).to_contain_text("done", timeout=4 * TIMEOUT_MS)
    heads = p.locator("#patch-result .patch-cell")
    expect(heads).to_have_count(demo.config.n_layer * demo.config.n_head)
    best = p.evaluate("() => [...document.querySelectorAll('#patch-result .patch-cell')].map(c => +c.dataset.restored)")
    assert best.index(max(best)) == COPY_LAYER * demo.config.n_head + COPY_HEAD
    shot(p, f"patching-heads-{width}", "#patching-card")
    if width == 400:
        nothing_wider_than(p, width)
    assert not w.errors, w.errors
    ctx.close()


def test_patching_can_be_stopped(browser, served):
    ctx, w = open_page(browser, served[0])
    p = w.page
    p.locator("#patch-starters .starter").first.click()
    expect(p.locator("#patch-answer")).to_have_value(" 3")
    p.click("#patch-run")
    expect(p.locator("#patch-result .patch-cell:not(.patch-empty)").first).to_be_visible(timeout=2 * TIMEOUT_MS)
    p.click("#patch-stop")
    expect(p.locator("#patch-result .patch-progress .status")).to_contain_text("stopped")
    expect(p.locator("#patch-run")).to_be_enabled()
    assert p.locator("#patch-result .patch-cell.patch-empty").count() > 0, "stopped: some cells never ran"
    assert not w.errors, w.errors
    ctx.close()


VIEW_SHOWS = {"candidates": "#candidates table", "attention": "#attention .attn-cell", "versus": "#versus",
              "ablate": "#ablate .ablate-result", "lens": "#lens table",
              "patching": "#patch-result .patch-progress .status"}


@pytest.mark.parametrize("width", WIDTHS)
def test_a_lesson_clicked_through_with_an_insight_saved(browser, served, width):
    url, book = served
    ctx, w = open_page(browser, url, width=width, height=1000)
    p = w.page
    p.locator("#lessons .lesson-pick[data-lesson='copying-head']").click()
    expect(p.locator("#prompt")).to_have_value(COPY_PROMPT)  # an empty prompt box takes the starter
    p.click("#lessons .lesson-run")
    step = p.locator("#lesson-step")
    expect(step).to_be_visible(timeout=2 * TIMEOUT_MS)
    n = p.locator("#lessons .lesson-pick[data-lesson='copying-head'] .starter-kind").inner_text()
    steps = int(n.split()[0])
    for i in range(steps):
        expect(step).to_have_attribute("data-step", str(i))
        expect(step.locator(".lesson-claim.holds")).to_be_visible()
        view = step.locator(".lesson-open").inner_text().split("(")[1].rstrip(")")
        step.locator(".lesson-open").click()
        expect(p.locator(VIEW_SHOWS[view]).first).to_be_visible(timeout=3 * TIMEOUT_MS)
        expect(step.locator(".lesson-open")).to_be_enabled(timeout=3 * TIMEOUT_MS)
        if i == 1:
            expect(step.locator(".lesson-claim-text")).to_contain_text(f"L{COPY_LAYER} H{COPY_HEAD}")
        if i + 1 < steps:
            step.locator(".lesson-next").click()
    expect(p.locator("#patch-result .patch-progress .status")).to_contain_text("done", timeout=4 * TIMEOUT_MS)
    p.locator("#lessons-card").scroll_into_view_if_needed()
    shot(p, f"lesson-{width}", "#lessons-card")
    step.locator(".save-insight").click()
    expect(p.locator("#insight-dialog")).to_be_visible()
    expect(p.locator("#insight-evidence")).to_contain_text("From the lesson")
    p.fill("#insight-title", "The copying head carries the answer")
    p.click("#insight-save")
    expect(p.locator("#insight-result .insight-path")).to_be_visible()
    saved = (book / p.locator("#insight-result .insight-path").inner_text()).read_text()
    assert "copying-head" in saved and f"L{COPY_LAYER} H{COPY_HEAD}" in saved
    p.click("#insight-cancel")
    if width == 400:
        nothing_wider_than(p, width)
    p.reload()  # the lesson and its step are kept in this browser
    expect(p.locator("#lesson-step")).to_have_attribute("data-step", str(steps - 1))
    shot(p, f"page-{width}")
    assert not w.errors, w.errors
    ctx.close()


def test_on_a_prompt_where_the_copy_fails_the_lesson_says_so(browser, served):
    ctx, w = open_page(browser, served[0])
    p = w.page
    p.fill("#prompt", FAILS)
    p.locator("#lessons .lesson-pick[data-lesson='copying-head']").click()
    p.click("#lessons .lesson-run")
    claim = p.locator("#lesson-step .lesson-claim")
    expect(claim).to_have_class("lesson-claim fails", timeout=2 * TIMEOUT_MS)
    expect(claim).to_contain_text("Does not hold on your text")
    expect(claim).to_contain_text("answers ' 2', not ' 8'")
    shot(p, "lesson-fails", "#lessons-card")
    assert not w.errors, w.errors
    ctx.close()
