"""A text any server can continue (issue 32, item 1): a server that does not hold a text says
so with the code ``text_not_found``, and any server reopens it from what the page kept (its
token ids, how many are the text, the positions the model generated): one prefill and one
top-k search. The reopened text continues as the original does and as numpy does, and its
branches, steps, inspections and candidates work as before.

"Another server" here is a second ``Texts`` (or app) over the same engine: what a server
holds of a text is its ``Texts``; the keys each one writes go to a namespace of its own."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from helpers import LOGIT_BOUNDS, assert_close, message
from puffergpt.lens import inspector
from puffergpt.model import tokenizer
from puffergpt.model.reference import NumpyWeights, Reference
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.texts.registry import Texts
from puffergpt.texts.text import Text, TextError, TextNotFound

PROMPT = "He said to me that she"
GREEDY = Sampling(0, 40)


@pytest.fixture(scope="module")
def engine(loaded, demo):
    store, key = loaded(demo)
    return open_engine(store, demo.name, key)


def page_state(t: Text) -> tuple[list[int], int, dict[int, Sampling]]:
    """What the page keeps of a text: every known token id, the text's length, and the
    generated positions with their temperatures and controls (a step's JSON "controls")."""
    return list(t.tokens), t.length, {p: s.controls.sampling if s.controls else Sampling(s.temperature)
                                      for p, s in t.steps.items() if p < len(t.tokens)}


def test_a_reopened_text_continues_as_the_original_and_as_numpy(engine, demo):
    a, b = Texts(engine.open), Texts(engine.open)  # two servers' texts
    t = a.create(tokenizer.encode(PROMPT))
    n0 = t.length
    list(t.generate(6, GREEDY))
    t.step_back(t.length - 2)  # two tokens stepped back from: the page keeps them, and so must a reopen
    ids, length, generated = page_state(t)
    r, requests = b.reopen(ids, length, generated)
    try:
        # One prefill of every known token, then one top-k search for the generated positions.
        assert r.tokens == ids and r.length == length and r.read_upto == len(ids)
        assert [w["phase"] for w in r.writes] == ["prefill"] and r.writes[0]["end"] == len(ids)
        kinds = [q.kind for q in requests]
        assert kinds.count("wte.top_k") == 1 and kinds.count("embed") == 1, kinds
        assert len(requests) == 2 + 6 * engine.config.n_layer  # a token's requests: the read, then the one top-k
        assert sorted(r.steps) == sorted(generated) == list(range(n0, n0 + 6))
        for p, step in r.steps.items():  # the candidates recomputed are the ones generated
            old = t.steps[p]
            assert list(step.ids[:40]) == list(old.ids[:40]) and step.token_id == old.token_id
            assert_close(f"candidates at {p}", step.logits[:40], old.logits[:40], LOGIT_BOUNDS["inner_product"])
        # Stepping forward costs nothing on either; both then continue alike, as numpy does.
        t.step_forward(len(t.tokens))
        r.step_forward(len(r.tokens))
        more_t = [s.token_id for s in t.generate(5, GREEDY)]
        more_r = [s.token_id for s in r.generate(5, GREEDY)]
        assert more_r == more_t
        solo = Reference(demo).greedy(tokenizer.encode(PROMPT), 11)
        assert r.tokens[n0:] == solo, (tokenizer.decode(r.tokens[n0:]), tokenizer.decode(solo))
    finally:
        a.close_all()
        b.close_all()


LOOP = "Perl was created by Larry Wall in"  # the demo loops here: the penalties move many candidates
CONTROLLED = Sampling(0, 40, presence_penalty=0.4, frequency_penalty=0.8, repetition_penalty=1.3,
                      logit_bias={13: 2.0, 262: -3.0})


def test_a_reopened_text_shows_the_candidates_its_controls_gave(engine, demo):
    """Each step's candidates after a reopen equal those before: the top 40 after the controls its
    generation had (penalties over the tokens read and generated, the bias), each one's logit before them
    and which controls moved it; and where the reopen is not given the controls, they would not."""
    a, b = Texts(engine.open), Texts(engine.open)
    t = a.create(tokenizer.encode(LOOP))
    n0 = t.length
    list(t.generate(4, GREEDY))
    list(t.generate(6, CONTROLLED))  # two generations: the penalties count the first's tokens too
    ids, length, generated = page_state(t)
    assert [p for p, s in generated.items() if s.controlled] == list(range(n0 + 4, n0 + 10))
    r, requests = b.reopen(ids, length, generated)
    bare, _ = b.reopen(ids, length, {p: Sampling(s.temperature) for p, s in generated.items()})
    try:
        assert [q.kind for q in requests].count("wte.top_k") == 1  # still one top-k search for them all
        moved = 0
        for p, old in t.steps.items():
            new = r.steps[p]
            assert new.phase == "reopened" and new.token_id == old.token_id
            assert list(new.ids[:40]) == list(old.ids[:40]), f"position {p}"
            assert_close(f"candidates at {p}", new.logits[:40], old.logits[:40], LOGIT_BOUNDS["inner_product"])
            assert (new.controls is None) == (old.controls is None)
            if old.controls is not None:
                assert list(new.controls.moved[:40]) == list(old.controls.moved[:40])
                assert_close(f"before the controls at {p}", new.controls.before[:40], old.controls.before[:40],
                             LOGIT_BOUNDS["inner_product"])
                moved += int(np.count_nonzero(old.controls.moved[:40]))
                assert list(bare.steps[p].ids[:40]) != list(old.ids[:40]), f"the controls change nothing at {p}"
        assert moved > 0  # the controls moved some of the candidates shown
        # The reopened text continues as the original does under the same controls.
        assert [s.token_id for s in r.generate(3, CONTROLLED)] == [s.token_id for s in t.generate(3, CONTROLLED)]
    finally:
        a.close_all()
        b.close_all()


def test_branching_stepping_and_inspecting_a_reopened_text(engine):
    a, b = Texts(engine.open), Texts(engine.open)
    t = a.create(tokenizer.encode(PROMPT))
    n0 = t.length
    list(t.generate(4, GREEDY))
    r, _ = b.reopen(*page_state(t))
    try:
        p = n0 + 1
        # The candidate of rank 3 at a position the new server did not generate: its recomputed step.
        want = int(t.steps[p].ids[3])
        r.branch(p, rank=3)
        assert r.tokens[p] == want and r.length == p + 1
        r.step_back(p)
        r.step_forward(p + 1)  # the branch's token, kept after the step back
        assert r.tokens[p] == want
        # The view from the token at p - 1 on the reopened text is the original's, recomputed.
        got, _, _ = inspector.inspect(r, p, 5)
        ref, _, _ = inspector.inspect(t, p, 5)
        assert_close("attention", got["weights"], ref["weights"], 1e-4)
        assert [list(e["ids"]) for e in got["lens"]] == [list(e["ids"]) for e in ref["lens"]]
    finally:
        a.close_all()
        b.close_all()


@pytest.mark.parametrize("ids, length, generated, match", [
    ([464, 2068], 0, {}, "length 0 is outside 1..2"),
    ([464, 2068], 3, {}, "length 3 is outside 1..2"),
    ([464, 2068], 2, {2: Sampling(0.0)}, "generated position 2 is outside 1..1"),
    ([464, 2068], 2, {0: Sampling(0.0)}, "generated position 0 is outside 1..1"),
    ([464, 2068], 2, {1: Sampling(-1.0)}, "temperature at position 1"),
    ([464, 2068], 2, {1: Sampling(0.0, frequency_penalty=3.0)}, "frequency_penalty must be a number in"),
    ([464, 2068], 2, {1: Sampling(0.0, logit_bias={99999: 1.0})}, "token id 99999 is outside the vocabulary"),
    ([464, 99999], 2, {}, "token id 99999 is outside the vocabulary"),
])
def test_a_bad_reopen_is_refused_and_leaves_no_text(engine, ids, length, generated, match):
    texts = Texts(engine.open)
    before = set(engine.store.namespaces("text-"))
    with pytest.raises(TextError, match=match):
        texts.reopen(ids, length, generated)
    assert len(texts) == 0 and set(engine.store.namespaces("text-")) == before  # closed, its keys dropped


def test_a_text_no_server_holds_is_not_found_and_named_so(engine):
    texts = Texts(engine.open)
    with pytest.raises(TextNotFound, match="no open text 'abc' on this server") as e:
        texts.get("abc")
    assert isinstance(e.value, KeyError) and "reopen it from its token ids" in str(e.value)


# --- over HTTP: the 404 every text route answers, and the reopen -------------------------

def events(text: str) -> list[tuple[str, dict]]:
    blocks = [dict(line.split(": ", 1) for line in b.split("\n")) for b in text.strip().split("\n\n")]
    return [(b["event"], json.loads(b["data"])) for b in blocks]


@pytest.fixture(scope="module")
def clients(engine):
    """Two apps (two servers) over one engine."""
    with TestClient(create_app(engine, ServerConfig(max_open_texts=4))) as a, \
            TestClient(create_app(engine, ServerConfig(max_open_texts=4))) as b:
        yield a, b


@pytest.mark.parametrize("method, path, body", [
    ("GET", "", None), ("DELETE", "", None), ("GET", "/kv", None), ("GET", "/steps/1/inspect", None),
    ("POST", "/generate", {"max_tokens": 1}), ("POST", "/stop", None), ("POST", "/step_back", {"position": 1}),
    ("POST", "/step_forward", {"position": 2}), ("POST", "/cut", {"position": 1}),
    ("POST", "/branch", {"position": 1, "token_id": 1}), ("POST", "/append", {"text": "x"}),
])
def test_every_text_route_says_text_not_found_on_a_server_without_the_text(clients, method, path, body):
    a, b = clients
    tid = a.post("/api/texts", json={"prompt": PROMPT}).json()["id"]
    try:
        r = b.request(method, f"/api/texts/{tid}{path}", json=body)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["code"] == "text_not_found" and f"no open text {tid!r}" in message(r)
    finally:
        a.delete(f"/api/texts/{tid}")


def test_the_map_of_a_text_the_server_does_not_hold_is_text_not_found(clients):
    r = clients[1].post("/api/map", json={"words": [" king", " queen"], "text_id": "0123456789ab", "position": 1})
    assert r.status_code == 404 and r.json()["error"]["code"] == "text_not_found"


def test_a_text_reopened_over_http_continues_as_the_original(clients, demo):
    a, b = clients
    t = a.post("/api/texts", json={"prompt": PROMPT}).json()
    n0 = t["length"]
    a.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 4, "temperature": 0})
    t = a.get(f"/api/texts/{t['id']}").json()
    ids = [x["token_id"] for x in t["tokens"]]
    generated = [{"position": int(p), "temperature": s["temperature"]} for p, s in t["steps"].items()]
    r = b.post("/api/texts", json={"prompt_ids": ids, "reopen": {"length": t["length"], "generated": generated}})
    assert r.status_code == 201, r.text
    got = r.json()
    try:
        assert got["id"] != t["id"] and [x["token_id"] for x in got["tokens"]] == ids
        assert got["reopened"]["read"] == len(ids) and got["reopened"]["requests"] == 2 + 6 * demo.config.n_layer
        assert got["reopened"]["round_trips"] == got["reopened"]["requests"]  # a prefill writes its keys first
        assert {p: s["phase"] for p, s in got["steps"].items()} == {p: "reopened" for p in t["steps"]}
        top = lambda step: [c["token_id"] for c in step["candidates"]][:40]  # noqa: E731
        assert all(top(s) == top(t["steps"][p]) for p, s in got["steps"].items())
        ev = b.post(f"/api/texts/{got['id']}/generate", json={"max_tokens": 3, "temperature": 0})
        more = [d["token_id"] for e, d in events(ev.text) if e == "token"]
        assert ids[n0:] + more == Reference(demo).greedy(tokenizer.encode(PROMPT), 7)
    finally:
        a.delete(f"/api/texts/{t['id']}")
        b.delete(f"/api/texts/{got['id']}")


def test_a_text_reopened_over_http_keeps_its_controls_candidates(clients):
    """The page's path: each step's JSON says the controls it was generated with ("controls"), the page
    sends them back with the reopen, and the reopened steps show the same candidates, before and after."""
    a, b = clients
    t = a.post("/api/texts", json={"prompt": LOOP}).json()
    body = {"max_tokens": 6, "temperature": 0, "frequency_penalty": 0.8, "logit_bias": {"13": 2.0, "262": -3.0}}
    a.post(f"/api/texts/{t['id']}/generate", json=body)
    t = a.get(f"/api/texts/{t['id']}").json()
    assert all(s["controls"] == {"frequency_penalty": 0.8, "logit_bias": {"13": 2.0, "262": -3.0}}
               for s in t["steps"].values())
    ids = [x["token_id"] for x in t["tokens"]]
    generated = [{"position": int(p), "temperature": s["temperature"], "controls": s["controls"]}
                 for p, s in t["steps"].items()]
    got = b.post("/api/texts", json={"prompt_ids": ids, "reopen": {"length": t["length"], "generated": generated}})
    assert got.status_code == 201, got.text
    got = got.json()
    try:
        shown = lambda step: [(c["token_id"], c["moved"]) for c in step["candidates"]][:40]  # noqa: E731
        for p, s in got["steps"].items():
            assert s["phase"] == "reopened" and s["controls"] == t["steps"][p]["controls"]
            assert shown(s) == shown(t["steps"][p]), f"position {p}"
            for c, old in zip(s["candidates"][:40], t["steps"][p]["candidates"], strict=False):
                assert abs(c["logit"] - old["logit"]) < 1e-3 and abs(c["logit_before"] - old["logit_before"]) < 1e-3
        bad = b.post("/api/texts", json={"prompt_ids": ids, "reopen": {"length": t["length"], "generated": [
            {"position": len(ids) - 1, "temperature": 0, "controls": {"frequency_penalty": 5}}]}})
        assert bad.status_code == 422 and "frequency_penalty" in bad.text
    finally:
        a.delete(f"/api/texts/{t['id']}")
        b.delete(f"/api/texts/{got['id']}")


@pytest.mark.parametrize("body, status, match", [
    ({"prompt": PROMPT, "reopen": {"length": 1}}, 422, "give prompt_ids"),
    ({"prompt_ids": [464, 2068], "reopen": {"length": 5}}, 400, "length 5 is outside 1..2"),
    ({"prompt_ids": [464, 2068], "reopen": {"length": 2, "generated": [{"position": 7, "temperature": 0}]}}, 400,
     "generated position 7"),
    ({"prompt_ids": [464, 2068], "reopen": {"length": 2, "generated": [{"position": 1, "temperature": -1}]}}, 422,
     "temperature"),
    ({"prompt_ids": [464, 2068], "reopen": {"length": 2, "what": 1}}, 422, "what"),
])
def test_a_bad_reopen_over_http_gets_a_4xx_naming_it(clients, body, status, match):
    r = clients[1].post("/api/texts", json=body)
    assert r.status_code == status, r.text
    assert match in r.text


def test_numpy_texts_reopen_too(demo):
    """A numpy run (no store, no keys to keep) reopens the same way."""
    texts = Texts(lambda: Run(NumpyWeights(demo)))
    t = texts.create(tokenizer.encode(PROMPT))
    list(t.generate(3, GREEDY))
    r, requests = Texts(lambda: Run(NumpyWeights(demo))).reopen(*page_state(t))
    assert requests == [] and r.tokens == t.tokens
    for p, step in r.steps.items():
        assert list(step.ids[:40]) == list(t.steps[p].ids[:40])
        np.testing.assert_allclose(step.logits[:40], t.steps[p].logits[:40], atol=1e-4)
