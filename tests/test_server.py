"""The HTTP API: texts, streaming, OpenAI-compatible completions, bounds and errors."""

import json

import numpy as np
import pytest
from fastapi.testclient import TestClient

from helpers import message
from puffergpt.cli import serve
from puffergpt.model import tokenizer
from puffergpt.model.reference import NumpyWeights, Reference
from puffergpt.model.session import Run
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.guards.body_limit import MAX_BODY

PROMPT = "The quick brown fox"


@pytest.fixture(scope="module")
def client(loaded, tiny):
    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(max_open_texts=4),
                     reference=lambda: Run(NumpyWeights(tiny)))
    with TestClient(app) as c:
        yield c


def events(resp) -> list[tuple[str, dict]]:
    out = []
    for block in resp.text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_completions_greedy_equals_the_reference(client, tiny):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = tokenizer.encode(PROMPT)
    want = Reference(tiny).greedy(ids, 8)
    assert body["choices"][0]["text"] == tokenizer.decode(want)
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 8, "total_tokens": len(ids) + 8}
    assert body["choices"][0]["finish_reason"] == "length"
    # logprobs: the model's own log-softmax over the whole vocabulary, from an independent numpy forward
    lp = body["choices"][0]["logprobs"]
    logits = Reference(tiny).logits(ids)[-1].astype(np.float64)
    top = np.argsort(-logits)[:40]
    logp = logits[top] - (np.log(np.exp(logits - logits.max()).sum()) + logits.max())
    assert lp["tokens"][0] == tokenizer.token_text(want[0])
    assert lp["token_logprobs"][0] == pytest.approx(float(logp[0]), abs=1e-4)
    assert list(lp["top_logprobs"][0]) == [tokenizer.token_text(int(t)) for t in top[:5]]
    assert lp["text_offset"][0] == len(PROMPT)


def test_completions_stream(client):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "temperature": 0, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    lines = [ln for ln in r.text.split("\n") if ln]
    assert all(ln.startswith("data: ") for ln in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[6:]) for ln in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    streamed = "".join(c["choices"][0]["text"] for c in chunks)
    plain = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5, "temperature": 0}).json()
    assert streamed == plain["choices"][0]["text"]


def test_texts_api_round_trip(client, tiny):
    t = client.post("/api/texts", json={"prompt": PROMPT}).json()
    n = len(tokenizer.encode(PROMPT))
    assert t["length"] == n
    assert [x["text"] for x in t["tokens"]] == [tokenizer.token_text(i) for i in tokenizer.encode(PROMPT)]
    r = client.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 4, "temperature": 0, "top_k": 40})
    evs = events(r)
    assert [e for e, _ in evs] == ["token"] * 4 + ["done"]
    first = evs[0][1]
    assert first["phase"] == "prefill" and first["read"] == n and len(first["candidates"]) == 40
    assert [q["kind"] for q in first["request_log"]][-1] == "wte.top_k" and first["cost_usd"] > 0
    assert evs[1][1]["phase"] == "decode"
    assert [e[1]["token_id"] for e in evs[:4]] == Reference(tiny).greedy(tokenizer.encode(PROMPT), 4)
    got = client.post(f"/api/texts/{t['id']}/branch", json={"position": n + 1, "rank": 3}).json()
    assert got["length"] == n + 2
    assert got["tokens"][n + 1]["token_id"] == evs[1][1]["candidates"][3]["token_id"]
    back = client.post(f"/api/texts/{t['id']}/step_back", json={"position": n}).json()
    assert back["length"] == n and back["known"] == n + 2
    fwd = client.post(f"/api/texts/{t['id']}/step_forward", json={"position": n + 2}).json()
    assert fwd["length"] == n + 2
    cut = client.post(f"/api/texts/{t['id']}/cut", json={"position": n + 1}).json()
    assert cut["length"] == cut["known"] == n + 1
    assert client.get(f"/api/texts/{t['id']}").json()["length"] == n + 1
    assert client.delete(f"/api/texts/{t['id']}").status_code == 200
    assert client.get(f"/api/texts/{t['id']}").status_code == 404


def test_compare(client):
    r = client.post("/api/compare", json={"prompt": PROMPT}).json()
    assert r["same_ids"] and len(r["rows"]) == 40 and r["max_abs_diff"] < 1e-3
    assert r["search"]["requests"] > 0 and r["reference"]["requests"] == 0


def test_info(client, tiny):
    info = client.get("/api/info").json()
    assert info["documents"] > tiny.config.n_vocab and info["requests_per_token"] == 2 + 6 * tiny.config.n_layer
    assert info["rates"]["write_per_gb"] == 2.0
    assert info["model"] == "tiny" and "/" not in json.dumps(info["model"])  # not the checkpoint's full path
    assert str(tiny.name) not in json.dumps(info)


@pytest.mark.parametrize("path, body, status, match", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": PROMPT, "top_k": 0}, 400, "top_k"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": "word " * 200}, 400, "context"),
    ("/api/texts", {"prompt": PROMPT, "evil": 1}, 422, "evil"),
    ("/api/texts/nope/generate", {"max_tokens": 1}, 404, "no open text"),
    ("/api/texts/nope/branch", {"position": 1, "rank": 0}, 404, "no open text"),
])
def test_bad_requests_get_4xx_with_a_message(client, path, body, status, match):
    r = client.post(path, json=body)
    assert r.status_code == status, r.text
    assert match in r.text
    assert client.get("/api/info").status_code == 200  # still serving


def test_bad_edits_leave_the_text_alone(client):
    t = client.post("/api/texts", json={"prompt": PROMPT}).json()
    for path, body in [("branch", {"position": 99, "token_id": 1}), ("branch", {"position": 1, "token_id": 60000}),
                       ("cut", {"position": -1}), ("step_back", {"position": 0}),
                       ("branch", {"position": 1, "rank": 0})]:
        r = client.post(f"/api/texts/{t['id']}/{path}", json=body)
        assert r.status_code == 400 and message(r), (path, body)
    assert client.get(f"/api/texts/{t['id']}").json() == t
    r = client.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 500})
    assert r.status_code == 400 and "context" in message(r)
    client.delete(f"/api/texts/{t['id']}")


def test_body_over_the_bound(client):
    r = client.post("/api/texts", content=b'{"prompt": "' + b"a" * MAX_BODY + b'"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and "request body" in message(r)


def test_open_texts_are_bounded(client):
    ids = [client.post("/api/texts", json={"prompt": "a"}).json()["id"] for _ in range(4)]
    r = client.post("/api/texts", json={"prompt": "a"})
    assert r.status_code == 400 and "texts are open" in message(r)
    for i in ids:
        client.delete(f"/api/texts/{i}")


def test_markup_in_a_prompt_comes_back_as_json_text(client):  # the page's rendering: test_playground.py
    r = client.post("/api/texts", json={"prompt": "<img src=x onerror=alert(1)>"})
    assert r.headers["content-type"] == "application/json"
    assert "".join(x["text"] for x in r.json()["tokens"]) == "<img src=x onerror=alert(1)>"
    client.delete(f"/api/texts/{r.json()['id']}")


def test_serve_binds_loopback_by_default():
    host = next(p for p in serve.params if p.name == "host")
    assert host.default == "127.0.0.1"


def test_openapi_documents_the_api(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/completions", "/api/texts", "/api/texts/{text_id}/generate", "/api/compare"} <= set(paths)


def test_openapi_names_the_main_responses_fields(client):
    """The response models document what the page reads, without changing it: the schema
    names the fields, and a response has every field the model declares."""
    api = client.get("/openapi.json").json()
    schemas = api["components"]["schemas"]
    ok = api["paths"]["/api/texts/{text_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert ok == {"$ref": "#/components/schemas/TextView"}
    for name, path in [("Info", "/api/info"), ("TextView", "/api/texts")]:
        body = client.get(path).json() if name == "Info" else client.post(path, json={"prompt": PROMPT}).json()
        assert set(schemas[name]["properties"]) <= set(body), name
    client.delete(f"/api/texts/{body['id']}")


def test_idle_texts_are_swept(loaded, tiny):
    """The server closes idle texts by itself, namespaces included."""
    import time

    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(idle_s=0.2))
    with TestClient(app) as c:
        t = c.post("/api/texts", json={"prompt": PROMPT}).json()
        ns = app.state.texts.get(t["id"]).session.keys_ns
        time.sleep(1.0)  # idle: no request touches it (a GET would count as use)
        assert c.get(f"/api/texts/{t['id']}").status_code == 404
        assert ns not in store.namespaces("text-")


def test_a_chunked_body_over_the_bound(client):
    def chunks():
        for _ in range(64):
            yield b"x" * 16384  # 1 MiB in all, with no content-length

    r = client.post("/api/compare", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "request body" in message(r)
    assert client.get("/api/info").status_code == 200


def test_a_tiny_temperature_is_greedy_not_nan(client):
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "temperature": 1e-320})
    t0 = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == t0.json()["choices"][0]["text"]


def test_one_generation_at_a_time(client):
    t = client.post("/api/texts", json={"prompt": PROMPT}).json()
    app_texts = client.app.state.texts
    app_texts.get(t["id"]).begin()  # as if a generation were streaming
    r = client.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 2})
    assert r.status_code == 409 and "generating" in message(r)
    r = client.post(f"/api/texts/{t['id']}/cut", json={"position": 2})
    assert r.status_code == 409
    app_texts.get(t["id"]).end()
    assert client.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 2, "temperature": 0}).status_code == 200
    client.delete(f"/api/texts/{t['id']}")


def test_dns_rebinding_is_refused(loaded, tiny):
    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(trusted_hosts=("127.0.0.1", "localhost")))
    with TestClient(app, base_url="http://evil.example") as c:
        assert c.get("/api/info").status_code == 400
    with TestClient(app, base_url="http://127.0.0.1:8000") as c:
        assert c.get("/api/info").status_code == 200


def test_the_servers_max_new_tokens_is_enforced(loaded, tiny):
    """ServerConfig.max_new_tokens bounds every route that generates, not only what
    /api/info reports: one over it is a 400 naming the limit (OpenAI's shape on /v1)."""
    store, key = loaded(tiny)
    app = create_app(open_engine(store, tiny.name, key), ServerConfig(max_new_tokens=3))
    with TestClient(app) as c:
        assert c.get("/api/info").json()["max_new_tokens"] == 3
        t = c.post("/api/texts", json={"prompt": PROMPT}).json()
        r = c.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 4})
        assert r.status_code == 400 and "limit of 3" in message(r)
        assert c.get(f"/api/texts/{t['id']}").json()["length"] == len(tokenizer.encode(PROMPT))  # nothing ran
        r = c.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and events(r)[-1][1]["tokens"] == 3
        for path, body in [("/v1/completions", {"prompt": PROMPT, "max_tokens": 4}),
                           ("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})]:
            r = c.post(path, json=body)
            assert r.status_code == 400 and "limit of 3" in r.json()["error"]["message"], (path, r.text)
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}).status_code == 200
    for bad in (0, 10_000):  # the bodies bound max_tokens at MAX_NEW_TOKENS: a limit past it would be a lie
        with pytest.raises(ValueError, match="max_new_tokens"):
            ServerConfig(max_new_tokens=bad)



BAD_JSON = [  # (path, raw body): each a clear 4xx, none a 500 (the probe of issue 13)
    ("/v1/completions", b'{"prompt": "The", "temperature": NaN}'),
    ("/v1/completions", b'{"prompt": "The", "temperature": Infinity}'),
    ("/v1/completions", b'{"prompt": "The", "temperature": -Infinity}'),
    ("/v1/completions", b'{"prompt": "The", "temperature": 1e400}'),
    ("/v1/completions", b'{"prompt": NaN}'),
    ("/v1/completions", b'{"prompt": "The", "top_k": 1e400}'),
    ("/v1/completions", b'{"prompt": "The", "max_tokens": NaN, "stream": true}'),
    ("/api/texts", b'{"prompt": NaN}'),
    ("/api/texts", b'{"prompt": "\\udfff"}'),
    ("/api/compare", b'{"prompt": "The", "top_k": Infinity}'),
    ("/api/compare", b'{"prompt": "\\ud83d"}'),
    ("/api/analogy", b'{"a": NaN, "b": " king", "c": " woman"}'),
    ("/api/neighbours", b'{"word": " king", "k": 1e400}'),
]


@pytest.mark.parametrize("path, raw", BAD_JSON)
def test_bad_json_values_are_4xx_and_leak_nothing(client, loaded, tiny, path, raw):
    store, _ = loaded(tiny)
    before = set(store.namespaces("text-"))
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, (r.status_code, r.text)
    got = r.json()  # JSON that parses, with a message (OpenAI's shape on /v1)
    assert got["error"]["message"], got
    assert set(store.namespaces("text-")) == before  # no text or namespace left open
    assert client.get("/api/info").status_code == 200


def test_a_nul_in_a_static_path_is_404(client):
    r = client.get("/static/%00")
    assert r.status_code == 404 and message(r) == "no such file"
    assert client.get("/static/..%2f..%2fpyproject.toml").status_code == 404


def test_a_text_keeps_bounded_memory_at_any_top_k(client):
    """40 tokens at top_k = the whole vocabulary: a step keeps 100 candidates, so the
    text's JSON stays small (it was 50 MB before)."""
    t = client.post("/api/texts", json={"prompt": PROMPT}).json()
    r = client.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 40, "temperature": 1.0,
                                                           "top_k": tokenizer.VOCAB_SIZE, "seed": 1})
    assert [e for e, _ in events(r)][-1] == "done"
    got = client.get(f"/api/texts/{t['id']}")
    assert len(got.json()["steps"]) == 40
    assert len(got.content) < 2_000_000, f"{len(got.content) / 1e6:.1f} MB"
    client.delete(f"/api/texts/{t['id']}")


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory, loaded):
    """A model with a vocabulary of 300 tokens (GPT-2's first 300), served: (client, store)."""
    from puffergpt.model import checkpoints

    c = checkpoints.GPT2Config(n_vocab=300, n_ctx=64, n_embd=32, n_layer=1, n_head=2)
    d = checkpoints.save_dir(tmp_path_factory.mktemp("ckpt") / "small-vocab", c, checkpoints.random_params(c, seed=5))
    ckpt = checkpoints.load(str(d))
    store, key = loaded(ckpt)
    with TestClient(create_app(open_engine(store, ckpt.name, key))) as client:
        yield client, store, ckpt


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": [10, 20, 30], "max_tokens": 2, "top_k": 301}),
    ("/v1/completions", {"prompt": [10, 20, 30], "max_tokens": 2, "top_k": 50000, "stream": True}),
    ("/v1/completions", {"prompt": [[10, 20], [30]], "max_tokens": 2, "top_k": 1000}),
    ("/text", {"max_tokens": 2, "top_k": 301}),
])
def test_top_k_above_a_small_vocabulary_is_4xx_and_leaks_nothing(small_vocab, path, body):
    client, store, _ = small_vocab
    before = set(store.namespaces("text-"))
    if path == "/text":  # a text of the texts API: the prompt "!" is token 0
        t = client.post("/api/texts", json={"prompt": "!"}).json()
        r = client.post(f"/api/texts/{t['id']}/generate", json=body)
        assert 400 <= r.status_code < 500 and "top_k" in message(r) and "300" in message(r), r.text
        assert client.app.state.texts.get(t["id"]).generating is False  # free to generate again
        client.delete(f"/api/texts/{t['id']}")
    else:
        r = client.post(path, json=body)
        assert 400 <= r.status_code < 500, (r.status_code, r.text)
        err = r.json()["error"]
        assert "top_k" in err["message"] and "300" in err["message"], err
    assert set(store.namespaces("text-")) == before  # no text or namespace left open
    ok = client.post("/v1/completions", json={"prompt": [10, 20, 30], "max_tokens": 3, "top_k": 300, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3, ok.text


def test_a_small_vocabulary_greedy_equals_the_reference(small_vocab):
    client, _, ckpt = small_vocab
    r = client.post("/v1/completions", json={"prompt": [10, 20, 30], "max_tokens": 5, "top_k": 40, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == tokenizer.decode(Reference(ckpt).greedy([10, 20, 30], 5))


def test_no_top_k_means_the_served_models_whole_vocabulary(small_vocab):
    """Without top_k, /v1 samples from all of this model's tokens (300), not GPT-2's 50,257."""
    client, _, ckpt = small_vocab
    r = client.post("/v1/completions", json={"prompt": [10, 20, 30], "max_tokens": 3, "temperature": 0, "logprobs": 2})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == tokenizer.decode(Reference(ckpt).greedy([10, 20, 30], 3))


@pytest.mark.parametrize("body", [
    {"prompt": "The \ud800 end", "max_tokens": 2},
    {"prompt": ["fine", "\udfff"], "max_tokens": 2},
    {"prompt": "The \ud83d", "max_tokens": 2, "stream": True},
])
def test_a_lone_surrogate_in_a_completions_prompt_is_400_in_openai_shape(client, loaded, tiny, body):
    store, _ = loaded(tiny)
    before = set(store.namespaces("text-"))
    raw = json.dumps(body).encode()  # json.dumps writes a lone surrogate as \\udXXX: valid JSON, not text
    r = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text)
    err = r.json()["error"]
    assert "surrogate" in err["message"] and err["param"] == "prompt" and err["type"] == "invalid_request_error", err
    assert set(store.namespaces("text-")) == before


def test_v1_names_the_model_as_api_info_does(client, tiny):
    shown = client.get("/api/info").json()["model"]
    assert client.get("/v1/models").json()["data"][0]["id"] == shown == "tiny"
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "temperature": 0, "model": shown})
    assert r.status_code == 200 and r.json()["model"] == shown and str(tiny.name) not in r.text, r.text
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == shown and str(tiny.name) not in r.text, r.text
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 1, "model": "gpt-4"})
    assert r.status_code == 404 and str(tiny.name) not in r.text and "'tiny'" in r.json()["error"]["message"]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_docs_load_nothing_from_elsewhere(client, page):
    """/docs and /redoc work offline: their scripts and styles come from this server, and
    their CSP allows scripts from 'self' only (and the one inline start-up script, by hash)."""
    import re

    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert not re.search(r"https?://", r.text), re.findall(r"https?://[^\"' ]+", r.text)
    csp = r.headers["content-security-policy"]
    script_src = next(d for d in csp.split(";") if d.strip().startswith("script-src")).split()[1:]
    assert script_src[0] == "'self'" and all(s.startswith("'sha256-") for s in script_src[1:]), csp
    assert "http" not in csp and "'unsafe-inline'" not in " ".join(script_src)
    assets = re.findall(r'(?:src|href)="(/[^"]+)"', r.text)
    assert any(a.endswith(".js") for a in assets), assets
    for a in assets:
        got = client.get(a)
        assert got.status_code == 200 and len(got.content) > 1000, a
        if a.endswith(".js"):
            assert got.headers["content-type"].startswith("text/javascript"), (a, got.headers["content-type"])
    inline = re.findall(r"<script>(.*?)</script>", r.text, re.S)  # each must be allowed by its hash
    import base64
    import hashlib

    for body in inline:
        h = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"'sha256-{h}'" in script_src, "an inline script the CSP would block"


def test_static_scripts_are_served_as_javascript(client, monkeypatch):
    """Module scripts need a JavaScript type, whatever the host's mimetypes table says."""
    import mimetypes

    import starlette.responses

    plain = lambda *a, **k: ("text/plain", None)  # noqa: E731 - a host whose table says so
    monkeypatch.setattr(mimetypes, "guess_type", plain)
    monkeypatch.setattr(starlette.responses, "guess_type", plain)
    r = client.get("/static/main.js")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/javascript"), r.headers["content-type"]


def test_a_text_from_exact_token_ids(client, tiny):
    """prompt_ids opens exactly those tokens, even ones the tokenizer would never make of
    their text (reopening an insight); bad ids are a 4xx and open nothing."""
    ids = [tokenizer.encode(" one")[0], tokenizer.encode("two")[0]]  # " one" + "two": text " onetwo" encodes otherwise
    assert tokenizer.encode(tokenizer.decode(ids)) != ids
    t = client.post("/api/texts", json={"prompt_ids": ids})
    assert t.status_code == 201, t.text
    assert [x["token_id"] for x in t.json()["tokens"]] == ids
    client.delete(f"/api/texts/{t.json()['id']}")
    n = len(client.app.state.texts)
    for body in ({"prompt_ids": [50257]}, {"prompt_ids": [-1]}, {"prompt_ids": []}, {"prompt_ids": [1.5]},
                 {"prompt_ids": [True]}, {"prompt": "a", "prompt_ids": [1]}, {}):
        r = client.post("/api/texts", json=body)
        assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
    assert len(client.app.state.texts) == n


def test_the_body_parser_at_its_bounds():
    """bodies.parse_json, the one parser of every route: what it takes at each bound and
    what it refuses one past it, with the field named (the routes: tests/test_reliability.py)."""
    from puffergpt.server.bodies import MAX_DEPTH, MAX_INT_DIGITS, BodyError, parse_json

    def refused(raw: bytes) -> BodyError:
        with pytest.raises(BodyError) as e:
            parse_json(raw)
        return e.value

    big = "9" * MAX_INT_DIGITS
    assert parse_json(f'{{"seed": {big}, "t": -{big}}}'.encode()) == {"seed": int(big), "t": -int(big)}
    e = refused(f'{{"seed": {big}9}}'.encode())
    assert e.param == "seed" and f"{MAX_INT_DIGITS + 1} digits" in e.message
    deep = "[" * MAX_DEPTH + "]" * MAX_DEPTH  # the outer list is level 1, a field of the body
    assert parse_json(f'{{"x": {deep}}}'.encode())["x"] == json.loads(deep)
    e = refused(f'{{"x": [{deep}]}}'.encode())
    assert e.param == "x" and "nested more than" in e.message
    assert parse_json(b'{"w": "\\ud83d\\ude00"}') == {"w": "\U0001F600"}  # a pair is one character
    e = refused(b'{"words": ["ok", "\\ud83d"], "k": 1}')
    assert e.param == "words" and e.message.startswith("words[1] is not valid Unicode")
    assert parse_json(b'{"t": 1e308, "u": 5e-324}') == {"t": 1e308, "u": 5e-324}
    assert refused(b'{"t": 1e309}').message == "t is 1e309, too large for a number: send a finite number"
    assert refused(b"").message.startswith("the body is not JSON")
