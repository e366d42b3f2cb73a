"""A client built from ``/openapi.json`` alone, as a user with nothing but the document would
build one: aiopenapi3 (a maintained OpenAPI 3.0/3.1 client, on PyPI) reads the document a running
server serves and makes an operation of each operation id, with pydantic models of its request
body and of its responses, errors included. Through it, every OpenAI and tokenizer operation is
called on the demo model and checked against the numpy reference (``reference.Reference``).

The notebook's document (``/openapi.json?tags=notebook``) is checked as a Custom GPT's action
import checks one (``action_problems``: the spec valid, an absolute server, at most 30
operations, each with an operationId, a summary and a description of at most 300 characters,
every reference resolved), and a client built from it saves and lists an insight.

Why not a code generator here: openapi-python-client 0.29.1 pins httpx<0.29 and typer<0.28, older
than this project's environment has (in a venv of its own it generates a working client from the
same document: docs/openai.md has the command); aiopenapi3 needs nothing older.
"""

from __future__ import annotations

import json
import re
import subprocess
from urllib.parse import urlsplit

import httpx
import httpx2
import numpy as np
import pytest
from aiopenapi3 import OpenAPI
from aiopenapi3.errors import HTTPClientError
from click.testing import CliRunner
from fastapi.testclient import TestClient
from openapi_spec_validator import validate

from puffergpt import notebook as nb
from puffergpt.cli import main
from puffergpt.model import tokenizer
from puffergpt.model.reference import Reference
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import serving
from puffergpt.server.guards.auth import needs_key

PROMPT = "The list"  # the demo model goes on past 12 tokens
CHAT = [{"role": "system", "content": "You answer about Python."}, {"role": "user", "content": "What is a list?"}]
TOLERANCE = 1e-3  # log-probabilities: the store's float32 rows against numpy's float32 weights
# OpenAI's own operation ids (its OpenAPI document's) and vLLM's tokenizer routes
OPERATIONS = {"openai": {"listModels", "retrieveModel", "createCompletion", "createChatCompletion"},
              "tokenizer": {"tokenize", "detokenize", "tokenizerInfo"}}


@pytest.fixture(scope="module")
def server(loaded, demo, tmp_path_factory):
    """A server (uvicorn, in this process) of the demo model with a notebook: (its URL, the notebook)."""
    store, key = loaded(demo)
    book = nb.Notebook(tmp_path_factory.mktemp("openapi") / "notebook")
    with serving(create_app(open_engine(store, demo.name, key), ServerConfig(), notebook=book)) as base:
        yield base, book


@pytest.fixture(scope="module")
def api(server):
    """The client aiopenapi3 builds from the server's /openapi.json; operations grouped by
    their tags: ``api._.openai.createCompletion``."""
    return OpenAPI.load_sync(f"{server[0]}/openapi.json", session_factory=httpx2.Client, use_operation_tags=True)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """(T, V) -> (T, V), in float64."""
    x = logits.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_operations_have_distinct_meaningful_names(api):
    ids = [op.operationId for item in api.paths.values() for op in (item.get, item.post, item.delete) if op]
    assert len(ids) == len(set(ids)), sorted(ids)  # aiopenapi3 also refuses a duplicate when it builds
    assert not [i for i in ids if i.lower().startswith("run")], ids  # never FastAPI's name of a `run` route
    built = set(api._)  # the client's operations, "tag.operationId"
    assert {f"{tag}.{name}" for tag, names in OPERATIONS.items() for name in names} <= built, sorted(built)
    # the request body the client builds is the route's: not an operation with no body
    body = api._.openai.createCompletion.data.get_type()
    assert {"prompt", "max_tokens", "temperature", "logprobs", "echo", "stop", "n"} <= set(body.model_fields)


def test_models_and_the_tokenizer(api, demo):
    listed = api._.openai.listModels()
    assert type(listed).__name__ == "ModelList" and [m.id for m in listed.data] == ["demo"]
    assert api._.openai.retrieveModel(parameters={"model_id": "demo"}).id == "demo"
    text = "héllo wörld 🐍\n\tdef f(x): return x"
    got = api._.tokenizer.tokenize(data={"model": "demo", "prompt": text, "return_token_strs": True})
    ids = tokenizer.encode(text)
    assert type(got).__name__ == "TokenizeResponse"
    assert (got.tokens, got.count, got.max_model_len) == (ids, len(ids), demo.config.n_ctx)
    assert got.token_strs == [tokenizer.token_text(i) for i in ids]
    assert api._.tokenizer.detokenize(data={"model": "demo", "tokens": ids}).prompt == text
    assert api._.tokenizer.tokenizerInfo().eos_token == "<|endoftext|>"  # no schema: an open object


def test_greedy_completion_with_echo_and_logprobs_equals_numpy(api, demo):
    body = api._.openai.createCompletion.data.get_type()(model="demo", prompt=PROMPT, max_tokens=8, temperature=0,
                                                          logprobs=5, echo=True)
    r = api._.openai.createCompletion(data=body)
    assert type(r).__name__ == "CompletionResponse"
    (choice,) = r.choices
    ids = tokenizer.encode(PROMPT)
    want = Reference(demo).greedy(ids, 8)
    assert tokenizer.EOT not in want and choice.finish_reason == "length", "the demo model now ends 'The list'"
    lp = choice.logprobs.root  # nullable in the document: a RootModel around the CompletionLogprobs
    assert lp.tokens == [tokenizer.token_text(i) for i in ids + want]
    assert choice.text == tokenizer.decode(ids + want) and r.usage.root.completion_tokens == 8
    rows = log_softmax(Reference(demo).logits(ids + want))  # (T, V): row t predicts token t + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first token
    diffs = []
    for t, tok in enumerate(ids + want):
        if t == 0:
            continue
        row, top = rows[t - 1], lp.top_logprobs[t].root.root  # {token text: logprob}, most likely first
        best = np.argsort(-row)[:5]
        assert list(top)[:5] == [tokenizer.token_text(int(i)) for i in best], t
        diffs.append(abs(lp.token_logprobs[t] - row[tok]))
        diffs += [abs(v - row[i]) for v, i in zip(list(top.values())[:5], best, strict=True)]
    worst = max(diffs)
    assert worst < TOLERANCE, f"log-probabilities differ from numpy's by up to {worst:.2e}"
    print(f"createCompletion: {len(diffs)} log-probabilities, max difference from numpy {worst:.2e}")


def test_greedy_chat_with_logprobs_equals_numpy(api, demo):
    r = api._.openai.createChatCompletion(data={"model": "demo", "messages": CHAT, "max_tokens": 6,
                                                "temperature": 0, "logprobs": True, "top_logprobs": 2})
    assert type(r).__name__ == "ChatResponse"
    (choice,) = r.choices
    ids = tokenizer.encode("System: You answer about Python.\nUser: What is a list?\nAssistant:")
    want = Reference(demo).greedy(ids, 6)
    text = tokenizer.decode(want)
    assert choice.finish_reason == "length" and "\nUser:" not in text, f"the demo model now answers {text!r}"
    assert choice.message.content == text.lstrip(" ") and r.usage.prompt_tokens == len(ids)
    content = choice.logprobs.root.content
    assert [c.token for c in content] == [tokenizer.token_text(i) for i in want]
    rows = log_softmax(Reference(demo).logits(ids + want))[len(ids) - 1: -1]  # (6, V): the rows each came from
    worst = max(abs(c.logprob - row[t]) for c, row, t in zip(content, rows, want, strict=True))
    assert worst < TOLERANCE and all(len(c.top_logprobs) == 2 for c in content), worst
    print(f"createChatCompletion: max difference from numpy {worst:.2e}")


def test_a_bad_request_is_parsed_as_the_declared_error(api):
    with pytest.raises(HTTPClientError) as e:
        api._.openai.createCompletion(data={"model": "demo", "prompt": PROMPT, "max_tokens": 1, "logprobs": 6})
    err = e.value
    assert err.status_code == 400 and type(err.data).__name__ == "ErrorBody"  # the document's 400 schema
    assert (err.data.error.type, err.data.error.param) == ("invalid_request_error", "logprobs")
    assert "less than or equal to 5" in err.data.error.message
    with pytest.raises(HTTPClientError) as e:
        api._.openai.retrieveModel(parameters={"model_id": "gpt-4"})
    assert e.value.status_code == 404 and e.value.data.error.code == "model_not_found"


# --- the document as a GPT action or a generator imports it (issue 33) ---

METHODS = ("get", "put", "post", "delete", "patch", "options", "head", "trace")
ACTION_OPERATIONS = {"saveInsight", "listInsights", "getInsight", "replayInsight"}


def operations(doc: dict) -> dict:
    """(path, method) -> operation."""
    return {(path, m): op for path, item in doc["paths"].items() for m, op in item.items() if m in METHODS}


def resolves(doc: dict, ref: str) -> bool:
    node = doc
    for part in ref.removeprefix("#/").split("/"):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def action_problems(doc: dict, max_operations: int | None = 30) -> list[str]:
    """What a Custom GPT's action import refuses in ``doc``, as a list of problems (none: it
    imports): a valid OpenAPI 3.1 document with one absolute http(s) server, at most
    ``max_operations`` operations, each with a unique operationId of letters, digits and _,
    a summary and a description of at most 300 characters, every reference resolved, request
    bodies JSON, every response described."""
    try:
        validate(doc)
    except Exception as e:  # the validator's own error: the problem, with its path
        return [f"not a valid OpenAPI document: {str(e)[:300]}"]
    problems = []
    url = doc.get("servers", [{}])[0].get("url", "")
    if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc:
        problems.append(f"servers[0].url is not absolute: {url!r}")
    ops = operations(doc)
    if max_operations is not None and len(ops) > max_operations:
        problems.append(f"{len(ops)} operations, over {max_operations}")
    ids = [op.get("operationId") for op in ops.values()]
    problems += [f"operationId {i!r} repeated" for i in {i for i in ids if ids.count(i) > 1}]
    for (path, m), op in ops.items():
        where = f"{m.upper()} {path}"
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", op.get("operationId") or ""):
            problems.append(f"{where}: operationId {op.get('operationId')!r}")
        if not op.get("summary") or not op.get("description") or len(op["description"]) > 300:
            problems.append(f"{where}: a summary and a description of at most 300 characters")
        content = op.get("requestBody", {}).get("content", {})
        if content and set(content) != {"application/json"}:
            problems.append(f"{where}: a request body not JSON ({sorted(content)})")
        problems += [f"{where}: response {c} undescribed" for c, r in op["responses"].items()
                     if not r.get("description")]
    refs = set(re.findall(r'"\$ref": "([^"]+)"', json.dumps(doc)))
    problems += [f"$ref {r} does not resolve" for r in sorted(refs) if not resolves(doc, r)]
    return problems


def schema_of(response: dict, media: str = "application/json") -> str:
    return response["content"][media]["schema"]["$ref"].rsplit("/", 1)[-1]


def test_the_notebook_document_imports_as_a_gpt_action(server):
    base, _ = server
    doc = httpx.get(f"{base}/openapi.json", params={"tags": "notebook"}).json()
    assert action_problems(doc) == []
    assert doc["servers"][0]["url"] == base  # absolute: the address the request came to
    ops = operations(doc)
    assert {op["operationId"] for op in ops.values()} == ACTION_OPERATIONS  # not the push, nor the playground's
    save = ops[("/api/insights", "post")]
    assert schema_of(save["responses"]["201"]) == "InsightSummary" and "200" not in save["responses"]
    assert {"400", "401", "409", "422", "503"} <= set(save["responses"])
    assert {schema_of(r) for c, r in save["responses"].items() if c >= "400"} == {"ErrorBody"}
    assert set(doc["components"]["schemas"]) >= {"InsightBody", "InsightSummary", "ErrorBody", "ErrorDetail"}
    assert not {"TextView", "CompletionResponse", "HTTPValidationError"} & set(doc["components"]["schemas"])
    bad = httpx.get(f"{base}/openapi.json", params={"tags": "notebok"})
    assert bad.status_code == 400 and "notebok" in bad.json()["error"]["message"] and "notebook" in bad.text


def test_every_operation_is_named_described_and_declares_what_it_sends(server):
    base, _ = server
    doc = httpx.get(f"{base}/openapi.json").json()
    assert action_problems(doc, max_operations=None) == []
    ops = operations(doc)
    for (path, m), op in ops.items():  # FastAPI's generated ids end in the path and method: save_api_insights_post
        assert not op["operationId"].endswith(f"_{m}"), (path, op["operationId"])
        for code, r in op["responses"].items():
            if code >= "400":  # a readiness probe's 503 is its status, the balancer's shape
                assert schema_of(r) == ("Readiness" if (path, code) == ("/ready", "503") else "ErrorBody"), (path, code)
            if needs_key(m.upper(), path, False):  # what serve --api-key guards
                assert "401" in op["responses"] and schema_of(op["responses"]["401"]) == "ErrorBody", (path, m)
            else:  # the reads, and the tokenizer at the root (as vLLM's: no key)
                assert "401" not in op["responses"], (path, m)
    assert not needs_key("POST", "/tokenize", False) and needs_key("POST", "/v1/completions", False)
    assert "HTTPValidationError" not in json.dumps(doc)  # never sent: every error is an ErrorBody
    assert "422" not in ops[("/v1/models/{model_id}", "get")]["responses"]
    gen = ops[("/api/texts/{text_id}/generate", "post")]["responses"]
    assert list(gen["200"]["content"]) == ["text/event-stream"] and {"404", "409"} <= set(gen)
    for path in ("/v1/completions", "/v1/chat/completions"):
        assert set(ops[(path, "post")]["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
        assert "401" in ops[(path, "post")]["responses"]
    create = ops[("/api/texts", "post")]
    assert create["operationId"] == "createText" and "201" in create["responses"]


def test_a_client_from_the_action_document_saves_and_lists_an_insight(server):
    base, book = server
    action = OpenAPI.load_sync(f"{base}/openapi.json?tags=notebook", session_factory=httpx2.Client,
                               use_operation_tags=True)
    saved = action._.notebook.saveInsight(data={"title": "Temperature is confidence", "tags": ["temperature"],
                                                "body": "Dividing the logits by T < 1 sharpens the softmax."})
    assert type(saved).__name__ == "InsightSummary" and saved.evidence is False and saved.commit
    listed = action._.notebook.listInsights(parameters={"q": "SHARPENS"})
    assert [i.id for i in listed.insights] == [saved.id]
    assert action._.notebook.getInsight(parameters={"insight_id": saved.id}).body.startswith("Dividing")
    log = subprocess.run(["git", "-C", str(book.path), "show", "--format=", "--name-only", saved.commit],
                         capture_output=True, text=True, check=True).stdout.split()
    assert log == [saved.path]  # one commit holding the file
    for data, status, words in (({"title": "  "}, 400, "the title is empty"),
                                ({"title": "t", "bogus": 1}, 422, "bogus: Extra inputs are not permitted")):
        with pytest.raises(HTTPClientError) as e:
            action._.notebook.saveInsight(data=data)
        assert e.value.status_code == status and type(e.value.data).__name__ == "ErrorBody", data
        assert words in e.value.data.error.message, e.value.data


def test_public_url_fills_servers_and_is_checked(loaded, demo):
    store, key = loaded(demo)
    engine = open_engine(store, demo.name, key)
    app = create_app(engine, ServerConfig(public_url="https://puffer.example.org/gpt/"))
    c = TestClient(app, base_url="http://127.0.0.1:8000")
    doc = c.get("/openapi.json?tags=openai,tokenizer").json()
    assert doc["servers"] == [{"url": "https://puffer.example.org/gpt", "description": "this server"}]
    assert {t for op in operations(doc).values() for t in op["tags"]} == {"openai", "tokenizer"}
    r = c.get("/openapi.json?tags=notebook")  # this server has no notebook: it says so, not an empty document
    assert r.status_code == 400 and "no operations are tagged notebook" in r.json()["error"]["message"]
    for bad, words in (("ftp://x.org", "http:// or https://"), ("/gpt", "absolute"), ("https://x.org/?a=1", "query"),
                       ("https://me:pw@x.org", "password"), ("https://x.org:99999", "not a URL")):
        with pytest.raises(ValueError, match=words):
            ServerConfig(public_url=bad)
        r = CliRunner().invoke(main, ["serve", "--model", "demo", "--public-url", bad], env={"PUFFERGPT_DATA": None})
        assert r.exit_code == 2 and "--public-url" in r.output and words in r.output, r.output  # before any loading


def test_an_unknown_tag_is_named_only_when_it_looks_like_one(loaded, demo):
    """The probe's case: /openapi.json?tags=<5,000 characters> was echoed back in the 400."""
    store, key = loaded(demo)
    c = TestClient(create_app(open_engine(store, demo.name, key)), base_url="http://127.0.0.1:8000")
    junk = "<script>" + "A" * 5000
    r = c.get("/openapi.json", params={"tags": f"notebok,{junk},openai"})
    assert r.status_code == 400, r.text
    said = r.json()["error"]["message"]
    assert "no operations are tagged notebok, 1 other value (not shown)" in said and "AAAA" not in r.text, said
    assert "<script>" not in r.text and len(r.text) < 1000 and "the tags are" in said
