"""EleutherAI's lm-eval (``local-completions``) against a running server, offline: its
tokenizer comes from the server (``/tokenizer_info``, ``/tokenize``, ``/detokenize``, found by
itself: no tokenizer argument), its task is a local jsonl (tests/data/lm_eval_task), and every
log-likelihood it scores is compared with transformers' log-softmax of the same checkpoint,
continuations ending in ``<|endoftext|>`` and one after which the greedy token is
``<|endoftext|>`` (lm-eval reads ``token_logprobs[ctxlen:-1]``: the generated token must be there).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from puffergpt.model import tokenizer
from test_openai import servers  # noqa: F401  (the fixture: one uvicorn thread a model)

torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is in the test extra: make test installs it")

TASK_DIR = Path(__file__).parent / "data" / "lm_eval_task"
TASK = "puffergpt_local"


def hf_loglikelihood(m, context: str, continuation: str) -> tuple[float, bool]:
    """(sum of log-softmax of the continuation's tokens given the context, all of them greedy),
    the tokens split as lm-eval splits them (LM._encode_pair): the context's trailing whitespace
    moved to the continuation, then encode(context + continuation) past encode(context)."""
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    ctx = tokenizer.encode(context)
    whole = tokenizer.encode(context + continuation)
    assert whole[: len(ctx)] == ctx, f"{context!r} does not tokenize as a prefix"
    with torch.no_grad():  # (T,) -> (T, V): row t predicts token t + 1
        lp = torch.log_softmax(m(torch.tensor([whole])).logits[0].double(), -1).numpy()
    rows = lp[len(ctx) - 1: len(whole) - 1]  # (n_cont, V)
    cont = whole[len(ctx):]
    return float(sum(r[t] for r, t in zip(rows, cont, strict=True))), all(
        int(np.argmax(r)) == t for r, t in zip(rows, cont, strict=True))


def test_lm_eval_loglikelihoods_equal_transformers(servers, demo, hf, monkeypatch, tmp_path):  # noqa: F811
    import datasets
    import huggingface_hub
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    # offline: nothing may reach the Hugging Face hub (the variables, and the flags the libraries
    # already imported have read from them); datasets' cache in tmp_path
    for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(k, "1")
    for mod, flag in ((datasets.config, "HF_DATASETS_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE"),
                      (huggingface_hub.constants, "HF_HUB_OFFLINE")):
        monkeypatch.setattr(mod, flag, True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path))
    monkeypatch.chdir(TASK_DIR)  # the YAML's data_files is relative

    _, url = servers(demo)
    lm = LocalCompletionsAPI(base_url=f"{url}/completions", model=demo.name, batch_size=4)
    assert lm.tokenizer_backend == "remote", "lm-eval did not find /tokenizer_info and /tokenize"
    out = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=str(TASK_DIR)),
                                  log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0)

    docs = [json.loads(line) for line in (TASK_DIR / "docs.jsonl").read_text().splitlines()]
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    assert len(samples) == len(docs)
    worst = 0.0
    for s, doc in zip(samples, docs, strict=True):
        assert tuple(s["arguments"][0]) == (doc["context"], doc["continuation"])
        got, got_greedy = s["resps"][0][0]
        want, want_greedy = hf_loglikelihood(hf(demo), doc["context"], doc["continuation"])
        assert got < 0 and want < 0, f"doc {s['doc_id']}: {got} / {want}: a token dropped?"
        assert got_greedy == want_greedy, f"doc {s['doc_id']}: is_greedy {got_greedy}, transformers {want_greedy}"
        worst = max(worst, abs(got - want))
    assert worst < 1e-4, f"lm-eval's log-likelihoods differ from transformers' by {worst:.2e}"
    # doc 0 is the issue's case: transformers' greedy token after "The return statement" is
    # <|endoftext|>, which the echo must carry, or lm-eval's [ctxlen:-1] drops " statement"
    with torch.no_grad():
        nxt = hf(demo)(torch.tensor([tokenizer.encode("The return statement")])).logits[0, -1]
    assert int(nxt.argmax()) == tokenizer.EOT, "doc 0 no longer ends where the model writes <|endoftext|>"
    assert out["results"][TASK]["acc,none"] == np.mean([s["acc"] for s in samples])
    print(f"lm-eval vs transformers: {len(samples)} log-likelihoods, max difference {worst:.2e}")


@pytest.fixture
def keyed(loaded, demo):
    """A server over the demo model that wants a key (serve --api-key), on a free port: (url, key)."""
    import threading
    import time

    import uvicorn

    from puffergpt.search.manifest import open_engine
    from puffergpt.server import ServerConfig, create_app
    from test_openai import _free_port

    key = "lm-eval-key-0123"
    store, model_key = loaded(demo)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(open_engine(store, demo.name, model_key),
                                                     ServerConfig(api_keys=(key,))),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}", key
    server.should_exit = True
    thread.join(10)


def test_lm_eval_with_a_key_as_the_docs_say(keyed, demo, hf, monkeypatch, tmp_path):
    """``OPENAI_API_KEY=K lm_eval --model local-completions --model_args base_url=...,max_length=256``
    against ``serve --api-key K``: lm-eval's remote tokenizer sends no key (only its own auth_token)
    and, as on vLLM, the tokenizer routes want none; /v1 takes the key from OPENAI_API_KEY."""
    import datasets
    import httpx
    import huggingface_hub
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    for k in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(k, "1")
    for mod, flag in ((datasets.config, "HF_DATASETS_OFFLINE"), (datasets.config, "HF_HUB_OFFLINE"),
                      (huggingface_hub.constants, "HF_HUB_OFFLINE")):
        monkeypatch.setattr(mod, flag, True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path))
    monkeypatch.chdir(TASK_DIR)
    url, key = keyed
    assert httpx.post(f"{url}/v1/completions", json={"prompt": "a", "max_tokens": 1}).status_code == 401
    monkeypatch.setenv("OPENAI_API_KEY", key)
    lm = LocalCompletionsAPI(base_url=f"{url}/v1/completions", model=demo.name, batch_size=4, max_length=256)
    assert lm.tokenizer_backend == "remote", "lm-eval did not reach /tokenizer_info and /tokenize without a key"
    out = lm_eval.simple_evaluate(model=lm, tasks=[TASK], task_manager=TaskManager(include_path=str(TASK_DIR)),
                                  log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0)
    samples = sorted(out["samples"][TASK], key=lambda s: s["doc_id"])
    docs = [json.loads(line) for line in (TASK_DIR / "docs.jsonl").read_text().splitlines()]
    assert len(samples) == len(docs)
    for s, doc in zip(samples[:3], docs, strict=False):
        got, _ = s["resps"][0][0]
        want, _ = hf_loglikelihood(hf(demo), doc["context"], doc["continuation"])
        assert abs(got - want) < 1e-4
    # a wrong key is still refused on /v1, whatever the tokenizer routes allow
    monkeypatch.setenv("OPENAI_API_KEY", "not-the-key-000")
    wrong = httpx.post(f"{url}/v1/completions", json={"prompt": "a", "max_tokens": 1},
                       headers={"Authorization": "Bearer not-the-key-000"})
    assert wrong.status_code == 401 and "Authorization: Bearer KEY" in wrong.json()["error"]["message"]
    assert "key field" not in wrong.json()["error"]["message"]  # that is the page's, not an API client's
