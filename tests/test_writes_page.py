"""Issue 41 in a real browser (Debian's Chromium through Playwright) on the demo model, at 1,400 and 400 px:
the candidates panel shows the model's own probabilities over all tokens beside the sampler's over the top k,
states the shown candidates' mass and folds to the top 5; an opened head says what it writes, and on the copy
starter L2 H2 takes " 3"'s value and pushes " 3", its pieces summing to its bar in the attribution chart.
Numbers are checked against the routes' JSON (the routes against transformers: tests/test_writes.py).
Screenshots to /tmp/wt-writes-shots/."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from test_playground import (  # noqa: F401  (browser: a fixture)
    api_get,
    browser,
    generate,
    generated,
    open_inside,
    open_page,
    server,
    set_temperature,
    text_id,
)

SHOTS = Path("/tmp/wt-writes-shots")
COPY = "a = 7\nb = 3\nc = 9\na = 7\nb ="


@pytest.mark.parametrize("width", [1400, 400])
def test_probabilities_over_all_tokens_and_what_l2_h2_writes(browser, server, width):
    phone = width == 400
    kw = {"is_mobile": True, "has_touch": True, "device_scale_factor": 1} if phone else {}
    ctx, w = open_page(browser, server, width=width, height=860 if phone else 1000, **kw)
    p = w.page
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        generate(p, COPY, n=1)
        tok = generated(p).first
        position = int(tok.get_attribute("data-position"))
        tok.click()
        mass = p.locator("#candidates .cand-mass")
        expect(mass).to_contain_text("These 40 hold")  # the page asked once (a search), then kept it
        root = re.match(r"https?://[^/]+", p.url).group(0)
        r = httpx.post(f"{root}/api/texts/{text_id(p)}/steps/{position}/probabilities", json={}, timeout=30)
        assert r.status_code == 200 and r.json()["requests"] == [], r.text  # kept on the step: no search again
        want = r.json()
        rows = p.locator("#candidates tbody tr")
        expect(rows).to_have_count(40)
        # Folded to the top 5; "show 40" unfolds.
        expect(p.locator("#candidates tbody tr:visible")).to_have_count(5)
        head = p.locator("#candidates thead").inner_text()
        assert "over all 50,257 tokens" in head and "the sampler's, over the top 40" in head, head
        p_all = [c["p_all"] for c in want["candidates"]]
        assert 0 < sum(p_all) <= 1 and abs(sum(p_all) - want["mass"]) < 1e-12
        expect(mass).to_contain_text(f"{want['mass'] * 100:.1f}%")
        shown = [rows.nth(i).locator(".p-all1 .pval").inner_text() for i in range(5)]
        assert shown[0].endswith("%") and shown[0] != "100%", shown  # the model's own, not renormalised
        expect(rows.nth(0).locator(".p-t .pval")).to_have_text("100%")  # T = 0: the sampler takes the best
        p.locator("#candidates .cand-fold").click()
        expect(p.locator("#candidates tbody tr:visible")).to_have_count(40)
        set_temperature(p, "1")
        sampler = sum(float(rows.nth(i).locator(".p-t .pval").inner_text().rstrip("%<")) for i in range(3))
        model = sum(float(rows.nth(i).locator(".p-all .pval").inner_text().rstrip("%<")) for i in range(3))
        assert model < sampler, (model, sampler)  # over all tokens, the same candidates hold less
        expect(p.locator("#waterfall .wf-all h3")).to_contain_text("1 extra request")
        SHOTS.joinpath(f"candidates-{width}.png").write_bytes(p.locator("#candidates").screenshot())
        p.locator("#candidates .cand-fold").click()

        # Look inside, open L2 H2, ask what it writes.
        _, view = open_inside(p, 0)
        bar = next(x["value"] for x in view["attribution"]["parts"] if x["label"] == "L2 H2")
        p.locator('#inside .attn-cell[data-layer="2"][data-head="2"]').click()
        note = p.locator("#inside .attn-head .note").first
        expect(note).to_contain_text("the search returned q·k and the server divided it by √d")
        with p.expect_response(lambda r: "/writes" in r.url) as got:
            p.locator("#inside .writes-go").click()
        assert got.value.ok, got.value.text()
        writes = got.value.json()
        assert abs(writes["total"] - bar) <= 1e-4 and writes["token"]["text"] == " 3"
        first = p.locator("#inside .writes-table tbody tr").first
        expect(first.locator("td.tok")).to_contain_text("3")
        top = first.locator(".writes-tok").first
        expect(top).to_have_class("writes-tok is-chosen")  # the piece from " 3" pushes " 3" most
        expect(p.locator("#inside .writes-total")).to_contain_text(f"{'+' if bar >= 0 else '−'}{abs(bar):.3f}")
        expect(p.locator("#inside .writes-says")).to_contain_text("this head's bar")
        SHOTS.joinpath(f"writes-{width}.png").write_bytes(p.locator("#attention .attn-head").screenshot())
        p.locator('#neurons button[data-rank="pushing"]').click()
        expect(p.locator('#neurons button[data-rank="pushing"]')).to_have_attribute("aria-pressed", "true")
        pushing = p.locator('#neurons button[data-rank="pushing"]')
        expect(pushing).to_be_enabled()
        pushing.hover()  # pressed and under the pointer: white on the accent, readable
        assert pushing.evaluate("b => getComputedStyle(b).color") == "rgb(255, 255, 255)"
        SHOTS.joinpath(f"neurons-{width}.png").write_bytes(p.locator("#neurons .neuron-ranking").screenshot())
        # A corrected sentence: mean ablation is not said to be the gentler test.
        expect(p.locator("#ablate")).to_contain_text("Neither is always the gentler test")
        expect(p.locator("#ablate")).not_to_contain_text("keeps what it always says")
        # An ablation that fails says so by its button: a part the model lacks, sent through the page's own code.
        p.evaluate("async p => { const m = await import('/static/ablate.js'); await m.switchOff(p, ['attn 9.0']); }",
                   position)
        expect(p.locator("#ablate .local-error")).to_contain_text("not in this model")
        expect(p.locator("#error")).to_be_empty()
        if phone:
            SHOTS.joinpath("ablate-400.png").write_bytes(p.locator("#ablate").screenshot())
        assert api_get(p, f"/api/texts/{text_id(p)}")["steps"][str(position)]["candidates"][0]["p_all"] == p_all[0]
    finally:
        assert not w.errors, f"the page raised: {w.errors}"
        ctx.close()
