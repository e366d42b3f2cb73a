"""A client built from ``/openapi.json`` alone, as a user with nothing but the document would
build one: aiopenapi3 (a maintained OpenAPI 3.0/3.1 client, on PyPI) reads the document a running
server serves and makes an operation of each operation id, with pydantic models of its request
body and of its responses, errors included. Through it, every OpenAI and tokenizer operation is
called on the demo model and checked against the numpy reference (``reference.Reference``).

Why not a code generator here: openapi-python-client 0.29.1 pins httpx<0.29 and typer<0.28, older
than this project's environment has (in a venv of its own it generates a working client from the
same document: docs/openai.md has the command); aiopenapi3 needs nothing older.
"""

from __future__ import annotations

import httpx2
import numpy as np
import pytest
from aiopenapi3 import OpenAPI
from aiopenapi3.errors import HTTPClientError

from puffergpt import tokenizer
from puffergpt.loading import open_engine
from puffergpt.reference import Reference
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import serving

PROMPT = "The list"  # the demo model goes on past 12 tokens
CHAT = [{"role": "system", "content": "You answer about Python."}, {"role": "user", "content": "What is a list?"}]
TOLERANCE = 1e-3  # log-probabilities: the store's float32 rows against numpy's float32 weights
# OpenAI's own operation ids (its OpenAPI document's) and vLLM's tokenizer routes
OPERATIONS = {"openai": {"listModels", "retrieveModel", "createCompletion", "createChatCompletion"},
              "tokenizer": {"tokenize", "detokenize", "tokenizerInfo"}}


@pytest.fixture(scope="module")
def api(loaded, demo):
    """The client aiopenapi3 builds from the /openapi.json of a server (uvicorn, in this process)
    of the demo model; operations grouped by their tags: ``api._.openai.createCompletion``."""
    store, key = loaded(demo)
    with serving(create_app(open_engine(store, demo.name, key), ServerConfig())) as base:
        yield OpenAPI.load_sync(f"{base}/openapi.json", session_factory=httpx2.Client, use_operation_tags=True)


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
