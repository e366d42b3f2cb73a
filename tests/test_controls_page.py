"""The sampling's controls on the page (issue 44), in a real browser (Debian's Chromium): the demo's
"Break a loop with a penalty" starter sets temperature 0 and a frequency penalty, and a token's
candidates show each one's logit before and after, and which control moved it by how much; the
numbers are the server's and numpy's after the same rule."""

from __future__ import annotations

import numpy as np
from playwright.sync_api import expect

from puffergpt.model import sampling, tokenizer
from puffergpt.model.info import starters
from puffergpt.model.reference import Cache, NumpyWeights, forward
from puffergpt.model.sampling import Sampling
from test_playground import browser, generated, open_page, server, wait_idle  # noqa: F401

LOOP = next(s for s in starters("demo") if s.get("sampling"))


def test_a_penalty_starter_shows_the_candidates_before_and_after(browser, server, demo):  # noqa: F811
    ctx, w = open_page(browser, server)
    p = w.page
    p.fill("#max-tokens", "16")
    p.locator("#starters .starter", has_text=LOOP["kind"]).click()
    wait_idle(p)
    expect(p.locator("#penalties")).to_have_attribute("open", "")
    assert p.locator("#frequency-penalty").input_value() == "0.8"
    expect(p.locator("#temperature-value")).to_have_text("0.00")
    tokens = generated(p)
    expect(tokens).to_have_count(16)
    ids = [int(x) for x in p.locator("#tokens .token").evaluate_all("ts => ts.map(t => t.dataset.tokenId)")]
    prompt = tokenizer.encode(LOOP["prompt"])
    assert ids[: len(prompt)] == prompt
    # the last token: the candidates after the penalty are numpy's whole vocabulary after the same rule
    last = len(ids) - 1
    tokens.last.click()
    table = p.locator("#candidates .cand-table")
    expect(table.locator("thead")).to_contain_text("before")
    expect(table.locator("thead")).to_contain_text("moved by")
    expect(p.locator("#candidates .cand-controls")).to_contain_text("Penalties and bias")
    rows = table.locator("tbody tr")
    shown = [int(x) for x in rows.evaluate_all("rs => rs.map(r => r.dataset.tokenId)")]
    weights = NumpyWeights(demo)
    raw = weights.logits(forward(weights, np.asarray(ids[:last]), 0, Cache())[-1])
    s = Sampling(0.0, 40, frequency_penalty=0.8)
    after, moved = sampling.controls(s, np.arange(len(raw)), raw, ids[:last], ids[len(prompt): last])
    assert shown == list(np.argsort(-after, kind="stable")[: len(shown)])
    assert ids[last] == int(np.argmax(after))
    pushed = [i for i, t in enumerate(shown) if moved[t]]
    assert pushed, "no candidate was moved: the penalty did nothing here"
    for i in pushed:  # before, after, and the control with its size
        cells = rows.nth(i).locator("td")
        t = shown[i]
        assert float(rows.nth(i).locator("td.before").inner_text()) == round(float(raw[t]), 4)
        assert float(rows.nth(i).locator("td.logit").inner_text()) == round(float(after[t]), 4)
        assert rows.nth(i).locator("td.moved").inner_text().startswith("frequency −")
        assert cells.count() > 4
    unmoved = next(i for i, t in enumerate(shown) if not moved[t])
    assert rows.nth(unmoved).locator("td.moved").inner_text() == ""
    # without the penalty the same prompt loops: the text differs
    greedy = NumpyWeights(demo)
    out = list(prompt)
    for _ in range(16):
        out.append(int(np.argmax(greedy.logits(forward(greedy, np.asarray(out), 0, Cache())[-1]))))
    assert out != ids, "the penalty changed nothing"
    p.screenshot(path="/tmp/shots/controls-candidates.png", full_page=True)
    assert not w.errors, w.errors
    ctx.close()
