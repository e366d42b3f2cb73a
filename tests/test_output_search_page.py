"""The learner's view of the next token from an index (issue 35), in a real browser (Debian's
Chromium through Playwright) on the demo model with its HNSW index: for the selected token, the
exact and approximate top 40 side by side as the route says, the exact one against numpy's
logits, what the index missed, the rows each scored and the times; on a phone, nothing wider
than the screen; on a store without the index, the command that builds it. Screenshots at
1,400 and 400 px go to /tmp/shots/."""

from __future__ import annotations

import numpy as np
import pytest
from playwright.sync_api import expect

from puffergpt.lens import output_search
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.session import Run
from puffergpt.search.manifest import open_engine
from puffergpt.server import create_app
from puffergpt.server.app import serving
from test_playground import browser, generate, generated, open_page, server, text_id  # noqa: F401
from test_views_page import shot


@pytest.fixture(scope="module")
def indexed_server(indexed, demo):
    store, key, _ = indexed
    with serving(create_app(open_engine(store, demo.name, key), reference=lambda: Run(NumpyWeights(demo)))) as url:
        yield url


def ids_in(side) -> list[int]:
    return [int(x) for x in side.locator("tbody tr").evaluate_all("rs => rs.map(r => r.dataset.tokenId)")]


@pytest.mark.parametrize("width", [1400, 400])
def test_the_view_shows_both_searches_what_the_index_missed_and_their_times(browser, indexed_server, demo, width):
    phone = width == 400
    kw = {"height": 860, "is_mobile": True, "has_touch": True, "device_scale_factor": 1} if phone else {}
    ctx, w = open_page(browser, indexed_server, width=width, **kw)
    p = w.page
    if phone:  # the page's setting: generate through the index (the exact list below is still numpy's)
        p.select_option("#output-search-mode", "approximate")
        with p.expect_request(lambda r: r.url.endswith("/generate")) as sent:
            generate(p, "The list of the", n=4)
        assert sent.value.post_data_json["output_search"] == "approximate"
    else:
        generate(p, "The list of the", n=4)
    expect(p.locator("#error")).to_be_empty()
    tok = generated(p).nth(1)
    tok.click()
    position = int(tok.get_attribute("data-position"))
    if not phone:  # a short search list: the index misses some (the learner's knob)
        p.select_option("#output-search-ef", "10")
    with p.expect_response(lambda r: r.url.endswith("/api/output_search")) as got:
        p.click("#output-search-run")
    assert got.value.ok, got.value.text()
    v = got.value.json()
    box = p.locator("#output-search")
    sides = box.locator(".os-side")
    expect(sides).to_have_count(2)
    expect(sides.nth(0).locator("tbody tr")).to_have_count(40)
    # the page shows the route's two lists, in order; the exact one is numpy's top 40
    assert ids_in(sides.nth(0)) == v["exact"]["ids"] and ids_in(sides.nth(1)) == v["approximate"]["ids"]
    ids = [int(t) for t in p.locator("#tokens .token").evaluate_all("ts => ts.map(t => t.dataset.tokenId)")]
    x = output_search.hidden_states(demo, ids[:position])[-1]
    want = demo.params["wte.weight"].astype(np.float64) @ x
    assert set(v["exact"]["ids"]) == set(np.argsort(-want)[:40].tolist())
    np.testing.assert_allclose(v["approximate"]["logits"], want[v["approximate"]["ids"]], atol=1e-4)
    # what the index missed: exact minus approximate, marked in the exact list and listed
    missed = [i for i in v["exact"]["ids"] if i not in set(v["approximate"]["ids"])]
    assert [m["token"]["token_id"] for m in v["missed"]] == missed
    expect(sides.nth(0).locator("td.os-missed")).to_have_count(len(missed))
    expect(box.locator(".os-missed-list li")).to_have_count(len(missed))
    assert v["recall"] == pytest.approx(1 - len(missed) / 40)
    # rows scored: all of them for exact, the store can't say for the index; each one's time
    expect(sides.nth(0).locator(".os-meta")).to_contain_text(f"all {demo.config.n_vocab:,}")
    expect(sides.nth(1).locator(".os-meta")).to_contain_text("the store does not say")
    assert v["exact"]["ms"] > 0 and v["approximate"]["ms"] > 0
    assert v["index"]["ef_used"] == (v["index"]["ef"] if phone else 10)
    assert [r["kind"] for r in v["requests"]] == ["wte.top_k", "wte.ann"] and all(r["extra"] for r in v["requests"])
    if phone:  # nothing wider than the screen
        assert p.evaluate("document.documentElement.scrollWidth") <= width
    box.scroll_into_view_if_needed()
    shot(p, f"output-search-{width}", p.locator("#output-search-card"))
    assert not w.errors, w.errors
    ctx.close()


def test_a_store_without_the_index_names_the_command_in_the_view(browser, server):
    ctx, w = open_page(browser, server, width=1400)
    p = w.page
    generate(p, "The list of the", n=2)
    generated(p).first.click()
    p.click("#output-search-run")
    expect(p.locator("#output-search .os-unavailable")).to_contain_text("--output-index")
    assert text_id(p) and not w.errors, w.errors
    ctx.close()
