"""The OpenAI-compatible API driven by the official ``openai`` client against a running
server (uvicorn on 127.0.0.1), its log-probabilities against transformers' log-softmax
over the whole vocabulary."""

import json
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import uvicorn

from puffergpt.model import tokenizer
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.openai.protocol import ChatResponse, CompletionResponse, ModelList
from puffergpt.server.openai.tokenize import DetokenizeResponse, TokenizeResponse

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
transformers = pytest.importorskip("transformers")

PROMPT = "The return statement"  # the demo model ends it: greedy, <|endoftext|> comes next
LONG = "The list"  # the demo model goes on past 12 tokens


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def servers(loaded):
    """servers(ckpt) -> (openai client, base url): one uvicorn thread a model, stopped at the end."""
    made, running = {}, []

    def get(ckpt):
        if ckpt.name not in made:
            store, key = loaded(ckpt)
            port = _free_port()
            server = uvicorn.Server(uvicorn.Config(create_app(open_engine(store, ckpt.name, key), ServerConfig()),
                                                   host="127.0.0.1", port=port, log_level="warning"))
            thread = threading.Thread(target=server.run, daemon=True)
            thread.start()
            for _ in range(200):
                if server.started:
                    break
                time.sleep(0.05)
            assert server.started, "uvicorn did not start"
            running.append((server, thread))
            url = f"http://127.0.0.1:{port}/v1"
            made[ckpt.name] = (openai.OpenAI(base_url=url, api_key="none", max_retries=0), url)
        return made[ckpt.name]

    yield get
    for server, thread in running:
        server.should_exit = True
        thread.join(10)


def hf_logprobs(m, ids) -> np.ndarray:
    """transformers' log-softmax over the whole vocabulary at every position: (T,) -> (T, V)."""
    with torch.no_grad():
        return torch.log_softmax(m(torch.tensor([ids])).logits[0].double(), -1).numpy()


def test_models_list_and_retrieve(servers, tiny):
    client, _ = servers(tiny)
    assert [m.id for m in client.models.list()] == [Path(tiny.name).name]  # never the full path
    assert client.models.retrieve(tiny.name).id == Path(tiny.name).name
    listed = httpx.get(f"{servers(tiny)[1]}/models").json()["data"][0]
    assert listed["max_model_len"] == tiny.config.n_ctx  # as vLLM gives it: the context, in tokens
    assert client.models.retrieve(tiny.name).model_extra["max_model_len"] == tiny.config.n_ctx
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    assert e.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("model", ["tiny", "demo"])
def test_greedy_logprobs_and_echo_equal_transformers(request, servers, hf, model):
    ckpt = request.getfixturevalue(model)
    client, _ = servers(ckpt)
    r = client.completions.create(model=ckpt.name, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=5, echo=True)
    ids = tokenizer.encode(PROMPT)
    lp = r.choices[0].logprobs
    assert lp.tokens[: len(ids)] == [tokenizer.token_text(i) for i in ids]
    all_ids = ids + [tokenizer.encode(t)[0] for t in lp.tokens[len(ids):]]  # one token a piece for these texts
    assert tokenizer.decode(all_ids) == "".join(lp.tokens)
    generated = len(all_ids) - len(ids)  # every generated token, a generated <|endoftext|> included
    stopped = r.choices[0].finish_reason == "stop"
    assert (generated, all_ids[-1] == tokenizer.EOT) == ((generated, True) if stopped else (6, False))
    want = hf_logprobs(hf(ckpt), all_ids)  # (T, V): row t predicts token t + 1
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing predicts the first
    worst = 0.0
    for t in range(1, len(all_ids)):
        row = want[t - 1]
        if t >= len(ids):  # greedy: the model's best token over the whole vocabulary
            assert all_ids[t] == int(np.argmax(row))
        worst = max(worst, abs(lp.token_logprobs[t] - row[all_ids[t]]))
        top = [tokenizer.token_text(int(i)) for i in np.argsort(-row)[:5]]
        # the 5 most likely, then the token itself when it is not among them (OpenAI's "up to logprobs + 1")
        assert list(lp.top_logprobs[t]) == top + ([] if lp.tokens[t] in top else [lp.tokens[t]])
        worst = max(worst, max(abs(v - row[tokenizer.encode(k)[0]]) for k, v in lp.top_logprobs[t].items()))
    assert worst < 1e-3, f"logprobs differ from transformers' by {worst:.2e}"
    # offsets: characters from the prompt's start, each token where its text begins (<|endoftext|> at the end)
    text = r.choices[0].text
    assert text.startswith(PROMPT) and lp.text_offset[0] == 0 and "<|endoftext|>" not in text
    shown = [t for t in lp.tokens if t != "<|endoftext|>"]
    assert [text[o: o + len(t)] for o, t in zip(lp.text_offset, shown, strict=False)] == shown
    assert lp.text_offset[len(shown):] == [len(text)] * (len(lp.tokens) - len(shown))
    assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == generated
    assert r.usage.total_tokens == len(ids) + generated
    # one all-vocabulary search a scored position, in the request log's totals
    assert r.model_extra["puffergpt"]["all_vocabulary_searches"] == len(ids) - 1 + generated


def lm_eval_loglikelihoods(url: str, model: str, requests: list[tuple[list[int], list[int]]]) -> list[tuple]:
    """What lm-eval's ``local-completions`` does (lm_eval/models/openai_completions.py): one
    echo request for a batch of (context, continuation) token ids, ``max_tokens`` 1,
    ``logprobs`` 1, temperature 0; a continuation's log-likelihood is
    ``sum(token_logprobs[ctxlen:-1])``, the [-1] dropping the one generated token, and it
    is greedy when each of its logprobs is its ``top_logprobs`` entry's max."""
    r = httpx.post(url + "/completions", json={"model": model, "prompt": [c + x for c, x in requests],
                                               "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
                                               "echo": True}, timeout=300)
    assert r.status_code == 200, r.text
    out = []
    for choice, (context, _) in zip(sorted(r.json()["choices"], key=lambda c: c["index"]), requests, strict=True):
        got = choice["logprobs"]["token_logprobs"][len(context):-1]
        tops = choice["logprobs"]["top_logprobs"][len(context):-1]
        out.append((sum(got), all(lp == max(top.values()) for lp, top in zip(got, tops, strict=True)), len(got)))
    return out


def test_lm_eval_slicing_equals_transformers_even_when_the_model_ends(servers, demo, hf):
    """lm-eval's loglikelihoods through the server, against transformers: a continuation
    whose greedy next token is <|endoftext|> (the response must still hold that generated
    token, or [-1] drops the continuation's last), and one ending in <|endoftext|>."""
    _, url = servers(demo)
    context = tokenizer.encode("The return")
    requests = [(context, tokenizer.encode(" statement")), (context, tokenizer.encode(" statement<|endoftext|>")),
                (tokenizer.encode("x = 1\ny"), tokenizer.encode(" = 2"))]
    m = hf(demo)
    first = hf_logprobs(m, requests[0][0] + requests[0][1])
    assert int(np.argmax(first[-1])) == tokenizer.EOT, "the demo model no longer ends after 'The return statement'"
    got = lm_eval_loglikelihoods(url, demo.name, requests)
    worst = 0.0
    for (ll, greedy, n), (c, x) in zip(got, requests, strict=True):
        want = hf_logprobs(m, c + x)  # (T, V): row t predicts token t + 1
        rows = [want[len(c) + i - 1] for i in range(len(x))]
        assert n == len(x), f"lm-eval read {n} continuation logprobs for {len(x)} tokens"
        worst = max(worst, abs(ll - sum(r[t] for r, t in zip(rows, x, strict=True))))
        assert greedy == all(int(np.argmax(r)) == t for r, t in zip(rows, x, strict=True))
    assert worst < 1e-3, f"lm-eval's loglikelihoods differ from transformers' by {worst:.2e}"


def test_logprobs_zero_is_the_chosen_token_only(servers, demo):
    client, _ = servers(demo)
    r = client.completions.create(model=demo.name, prompt="x = 1\ny", max_tokens=3, temperature=0, logprobs=0)
    lp = r.choices[0].logprobs
    assert lp.top_logprobs == [{t: v} for t, v in zip(lp.tokens, lp.token_logprobs, strict=True)]


def test_prompt_forms_one_choice_each(servers, tiny):
    client, _ = servers(tiny)
    ids = tokenizer.encode(PROMPT)
    one = client.completions.create(model=tiny.name, prompt=PROMPT, max_tokens=3, temperature=0).choices[0].text
    r = client.completions.create(model=tiny.name, prompt=[PROMPT, "Hello"], max_tokens=3, temperature=0)
    assert [c.index for c in r.choices] == [0, 1] and r.choices[0].text == one
    assert client.completions.create(model=tiny.name, prompt=ids, max_tokens=3, temperature=0).choices[0].text == one
    r = client.completions.create(model=tiny.name, prompt=[ids, ids[:2]], max_tokens=3, temperature=0)
    assert len(r.choices) == 2 and r.choices[0].text == one
    assert r.usage.prompt_tokens == len(ids) + 2


def test_n_with_a_seed_is_three_reproducible_choices(servers, demo):
    client, _ = servers(demo)
    args = dict(model=demo.name, prompt=PROMPT, max_tokens=8, temperature=1.0, n=3, seed=7)
    a, b = client.completions.create(**args), client.completions.create(**args)
    assert [c.text for c in a.choices] == [c.text for c in b.choices] and len(a.choices) == 3
    assert len({c.text for c in a.choices}) > 1  # each choice its own draw
    top_p = client.completions.create(**{**args, "top_p": 0.5, "n": 1})
    assert top_p.choices[0].text == client.completions.create(**{**args, "top_p": 0.5, "n": 1}).choices[0].text
    # top_k as llama.cpp and vLLM take it
    assert client.completions.create(**{**args, "n": 1}, extra_body={"top_k": 5}).choices[0].text


def test_a_stop_spanning_two_tokens_is_honoured_and_not_returned(servers, demo):
    client, _ = servers(demo)
    free = client.completions.create(model=demo.name, prompt=LONG, max_tokens=12, temperature=0, logprobs=1)
    toks = free.choices[0].logprobs.tokens
    stop = toks[3][-2:] + toks[4][:2] if len(toks[3]) >= 2 else toks[3] + toks[4][:1]  # across tokens 3 and 4
    assert len(tokenizer.encode(stop)) >= 1 and stop in free.choices[0].text
    r = client.completions.create(model=demo.name, prompt=LONG, max_tokens=12, temperature=0, stop=[stop, "zzzz"])
    want = free.choices[0].text[: free.choices[0].text.index(stop)]
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    assert free.choices[0].finish_reason == "length"
    # streamed: the same text, the stop held back and never sent
    chunks = list(client.completions.create(model=demo.name, prompt=LONG, max_tokens=12, temperature=0, stop=stop,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want and chunks[-1].choices[0].finish_reason == "stop"


def test_streaming_offsets_and_final_chunk(servers, demo):
    client, url = servers(demo)
    chunks = list(client.completions.create(model=demo.name, prompt=LONG, max_tokens=8, temperature=0, logprobs=2,
                                            stream=True))
    plain = client.completions.create(model=demo.name, prompt=LONG, max_tokens=8, temperature=0, logprobs=2)
    assert "".join(c.choices[0].text for c in chunks) == plain.choices[0].text
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == plain.choices[0].logprobs.text_offset and offsets[0] == len(LONG)
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    raw = httpx.post(url + "/completions", json={"prompt": LONG, "max_tokens": 2, "stream": True}, timeout=60).text
    assert raw.rstrip().endswith("data: [DONE]")


def test_best_of_and_suffix(servers, tiny):
    client, _ = servers(tiny)
    r = client.completions.create(model=tiny.name, prompt=PROMPT, max_tokens=3, best_of=3, n=1, seed=1)
    assert len(r.choices) == 1
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=tiny.name, prompt=PROMPT, max_tokens=3, suffix=" end")
    assert "suffix" in e.value.body["message"]


def test_chat_completions(servers, demo, hf):
    client, _ = servers(demo)
    messages = [{"role": "system", "content": "You answer about Python."},
                {"role": "user", "content": "What is a list?"}]
    r = client.chat.completions.create(model=demo.name, messages=messages, max_tokens=10, temperature=0,
                                       logprobs=True, top_logprobs=3)
    msg = r.choices[0].message
    assert msg.role == "assistant" and "\nUser:" not in msg.content
    ids = tokenizer.encode("System: You answer about Python.\nUser: What is a list?\nAssistant:")
    assert r.usage.prompt_tokens == len(ids)
    content = r.choices[0].logprobs.content
    gen = [tokenizer.encode(c.token)[0] for c in content]
    want = hf_logprobs(hf(demo), ids + gen)
    worst = max(abs(c.logprob - want[len(ids) - 1 + t][gen[t]]) for t, c in enumerate(content))
    assert worst < 1e-3 and all(len(c.top_logprobs) == 3 for c in content)
    assert tokenizer.decode(gen).lstrip(" ").startswith(msg.content[:5])
    stream = list(client.chat.completions.create(model=demo.name, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    assert stream[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in stream) == msg.content
    assert stream[-1].choices[0].finish_reason == r.choices[0].finish_reason


@pytest.mark.parametrize("call, status", [
    (lambda c, m: c.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=1), 404),
    (lambda c, m: c.completions.create(model=m, prompt=[PROMPT] * 65, max_tokens=1), 400),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, n=0), 400),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, n=99), 400),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, stop=["a", "b", "c", "d", "e"]), 400),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, logprobs=6), 400),
    (lambda c, m: c.completions.create(model=m, prompt=[], max_tokens=1), 400),
    (lambda c, m: c.completions.create(model=m, prompt=[[]], max_tokens=1), 400),
    (lambda c, m: c.completions.create(model=m, prompt=[99999], max_tokens=1), 400),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, top_p=0), 400),
    (lambda c, m: c.chat.completions.create(model=m, messages=[{"role": "wizard", "content": "hi"}]), 400),
    (lambda c, m: c.chat.completions.create(model=m, messages=[]), 400),
])
def test_bad_input_is_a_4xx_in_openai_shape(servers, tiny, call, status):
    client, url = servers(tiny)
    with pytest.raises(openai.APIStatusError) as e:
        call(client, tiny.name)
    assert e.value.status_code == status
    err = e.value.response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    # still serving
    assert client.completions.create(model=tiny.name, prompt=PROMPT, max_tokens=1, temperature=0).choices


def test_unknown_route_is_openai_shaped(servers, tiny):
    _, url = servers(tiny)
    r = httpx.get(url + "/engines")
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_url"


# --- the tokenizer routes, as vLLM has them ---

TEXTS = ["The return statement", "héllo wörld 🐍\n\tdef f(x): return x", "<|endoftext|>a", " "]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_and_detokenize_equal_the_tokenizer(servers, demo, text):
    _, url = servers(demo)
    root = url.removesuffix("/v1")
    r = httpx.post(root + "/tokenize", json={"model": demo.name, "prompt": text, "return_token_strs": True})
    assert r.status_code == 200, r.text
    ids = tokenizer.encode(text)
    assert r.json() == {"count": len(ids), "max_model_len": demo.config.n_ctx, "tokens": ids,
                        "token_strs": [tokenizer.token_text(i) for i in ids]}
    back = httpx.post(root + "/detokenize", json={"model": demo.name, "tokens": ids})
    assert back.status_code == 200 and back.json() == {"prompt": tokenizer.decode(ids)}
    assert tokenizer.decode(ids) == text


def test_tokenize_a_chat_and_the_tokenizer_info(servers, demo):
    _, url = servers(demo)
    root = url.removesuffix("/v1")
    messages = [{"role": "user", "content": "What is a list?"}]
    r = httpx.post(root + "/tokenize", json={"model": demo.name, "messages": messages}).json()
    assert r["tokens"] == tokenizer.encode("User: What is a list?\nAssistant:") and r["token_strs"] is None
    info = httpx.get(root + "/tokenizer_info").json()
    assert info["tokenizer_class"] == "GPT2Tokenizer" and info["eos_token"] == "<|endoftext|>"
    assert info["model_max_length"] == demo.config.n_ctx


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, None),
    ("/tokenize", {}, None),
    ("/tokenize", {"prompt": 5}, "prompt"),
    ("/tokenize", {"prompt": "a" * (16 * 1024 + 1)}, "prompt"),
    ("/tokenize", {"prompt": "a", "model": "gpt-4"}, "model"),
    ("/tokenize", {"prompt": "a", "foo": 1}, "foo"),
    ("/detokenize", {"tokens": [50257]}, "tokens"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": "abc"}, "tokens"),
    ("/detokenize", {"tokens": [1] * (16 * 1024 + 1)}, "tokens"),
])
def test_tokenizer_routes_refuse_bad_input_naming_it(servers, demo, path, body, param):
    _, url = servers(demo)
    r = httpx.post(url.removesuffix("/v1") + path, json=body)
    assert r.status_code == (404 if param == "model" else 400), r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"], err


# --- OpenAI's rules: every invalid value and every field not acted on is a 400 naming it ---

TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}
MSG = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("call, param", [
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, logprobs=6), "logprobs"),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, temperature=-1), "temperature"),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, n=0), "n"),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, top_p=1.5), "top_p"),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, extra_body={"foo": 1}), "foo"),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, presence_penalty=0.5),
     "presence_penalty"),
    (lambda c, m: c.completions.create(model=m, prompt=PROMPT, max_tokens=1, logit_bias={"50256": -100}),
     "logit_bias"),
    (lambda c, m: c.chat.completions.create(model=m, messages=MSG, tools=[TOOL]), "tools"),
    (lambda c, m: c.chat.completions.create(model=m, messages=MSG, tool_choice="auto"), "tool_choice"),
    (lambda c, m: c.chat.completions.create(model=m, messages=MSG, response_format={"type": "json_object"}),
     "response_format"),
    (lambda c, m: c.chat.completions.create(model=m, messages=MSG, functions=[TOOL["function"]]), "functions"),
    (lambda c, m: c.chat.completions.create(model=m, messages=MSG, top_logprobs=21, logprobs=True), "top_logprobs"),
    (lambda c, m: c.chat.completions.create(model=m, messages=MSG, extra_body={"best_of": 2}), "best_of"),
    (lambda c, m: c.chat.completions.create(model=m, messages=[{**MSG[0], "name": "ann"}]), "messages"),
    (lambda c, m: c.chat.completions.create(model=m, messages=[{"role": "assistant", "content": "x", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]), "messages"),
])
def test_invalid_or_unsupported_is_a_bad_request_naming_the_field(servers, tiny, call, param):
    client, _ = servers(tiny)
    with pytest.raises(openai.BadRequestError) as e:
        call(client, tiny.name)
    err = e.value.response.json()["error"]
    assert e.value.status_code == 400 and err["type"] == "invalid_request_error" and err["param"] == param, err
    assert param in err["message"]


def test_fields_that_ask_for_nothing_are_honoured_by_doing_nothing(servers, tiny):
    client, _ = servers(tiny)
    plain = client.chat.completions.create(model=tiny.name, messages=MSG, max_tokens=4, temperature=0)
    same = client.chat.completions.create(model=tiny.name, messages=MSG, max_tokens=4, temperature=0,
                                          response_format={"type": "text"}, presence_penalty=0, frequency_penalty=0,
                                          user="someone", tools=[], tool_choice="none", logit_bias={}, store=False)
    assert same.choices[0].message.content == plain.choices[0].message.content
    # an assistant's reply sent back as the SDK returned it (refusal, tool_calls ... all None) continues the chat
    reply = plain.choices[0].message
    assert reply.tool_calls is None and reply.refusal is None
    more = client.chat.completions.create(model=tiny.name, messages=[*MSG, reply, {"role": "user", "content": "Go"}],
                                          max_tokens=2, temperature=0)
    assert more.usage.prompt_tokens == len(tokenizer.encode(
        f"User: Hi\nAssistant: {reply.content}\nUser: Go\nAssistant:"))


def test_the_openapi_document_is_valid_and_describes_v1(servers, tiny):
    """openapi-spec-validator (an independent checker) accepts the document; /v1's operations
    have distinct ids, their request schemas, and the errors the server really answers."""
    from openapi_spec_validator import validate

    _, url = servers(tiny)
    doc = httpx.get(url.removesuffix("/v1") + "/openapi.json").json()
    validate(doc)
    assert doc["servers"][0]["url"] == url.removesuffix("/v1")  # absolute: where the request went
    ops = {(path, m): op for path, item in doc["paths"].items() for m, op in item.items()}
    ids = [op["operationId"] for op in ops.values()]
    assert len(ids) == len(set(ids)), sorted(ids)
    # OpenAI's own operation ids: a client generated from this document names its methods as one
    # generated from OpenAI's (tests/test_openapi_client.py builds one)
    assert {ops[(path, m)]["operationId"] for path, m in (("/v1/models", "get"), ("/v1/models/{model_id}", "get"),
            ("/v1/completions", "post"), ("/v1/chat/completions", "post"))} == {
        "listModels", "retrieveModel", "createCompletion", "createChatCompletion"}
    for path, field in (("/v1/completions", "prompt"), ("/v1/chat/completions", "messages"),
                        ("/tokenize", "prompt"), ("/detokenize", "tokens")):
        op = ops[(path, "post")]
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert field in schema["properties"] and "$ref" not in json.dumps(schema), path
        assert {"200", "400", "404"} <= set(op["responses"]) and "422" not in op["responses"], path
        err = op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        assert set(doc["components"]["schemas"][err]["properties"]) == {"error"}
    # the 200 responses' schemas: real responses are instances of them
    for path, shape in (("/v1/completions", CompletionResponse), ("/v1/chat/completions", ChatResponse)):
        ref = ops[(path, "post")]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/" + shape.__name__)
    r = httpx.post(url + "/completions", json={"prompt": PROMPT, "max_tokens": 2, "logprobs": 1, "echo": True})
    CompletionResponse.model_validate(r.json(), strict=True)
    r = httpx.post(url + "/chat/completions", json={"messages": MSG, "max_tokens": 2, "logprobs": True,
                                                     "top_logprobs": 2})
    ChatResponse.model_validate(r.json(), strict=True)
    ModelList.model_validate(httpx.get(url + "/models").json(), strict=True)
    root = url.removesuffix("/v1")
    TokenizeResponse.model_validate(httpx.post(root + "/tokenize", json={"prompt": PROMPT}).json(), strict=True)
    DetokenizeResponse.model_validate(httpx.post(root + "/detokenize", json={"tokens": [1, 2]}).json(), strict=True)
    # the chat's messages are described in place: role and content
    chat = ops[("/v1/chat/completions", "post")]["requestBody"]["content"]["application/json"]["schema"]
    assert {"role", "content"} <= set(chat["properties"]["messages"]["items"]["properties"])
