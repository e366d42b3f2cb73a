"""Context changes meaning on the page (issue 41), in a real browser (Debian's Chromium through
Playwright) on the demo model, at 1,400 and 400 px: the demo's own starter with its control
line (the baseline) beside the pair of two senses, the route's numbers in the chart, the table
and the words; a rare word (" mole", GPT-2's starter) marked as the neighbours view marks it;
no label under 10 px, no chart label over another, nothing wider than a phone. And the phone
items around it: the map's step numbers apart, the attention grid's percentages kept, the
text's shade saying what it is. Screenshots go to /tmp/shots/ (contexts-*.png)."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import Page, expect

from puffergpt.model import info as model_info
from puffergpt.model import token_counts, tokenizer
from test_playground import (  # noqa: F401  (browser, server: fixtures)
    browser,
    generate,
    generated,
    open_page,
    server,
    wait_idle,
)
from test_views_page import shot

MIN_PX = 10  # no text on the card smaller than this, in CSS pixels as shown

# Every shown element with text of its own: its font size as shown (an SVG text scaled by its
# viewBox), the ones under MIN_PX; the elements past the screen's right edge; the chart's texts
# that cover another (by more than half a pixel each way).
LAYOUT = """([sel, min]) => {
  const card = document.querySelector(sel), vw = document.documentElement.clientWidth;
  const shown = (e) => e.getClientRects().length > 0 && getComputedStyle(e).visibility !== 'hidden';
  const scale = (e) => { const s = e.ownerSVGElement; if (!s) return 1; const vb = s.viewBox.baseVal;
    return vb && vb.width ? s.getBoundingClientRect().width / vb.width : 1; };
  const name = (e) => `${e.tagName.toLowerCase()}.${e.getAttribute('class')} "${e.textContent.trim().slice(0, 24)}"`;
  const all = [...card.querySelectorAll('*')].filter(shown);
  const small = all.filter((e) => [...e.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim()))
    .map((e) => [name(e), parseFloat(getComputedStyle(e).fontSize) * scale(e)]).filter(([, px]) => px < min - 0.01);
  const wide = all.filter((e) => e.getBoundingClientRect().right > vw + 0.5).map(name);
  const boxes = [...card.querySelectorAll('svg text')].filter(shown)
    .map((t) => [t.textContent, t.getBoundingClientRect()]);
  const meet = (p, q) => p.left < q.right - 0.5 && q.left < p.right - 0.5
    && p.top < q.bottom - 0.5 && q.top < p.bottom - 0.5;
  const over = [];
  boxes.forEach(([a, p], i) => boxes.slice(i + 1).forEach(([b, q]) => { if (meet(p, q)) over.push(`${a} / ${b}`); }));
  return { small, wide, over };
}"""


def layout(p: Page, sel: str) -> dict:
    return p.evaluate(LAYOUT, [sel, MIN_PX])


def pct(x: float) -> str:
    """format.js's pct."""
    if x >= 0.9995:
        return "100%"
    if x >= 0.1:
        return f"{x * 100:.1f}%"
    if x >= 0.0001:
        return f"{x * 100:.2f}%"
    return "<0.01%" if x > 0 else "0%"


def open_width(browser, server, width: int):
    kw = {"height": 860, "is_mobile": True, "has_touch": True, "device_scale_factor": 1} if width == 400 else {}
    return open_page(browser, server, width=width, **kw)


@pytest.mark.parametrize("width", [1400, 400])
def test_the_contexts_view_reads_two_senses_against_a_control_and_marks_a_rare_word(browser, server, width):
    """The demo's first starter (its words seen often in training) with its control: the contexts
    and the control marked where the route found the word, each pair's and the control's cosine at
    each layer as the route says (the table, the chart's points), the control drawn and named the
    baseline, the route's reading in words, each lens top-1, each head's most attended token with
    its weight; then GPT-2's " mole" sentences typed in: " mole" marked rare with its count, the
    note of why the lens rows are filler. At both widths no text under 10 px and no chart label
    over another; at 400 px nothing wider than the screen."""
    phone = width == 400
    ctx, w = open_width(browser, server, width)
    p = w.page
    press = (lambda el: el.tap()) if phone else (lambda el: el.click())
    if phone:  # first: a tapped starter brings the text into view
        press(p.locator("#starters .starter").first)
        p.wait_for_function("() => { const r = document.querySelector('#tokens').closest('section')"
                            ".getBoundingClientRect(); return r.top >= -1 && r.top < window.innerHeight * 0.6; }")
        expect(generated(p).first).to_be_in_viewport()
        wait_idle(p)
    starter = httpx.get(server + "/api/info").json()["context_starters"][0]
    assert starter == model_info.context_starters("demo")[0]
    with p.expect_response(lambda r: r.url.endswith("/api/contexts")) as got:
        press(p.locator("#ctx-starters .starter").first)
    assert got.value.ok, got.value.text()
    assert got.value.request.post_data_json["control"] == starter["control"]
    want = got.value.json()
    box = p.locator("#contexts-result")
    lines = box.locator(".ctx-context")
    expect(lines).to_have_count(len(starter["prompts"]))
    for i, prompt in enumerate(starter["prompts"]):
        expect(lines.nth(i).locator(".ctx-text")).to_have_text(prompt)
        expect(lines.nth(i).locator(".ctx-word")).to_have_text(starter["word"])
        assert int(lines.nth(i).locator(".ctx-word").get_attribute("data-position")) == want["positions"][i]
    control = box.locator(".ctx-control-context")
    expect(control.locator(".ctx-text")).to_have_text(starter["control"])
    expect(control.locator(".ctx-num")).to_have_text("C")
    assert int(control.locator(".ctx-word").get_attribute("data-position")) == want["control"]["position"]
    n, layers = len(starter["prompts"]), want["layers"]
    for cls, value in (("ctx-cos", lambda e, a, b: e["cosine"][a][b]), ("ctx-control", lambda e, a, b: e["control"])):
        cells = box.locator(f"td.{cls}")
        expect(cells).to_have_count((n * (n - 1) // 2 if cls == "ctx-cos" else 1) * len(layers))
        for layer, pair, text in cells.evaluate_all(
                "cs => cs.map(c => [Number(c.closest('tr').dataset.layer), c.dataset.pair, c.textContent])"):
            a, b = map(int, pair.split("-")) if pair != "control" else (0, n)
            assert text == f"{value(layers[layer], a, b):.4f}", (cls, layer, pair)
    # The chart: a line a pair and the control's, each point's title the route's cosine.
    expect(box.locator(".ctx-line")).to_have_count(n * (n - 1) // 2 + 1)
    points = box.locator(".ctx-control-line circle title").evaluate_all("ts => ts.map(t => t.textContent)")
    assert [float(re.search(r"cosine (\S+)$", t).group(1)) for t in points] == [
        round(e["control"], 4) for e in layers]
    expect(box.locator(".ctx-legend li[data-pair='control']")).to_contain_text("the baseline")
    L = len(layers) - 1
    expect(box.locator(".ctx-summary")).to_contain_text(
        f"The control (1·C, the same sense): {layers[0]['control']:.4f} at the embedding, "
        f"{layers[L]['control']:.4f} entering ln_f.")
    expect(box.locator(".ctx-reading li")).to_have_text(want["reading"])
    gap = layers[L]["control"] - layers[L]["cosine"][0][1]
    expect(box.locator(".ctx-reading li").nth(1)).to_contain_text(f"ends {gap:.4f} below the control")
    counts = token_counts.for_model("demo", 50257)
    expect(box.locator(".ctx-word-note")).to_contain_text(f"seen {counts.of(want['word_id']):,} times in training")
    expect(box.locator(".ctx-word-note .rare-mark")).to_have_count(0)
    tops = box.locator("td.ctx-lens").evaluate_all(
        "cs => cs.map(c => [Number(c.closest('tr').dataset.layer), Number(c.dataset.context),"
        " Number(c.querySelector('.lens-chip').dataset.tokenId)])")
    assert sorted((l, i) for l, i, _ in tops) == [(l, i) for l in range(len(layers)) for i in range(n)]
    assert all(t == layers[l]["lens"][i] for l, i, t in tops)
    cells = box.locator(".ctx-cell").evaluate_all(
        "cs => cs.map(c => { const r = c.closest('.ctx-attn-row'), v = [...c.querySelectorAll('.attn-pct span')]"
        ".find(s => s.getClientRects().length); return [Number(r.dataset.layer), Number(r.dataset.head),"
        " Number(c.dataset.context), Number(c.dataset.top), v ? v.textContent : null]; })")
    for l, hd, i, top, shown in cells:
        weights = want["attention"][i][l][hd]
        assert top == max(range(len(weights)), key=lambda j: (weights[j], -j)), (l, hd, i)
        assert shown == (f"{round(weights[top] * 100)}%" if phone else pct(weights[top])), (l, hd, i, shown)
    reads = [q["kind"] for q in want["requests"]].count("lens.top_k")
    assert reads == n + 1  # the contexts and the control, each read once
    expect(box.locator(".ctx-cost")).to_contain_text(
        f"{len(want['requests'])} requests, {len(want['requests']) // reads} for each of the {reads} prompts read")
    shot(p, f"contexts-{width}", p.locator("#contexts-card"))
    got_layout = layout(p, "#contexts-card")
    assert got_layout["small"] == [] and got_layout["over"] == [], got_layout
    if phone:
        assert got_layout["wide"] == [], got_layout

    # A rare word: GPT-2's mole sentences, typed in.
    word, prompts, ctl = (lambda s: (s["word"], s["prompts"], s["control"]))(model_info.context_starters("gpt2")[0])
    p.fill("#ctx-word", word)
    for i, prompt in enumerate(prompts, 1):
        p.fill(f"#ctx-p{i}", prompt)
    p.fill("#ctx-control", ctl)
    with p.expect_response(lambda r: r.url.endswith("/api/contexts")) as got:
        press(p.locator("#ctx-go"))
    mole = got.value.json()
    count = counts.of(tokenizer.encode(word)[0])
    assert count < token_counts.RARE_BELOW and mole["rarity"]["rare"] is True
    mark = box.locator(".ctx-word-note .rare-mark")
    expect(mark).to_have_text("rare")
    assert f"seen {count} times in training" in mark.get_attribute("title")
    expect(box.locator(".rare-note")).to_contain_text(f"{word!r} was seen {count} times in training")
    rare_chips = sum(t["rare"] for e in mole["layers"] for top in e["top"] for t in top)
    expect(box.locator("td.ctx-lens .lens-chip.rare")).to_have_count(rare_chips)
    assert mole["lens_note"], "the demo's lens rows at ' mole' are filler at every layer"
    expect(box.locator(".ctx-lens-note")).to_have_text(mole["lens_note"])
    expect(box.locator(".ctx-line")).to_have_count(len(prompts) * (len(prompts) - 1) // 2 + 1)
    shot(p, f"contexts-rare-{width}", p.locator("#contexts-card"))
    got_layout = layout(p, "#contexts-card")
    assert got_layout["small"] == [] and got_layout["over"] == [], got_layout
    if phone:
        assert got_layout["wide"] == [], got_layout
    assert not w.errors, f"the page raised: {w.errors}"
    ctx.close()


@pytest.mark.parametrize("width", [1400, 400])
def test_map_steps_attention_percentages_and_the_texts_shade(browser, server, width):
    """The map's step numbers never cover each other or a word's label, and every layer is
    numbered (alone, or in a group "a–b" where its points crowd); the attention grid keeps each
    strip's weight (whole percent on a phone), at 10 px or more; a generated token is shaded by
    the model's own probability over all tokens once its candidates are open, and says so."""
    phone = width == 400
    ctx, w = open_width(browser, server, width)
    p = w.page
    generate(p, "The for statement is used to", n=3)
    tok = generated(p).nth(1)
    assert tok.get_attribute("data-shade") == "sampler" and "shaded by the sampler's p" in tok.get_attribute("title")
    position = int(tok.get_attribute("data-position"))
    with p.expect_response(lambda r: r.url.endswith(f"/steps/{position}/probabilities")) as got:
        tok.tap() if phone else tok.click()
    chosen = int(tok.get_attribute("data-token-id"))
    p_all = next(c["p_all"] for c in got.value.json()["candidates"] if c["token_id"] == chosen)
    shaded = p.locator(f'#tokens .token[data-position="{position}"]')
    expect(shaded).to_have_attribute("data-shade", "p_all")
    assert f"the model's own p = {pct(p_all)} over all tokens at T = 1 (the shade)" in shaded.get_attribute("title")
    p.click("#look-inside")
    cells = p.locator("#inside .attn-cell")
    expect(cells.first).to_be_visible()
    shown = cells.evaluate_all("cs => cs.map(c => [...c.querySelectorAll('.attn-pct span')]"
                               ".filter(s => s.getClientRects().length).map(s => s.textContent))")
    assert all(len(s) == 1 and s[0].endswith("%") for s in shown), shown
    got_layout = layout(p, "#attention")
    assert got_layout["small"] == [], got_layout
    p.check("#map-path")
    p.click("#map-go")
    svg = p.locator("#map-result svg.map")
    expect(svg).to_be_visible()
    n_layer = int(httpx.get(server + "/api/info").json()["config"]["n_layer"])
    expect(svg.locator(".map-step")).to_have_count(n_layer + 1)
    labels = svg.locator(".map-step text").evaluate_all("ts => ts.map(t => t.textContent)")
    numbered = []
    for s in labels:
        a, _, b = s.partition("–")
        numbered += list(range(int(a), int(b or a) + 1))
    assert numbered == list(range(n_layer + 1)), labels
    got_layout = layout(p, "#map-result")
    assert got_layout["over"] == [] and got_layout["small"] == [], got_layout
    shot(p, f"contexts-map-{width}", p.locator("#map-result"))
    shot(p, f"contexts-attention-{width}", p.locator("#attention"))
    if phone:
        assert layout(p, "body")["wide"] == []
    wait_idle(p)
    assert not w.errors, f"the page raised: {w.errors}"
    ctx.close()
