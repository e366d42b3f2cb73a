"""The insight notebook in the playground, in a real browser (Debian's Chromium through
Playwright), on the demo model with a notebook in a temporary directory: save an insight
from a token with a hostile title and find its commit and file with git; the notebook
panel lists it as text; Replay says the scores match; Reopen puts the text back at that
token; a head, a lens layer, an analogy, the attribution and a switch-off save their data,
replay re-checks it, and Reopen brings back the view it was saved from; a push with no
remote says why; a 400 px phone.

Screenshots go to artifacts/ at the repository root."""

from __future__ import annotations

import json
import re
import subprocess

import httpx
import numpy as np
import pytest
import yaml
from playwright.sync_api import expect

from puffergpt import notebook as nb
from puffergpt.model.reference import NumpyWeights
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.notebook import Notebook
from puffergpt.search.manifest import open_engine
from puffergpt.server import create_app
from puffergpt.server.app import serving
from test_playground import ARTIFACTS, TIMEOUT_MS, Watched, browser, generate, generated, open_page, shot  # noqa: F401  (browser: a fixture)

# ../ to climb out of the notebook, HTML that would run if parsed, emoji, quotes, YAML's own syntax.
HOSTILE = '../../../etc/passwd <img src=x onerror="alert(1)"> <b>bold</b> 🦀✨ ..\\..\\x: "q" #tag'
BODY = "Greedy decoding <script>alert(2)</script> always takes the best candidate.\nSecond line 🧠."


@pytest.fixture(scope="module")
def served(loaded, demo, tmp_path_factory):
    """(url, notebook dir, demo): the app over the demo model with a notebook in tmp."""
    store, key = loaded(demo)
    book = tmp_path_factory.mktemp("notebook")
    app = create_app(open_engine(store, demo.name, key), reference=lambda: Run(NumpyWeights(demo)), notebook=Notebook(book))
    with serving(app) as url:
        yield url, book, demo


@pytest.fixture
def page(browser, served):
    ctx, w = open_page(browser, served[0])
    yield w
    assert not w.errors, f"the page raised: {w.errors}"
    assert not w.dialogs, f"the page opened dialogs (script ran?): {w.dialogs}"
    ctx.close()


def git(path, *args) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout


def text_of(url, page):
    text_id = page.locator("#tokens").get_attribute("data-text-id")
    return httpx.get(f"{url}/api/texts/{text_id}").json()


def save_from_token(p, title, body="", tags=""):
    """Select the second generated token and save it; returns (path, commit) the page shows."""
    generated(p).nth(1).click()
    p.click("#candidates .save-insight")
    expect(p.locator("#insight-dialog")).to_be_visible()
    p.fill("#insight-title", title)
    p.fill("#insight-body", body)
    p.fill("#insight-tags", tags)
    p.click("#insight-save")
    expect(p.locator("#insight-result .insight-path")).to_be_visible()
    return p.locator("#insight-result .insight-path").inner_text(), p.locator(
        "#insight-result .insight-commit"
    ).inner_text()


def numpy_top(demo, ids, position, k):
    """The reference: numpy GPT-2's top-k for the token at position, through the same application path."""
    return nb.candidates_from_runs(lambda: Run(NumpyWeights(demo)))(ids, position, k, Sampling(), [])


def test_save_a_hostile_title_from_a_token_find_it_in_git_list_and_replay(page, served):
    url, book, demo = served
    p = page.page
    generate(p, "The list", n=4)
    expect(generated(p)).to_have_count(4)
    text = text_of(url, p)
    position = int(generated(p).nth(1).get_attribute("data-position"))
    generated(p).nth(1).click()
    p.click("#candidates .save-insight")
    # The evidence is shown before saving, readably: its kind, position, token and sampling.
    shown = p.locator("#insight-evidence")
    expect(shown).to_contain_text("kind: token")
    expect(shown).to_contain_text(f"position {position}: token {text['tokens'][position]['token_id']}")
    expect(shown).to_contain_text("temperature 0, top-k 40, seed none")
    p.click("#insight-cancel")

    before = git(book, "log", "--format=%H").split() if (book / ".git" / "refs" / "heads" / "main").exists() else []
    files_before = {f for f in book.rglob("*.md") if ".git" not in f.parts}
    path, commit = save_from_token(p, HOSTILE, BODY, "greedy kv")
    insight_id = path.split("/")[1][:-3]
    shot(p, "notebook-saved")
    # The file name is a safe slug inside insights/; the commit is the notebook's only one, holding that file.
    assert re.fullmatch(r"insights/\d{4}-\d\d-\d\d-\d{6}-[a-z0-9-]+-[0-9a-f]{6}\.md", path), path
    assert ".." not in path and "<" not in path
    log = git(book, "log", "--format=%H %s").splitlines()
    assert len(log) == len(before) + 1 and log[0].startswith(commit) and log[0].endswith(HOSTILE), log
    assert git(book, "show", "--name-only", "--format=", "HEAD").split() == [path]
    content = git(book, "show", f"HEAD:{path}")
    assert content == (book / path).read_text(encoding="utf-8")
    front = yaml.safe_load(content.split("---\n")[1])
    assert front["title"] == HOSTILE and front["kind"] == "token" and front["tags"] == ["greedy", "kv"]
    assert HOSTILE in content and BODY in content  # as written, emoji and all
    assert {f for f in book.rglob("*.md") if ".git" not in f.parts} - files_before == {book / path}

    # The evidence, exactly the shape check_evidence wants, is the text the server holds...
    ev = json.loads(content.split("```json\n")[1].split("\n```")[0])
    assert ev == nb.check_evidence(ev)
    ids = [t["token_id"] for t in text["tokens"]][: text["length"]]
    assert ev["prompt_ids"] == ids and ev["position"] == position and ev["token_id"] == ids[position]
    step = text["steps"][str(position)]
    assert ev["candidates"] == [{"token_id": c["token_id"], "logit": c["logit"]} for c in step["candidates"]]
    assert ev["sampling"] == {"temperature": 0.0, "top_k": 40, "seed": None} and ev["model"] == "demo"
    assert len(ev["requests"]) == step["requests"] > 0
    # ... and numpy's GPT-2 gives the same candidates.
    ref_ids, ref_logits = numpy_top(demo, ids, position, len(ev["candidates"]))
    assert ref_ids == [c["token_id"] for c in ev["candidates"]]
    diff = float(np.max(np.abs(np.array(ref_logits) - [c["logit"] for c in ev["candidates"]])))
    assert diff < 1e-3, f"the saved logits differ from numpy's by {diff}"
    p.click("#insight-cancel")

    # The panel lists it; the title is text, no element made from it.
    item = p.locator(f'#nb-list .nb-item[data-id="{insight_id}"]')
    expect(item).to_have_count(1)
    expect(item.locator(".nb-title")).to_have_text(HOSTILE)
    assert item.locator(".nb-title").evaluate("e => e.childElementCount") == 0
    item.locator(".nb-open").click()
    detail = p.locator("#nb-detail")
    expect(detail.locator(".nb-detail-title")).to_have_text(HOSTILE)
    expect(detail.locator(".nb-body")).to_have_text(BODY)
    expect(detail.locator(".nb-evidence")).to_contain_text("The list")  # decoded by the server
    for sel in ("#nb-list", "#nb-detail"):
        assert p.locator(f"{sel} img, {sel} b, {sel} script").count() == 0
    assert "<img" not in p.locator("#nb-list").inner_html() and "&lt;img" in p.locator("#nb-list").inner_html()

    # Replay in the page: the server recomputes the scores; they match what the API says.
    detail.locator(".nb-replay").click()
    verdict = detail.locator(".nb-verdict")
    expect(verdict).to_have_attribute("data-matches", "true")
    expect(verdict).to_contain_text("The scores still match")
    expect(verdict).to_contain_text("same ids: yes")
    api = httpx.post(f"{url}/api/insights/{insight_id}/replay").json()
    assert api["matches"] and api["same_ids"] and api["max_abs_diff"] <= nb.TOLERANCE
    shot(p, "notebook-replayed")

    # Search by words and by tag.
    p.fill("#nb-q", "no such words anywhere")
    p.click("#nb-find")
    expect(p.locator("#nb-list")).to_contain_text("No insight matches")
    p.fill("#nb-q", "GREEDY DECODING")
    p.fill("#nb-tag", "kv")
    p.click("#nb-find")
    expect(item).to_have_count(1)
    p.fill("#nb-q", "")
    p.fill("#nb-tag", "attention")
    p.click("#nb-find")
    expect(p.locator("#nb-list")).to_contain_text("No insight matches")

    # Reopen: a new text of prompt_ids[:position], then the token itself, with the same sampling.
    p.fill("#nb-tag", "")
    p.click("#nb-find")
    item.locator(".nb-open").click()
    old_id = p.locator("#tokens").get_attribute("data-text-id")
    detail.locator(".nb-reopen").click()
    expect(detail.locator(".nb-reopened").last).to_contain_text(f"Back at position {position}")
    expect(detail.locator(".nb-reopened").first).to_contain_text("the recorded token ids")
    expect(detail.locator(".nb-reopened").last).to_contain_text("have the same ids")
    reopened = text_of(url, p)
    assert reopened["id"] != old_id
    assert [t["token_id"] for t in reopened["tokens"]][: reopened["length"]] == ids[: position + 1]
    assert [c["logit"] for c in reopened["steps"][str(position)]["candidates"]] == pytest.approx(
        [c["logit"] for c in ev["candidates"]], abs=nb.TOLERANCE)
    expect(p.locator(f'#tokens .token.selected[data-position="{position}"]')).to_have_count(1)
    shot(p, "notebook-reopened")


def test_a_head_a_lens_layer_and_an_analogy_save_their_data(page, served):
    url, book, _ = served
    p = page.page
    generate(p, "The built-in types are int, float,", n=3)
    generated(p).nth(0).click()
    position = int(generated(p).nth(0).get_attribute("data-position"))
    p.click("#look-inside")
    p.locator('#attention .attn-cell[data-layer="1"][data-head="0"]').click()
    view = httpx.get(
        f"{url}/api/texts/{p.locator('#tokens').get_attribute('data-text-id')}/steps/{position}/inspect"
    ).json()
    saved = {}

    def save(button, title):
        p.click(button)
        p.fill("#insight-title", title)
        p.click("#insight-save")
        expect(p.locator("#insight-result .insight-path")).to_be_visible()
        saved[title] = p.locator("#insight-result .insight-path").inner_text().split("/")[1][:-3]
        p.click("#insight-cancel")

    save("#attention .attn-head .save-insight", "A head")
    p.select_option("#lens .lens-layer", "1")
    save("#lens .save-insight", "A lens layer")
    p.click("#an-go")
    expect(p.locator("#analogy-result tbody tr").first).to_be_visible()
    save("#analogy-result .save-insight", "An analogy")
    got = {t: httpx.get(f"{url}/api/insights/{i}").json()["evidence"] for t, i in saved.items()}
    head = got["A head"]
    assert (
        head["kind"] == "attention"
        and head["position"] == position
        and head["data"]["layer"] == 1
        and head["data"]["head"] == 0
    )
    assert head["data"]["weights"] == pytest.approx(view["attention"][1][0], abs=1e-6)
    lens = got["A lens layer"]
    assert lens["kind"] == "lens" and lens["data"]["ids"] == [t["token_id"] for t in view["lens"][1]["top"]]
    assert lens["data"]["logits"] == pytest.approx([t["logit"] for t in view["lens"][1]["top"]], abs=1e-6)
    terms = [p.input_value(f"#an-{x}") for x in "abc"]
    analogy = httpx.post(
        f"{url}/api/analogy", json={"a": terms[0], "b": terms[1], "c": terms[2], "k": int(p.input_value("#an-k"))}
    ).json()
    an = got["An analogy"]
    assert an["kind"] == "analogy" and an["data"]["terms"] == terms
    assert an["data"]["ids"] == [r["token_id"] for r in analogy["results"]]
    assert an["data"]["scores"] == pytest.approx([r["score"] for r in analogy["results"]], abs=1e-9)
    # What each part adds, with its versus, and a rerun with a head off: saved as shown.
    save("#attribution .save-insight", "The parts")
    p.locator('#ablate .ablate-part[data-part="attn 1.0"]').click()
    p.click("#ablate .ablate-run")
    expect(p.locator("#ablate .ablate-result")).to_be_visible()
    save("#ablate .ablate-result .save-insight", "A head off")
    for t in ("The parts", "A head off"):
        got[t] = httpx.get(f"{url}/api/insights/{saved[t]}").json()["evidence"]
    parts = got["The parts"]["data"]
    assert got["The parts"]["kind"] == "attribution" and parts["token_id"] == view["attribution"]["token_id"]
    assert [x["value"] for x in parts["parts"]] == pytest.approx([x["value"] for x in view["attribution"]["parts"]], abs=1e-9)
    assert parts["versus"]["token_id"] == view["attribution"]["versus"]["token_id"]
    off = got["A head off"]["data"]
    assert got["A head off"]["kind"] == "ablation" and off["parts"] == ["attn 1.0"] and len(off["after"]) == 10
    for t, i in saved.items():  # each replays: the candidates are the token's, and its data is re-checked
        r = httpx.post(f"{url}/api/insights/{i}/replay").json()
        assert r["matches"] and r["data"]["matches"] and r["data"]["checked"] > 0, (t, r)
    shot(p, "notebook-kinds")

    # Reopen the head's insight: the same view comes back, Look inside at that token, the head opened.
    p.click("#nb-find")
    p.locator(f'#nb-list .nb-item[data-id="{saved["A head"]}"] .nb-open').click()
    detail = p.locator("#nb-detail")
    detail.locator(".nb-replay").click()
    expect(detail.locator(".nb-data-verdict")).to_contain_text(f"{position} items recomputed")
    detail.locator(".nb-reopen").click()
    expect(detail.locator(".nb-reopened").last).to_contain_text(f"Look inside at position {position}, layer 1 head 0 opened")
    expect(p.locator(f'#tokens .token.selected[data-position="{position}"]')).to_have_count(1)
    expect(p.locator('#attention .attn-head[data-layer="1"][data-head="0"]')).to_be_visible()
    expect(p.locator('#attention .attn-cell.open[data-layer="1"][data-head="0"]')).to_have_count(1)
    shot(p, "notebook-reopened-head")
    # ... and the switch-off's: the same parts off, run again, the same candidates after.
    p.locator(f'#nb-list .nb-item[data-id="{saved["A head off"]}"] .nb-open').click()
    detail.locator(".nb-reopen").click()
    expect(detail.locator(".nb-reopened").last).to_contain_text("run again with attn 1.0 off")
    expect(p.locator('#ablate .ablate-part.off[data-part="attn 1.0"]')).to_have_count(1)
    after = p.locator("#ablate .ablate-list.after li")
    expect(after).to_have_count(10)
    assert [int(x) for x in after.evaluate_all("els => els.map((e) => e.dataset.tokenId)")] == [
        c["token_id"] for c in off["after"]]
    shot(p, "notebook-reopened-ablation")


def test_no_selection_says_what_to_do_and_a_push_without_remote_says_why(page):
    p = page.page
    p.click("#an-go")
    p.locator("#analogy-result .save-insight").click()
    expect(p.locator("#analogy-result .save-msg")).to_contain_text("select a generated token first")
    expect(p.locator("#insight-dialog")).to_be_hidden()
    p.click("#nb-push")
    expect(p.locator("#nb-push-result .emb-error")).to_contain_text("The push failed")
    expect(p.locator("#nb-push-result .emb-error")).to_contain_text("has no remote")


def test_the_notebook_on_a_400px_phone(browser, served):
    ctx, w = open_page(browser, served[0], width=400, height=860, is_mobile=True, device_scale_factor=1)
    p = w.page
    generate(p, "The list", n=3)
    save_from_token(p, HOSTILE + " " + "long" * 20, BODY)

    def too_wide():
        return p.evaluate("""() => { const vw = document.documentElement.clientWidth;
          return [...document.querySelectorAll('body *')].filter(e => e.getClientRects().length
            && (e.getBoundingClientRect().right > vw + 0.5 || e.getBoundingClientRect().left < -0.5))
            .map(e => `${e.tagName.toLowerCase()}#${e.id}.${e.getAttribute('class')} ${e.getBoundingClientRect().right}`); }""")

    assert too_wide() == []  # the open form
    p.screenshot(path=str(ARTIFACTS / "notebook-phone-form.png"))  # the viewport: the form is modal, centred in it
    p.click("#insight-cancel")
    p.locator("#nb-list .nb-open").first.click()
    expect(p.locator("#nb-detail .nb-evidence")).to_contain_text("The list")
    p.locator("#nb-detail .nb-replay").click()
    expect(p.locator("#nb-detail .nb-verdict")).to_have_attribute("data-matches", "true")
    p.locator("#nb-detail").scroll_into_view_if_needed()
    assert too_wide() == []
    assert p.evaluate("() => document.documentElement.scrollWidth") <= 400
    shot(p, "notebook-phone")
    assert not w.errors and not w.dialogs, (w.errors, w.dialogs)
    ctx.close()


def test_a_sampled_token_reopens_as_recorded_and_its_evidence_reads_at_once(browser, page, served):
    """Issue 20: Reopen with the same seed drew another token ("Sampling chose token 262
    this time"): the server draws a generation's tokens in turn from one seeded stream, so
    the third token of a seeded generation is its third draw. The page records where the
    generation began; Reopen runs it again from there and gets the recorded tokens. And an
    opened insight shows words at once, not token ids while /v1 decodes them."""
    url, _, _ = served
    p = page.page
    p.fill("#seed", "5")
    generate(p, "The list", n=4, temperature="1")
    text = text_of(url, p)
    ids = [t["token_id"] for t in text["tokens"]][: text["length"]]
    start = int(generated(p).nth(0).get_attribute("data-position"))
    tok = generated(p).nth(2)
    position = int(tok.get_attribute("data-position"))
    tok.click()
    p.click("#candidates .save-insight")
    expect(p.locator("#insight-evidence")).to_contain_text(f"began at position {start} with seed 5")
    p.fill("#insight-title", "A sampled token")
    p.click("#insight-save")
    expect(p.locator("#insight-result .insight-path")).to_be_visible()
    insight_id = p.locator("#insight-result .insight-path").inner_text().split("/")[1][:-3]
    p.click("#insight-cancel")
    ev = httpx.get(f"{url}/api/insights/{insight_id}").json()["evidence"]
    assert ev["data"]["generation"] == {"start": start} and ev["sampling"]["seed"] == 5

    # A fresh page knows none of these tokens: the words still come within a moment.
    ctx, w = open_page(browser, url)
    fresh = w.page
    fresh.locator(f'#nb-list .nb-item[data-id="{insight_id}"] .nb-open').click()
    evidence = fresh.locator("#nb-detail .nb-evidence")
    expect(evidence).to_contain_text(json.dumps(text_of_ids(url, ids[:position])), timeout=2_000)
    expect(evidence).not_to_contain_text("token ids")

    fresh.locator("#nb-detail .nb-reopen").click()
    said = fresh.locator("#nb-detail .nb-reopened")
    expect(said.last).to_contain_text(f"Back at position {position}")
    expect(said.nth(1)).to_contain_text(
        f"Generated again from position {start} with seed 5: the same {position - start + 1} tokens as recorded"
    )
    assert (
        "Sampling chose" not in fresh.locator("#nb-detail").inner_text()
        and "put back" not in fresh.locator("#nb-detail").inner_text()
    )
    reopened = text_of(url, fresh)
    assert [t["token_id"] for t in reopened["tokens"]][: reopened["length"]] == ids[: position + 1]
    assert not w.errors, w.errors
    ctx.close()


def text_of_ids(url, ids):
    """The text of token ids, through the server's own tokenizer (a text opened from them, closed)."""
    t = httpx.post(f"{url}/api/texts", json={"prompt_ids": ids}).json()
    httpx.delete(f"{url}/api/texts/{t['id']}")
    return "".join(x["text"] for x in t["tokens"])


def test_an_insight_from_a_conversation_shows_no_evidence_and_no_replay(page, served):
    url, book, _ = served
    saved = {"title": "From a chat <b>x</b>", "body": "Words only.", "tags": ["chat"]}  # no evidence
    r = httpx.post(f"{url}/api/insights", json=saved)
    assert r.status_code == 201, r.text
    p = page.page
    p.fill("#nb-tag", "chat")
    p.click("#nb-find")
    item = p.locator(f'#nb-list .nb-item[data-id="{r.json()["id"]}"]')
    expect(item.locator(".nb-meta")).to_contain_text("conversation · no evidence")
    item.locator(".nb-open").click()
    detail = p.locator("#nb-detail")
    expect(detail.locator(".nb-detail-title")).to_have_text("From a chat <b>x</b>")
    expect(detail.locator(".nb-body")).to_have_text("Words only.")
    expect(detail.locator(".nb-no-evidence")).to_have_text("no evidence (saved from a conversation): nothing to replay")
    expect(detail.locator(".nb-replay")).to_have_count(0)


def test_a_token_generated_with_a_penalty_and_a_bias_saves_reopens_and_replays_after_them(browser, page, served):
    """The controls (issue 44) on a token an insight is saved from: the evidence records them and the
    positions the model generated (format 4), replay matches after them, Reopen at this token gives the
    same candidates; and the text itself, reopened on a server that lost it, shows the same candidates."""
    url, book, demo = served
    p = page.page
    p.locator("#penalties").evaluate("d => { d.open = true; }")
    p.fill("#frequency-penalty", "0.8")
    p.fill("#logit-bias", "13=2, 198=-3")  # 198 ("\n") is among the best candidates there
    generate(p, "Perl was created by Larry Wall in", n=4)
    expect(generated(p)).to_have_count(4)
    text = text_of(url, p)
    first = int(generated(p).nth(0).get_attribute("data-position"))
    position = int(generated(p).nth(1).get_attribute("data-position"))
    generated(p).nth(1).click()
    p.click("#candidates .save-insight")
    expect(p.locator("#insight-evidence")).to_contain_text('controls: frequency_penalty 0.8, logit_bias {"13":2,"198":-3}')
    p.click("#insight-cancel")
    path, _ = save_from_token(p, "A penalty and a bias")
    p.click("#insight-cancel")
    content = (book / path).read_text(encoding="utf-8")
    assert content.startswith("---\nversion: 4\n") and "### Evidence data (format 4)" in content
    ev = json.loads(content.split("```json\n")[1].split("\n```")[0])
    assert ev["sampling"] == {"temperature": 0.0, "top_k": 40, "seed": None, "frequency_penalty": 0.8,
                              "logit_bias": {"13": 2.0, "198": -3.0}}
    assert ev["position"] == position and ev["generated"] == [first]
    step = text["steps"][str(position)]
    assert ev["candidates"] == [{"token_id": c["token_id"], "logit": c["logit"]} for c in step["candidates"]]
    ids = ev["prompt_ids"]
    assert numpy_top(demo, ids, position, 40)[0] != [c["token_id"] for c in ev["candidates"]]  # the controls matter
    insight_id = path.split("/")[1][:-3]
    api = httpx.post(f"{url}/api/insights/{insight_id}/replay").json()
    assert api["matches"] and api["controls"] == {"frequency_penalty": 0.8, "logit_bias": {"13": 2.0, "198": -3.0}}

    # The text's server loses it: the page reopens it with each step's controls, and the candidates are the same.
    old_id = text["id"]
    httpx.delete(f"{url}/api/texts/{old_id}")
    generated(p).nth(2).click()  # its probabilities over every token: the server answers text_not_found
    expect(p.locator("#notice")).to_contain_text("reopened", timeout=TIMEOUT_MS)
    expect(p.locator("#tokens")).to_have_attribute("data-text-id", re.compile(rf"^(?!{old_id})[0-9a-f]{{12}}$"))
    again = text_of(url, p)
    assert again["id"] != old_id
    for q, s in text["steps"].items():
        got = again["steps"][q]
        assert got["phase"] == "reopened" and got["controls"] == s["controls"]
        assert [c["token_id"] for c in got["candidates"][:40]] == [c["token_id"] for c in s["candidates"][:40]]

    # Reopen at this token, on a fresh page: the candidates are the recorded ones, after the same controls.
    ctx, w = open_page(browser, url)
    fresh = w.page
    fresh.locator(f'#nb-list .nb-item[data-id="{insight_id}"] .nb-open').click()
    fresh.locator("#nb-detail .nb-reopen").click()
    said = fresh.locator("#nb-detail .nb-reopened")
    expect(said.last).to_contain_text(f"Back at position {position}")
    expect(said.last).to_contain_text("have the same ids")
    reopened = text_of(url, fresh)
    assert [c["token_id"] for c in reopened["steps"][str(position)]["candidates"]] == \
        [c["token_id"] for c in ev["candidates"]]
    assert fresh.locator("#frequency-penalty").input_value() == "0.8"
    assert not w.errors, w.errors
    ctx.close()
