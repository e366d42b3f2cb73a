"""Probe the HTTP API with bad input and count the answers: 4xx (refused with a message),
5xx (the server's fault), hangs (no answer in 10 s). Loopback only: the app runs in
this process under Starlette's TestClient, on a tiny random model.

    .venv/bin/python scripts/probe_server.py

Some values in the list are valid for some fields (0, None for an optional field, a list
of token ids as a prompt): those are accepted and listed; every other probe must get a
4xx, none a 5xx or a hang, and the server must still answer after each.
"""

from __future__ import annotations

import itertools
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, TimeoutError
from pathlib import Path

from fastapi.testclient import TestClient

from puffergpt import checkpoints, loading
from puffergpt.engine import Engine
from puffergpt.reference import NumpyProducts
from puffergpt.server import ServerConfig, create_app
from puffergpt.stores import open_store

BAD_VALUES = [None, True, -1, 0, 1.5, 1e400, float("nan"), float("inf"), "x", "\ud800", [], {}, [1], "a" * 70_000]
FIELDS = {
    "/api/texts": {"prompt": "hi"},
    "/api/texts/{id}/generate": {"max_tokens": 2, "temperature": 0, "top_k": 5, "seed": 1, "lens_k": 5},
    "/api/texts/{id}/append": {"text": "more"},
    "/api/texts/{id}/step_back": {"position": 1},
    "/api/texts/{id}/cut": {"position": 1},
    "/api/texts/{id}/branch": {"position": 1, "rank": 0},
    "/api/compare": {"prompt": "hi", "top_k": 5},
    "/api/analogy": {"a": " man", "b": " woman", "c": " king", "k": 3},
    "/api/neighbours": {"word": " man", "k": 3},
    "/api/map": {"words": [" man", " woman"]},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2, "temperature": 0, "top_k": 5, "n": 1, "logprobs": 1},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}
GETS = ["/api/texts/nope", "/api/texts/{id}/steps/0/inspect", "/api/texts/{id}/steps/999/inspect",
        "/api/texts/{id}/steps/1/inspect?lens_k=0", "/api/texts/{id}/steps/x/inspect", "/static/%00",
        "/static/../server/app.py", "/v1/models/other-model"]


def dumps(body) -> bytes:
    return json.dumps(body, allow_nan=True).replace("Infinity", "1e400").encode()  # 1e400 parses as inf: not JSON's


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="puffergpt-probe-"))
    ckpt = checkpoints.load(str(checkpoints.make_model(tmp / "tiny", "tiny", 0)))
    store = open_store("embedded", tmp / "data")
    loading.load(store, ckpt, loading.model_key(ckpt.name), progress=False)
    app = create_app(Engine(store, ckpt.name), ServerConfig(max_open_texts=8), reference=lambda: NumpyProducts(ckpt))
    counts = {"4xx": 0, "5xx": 0, "2xx": 0, "hang": 0}
    wrong = []
    pool = ThreadPoolExecutor(1)
    with TestClient(app, raise_server_exceptions=False) as c:
        tid = c.post("/api/texts", json={"prompt": "hello there"}).json()["id"]
        c.post(f"/api/texts/{tid}/generate", json={"max_tokens": 2, "temperature": 0})  # read whole: two tokens

        def send(method, path, body=None):
            path = path.replace("{id}", tid)
            f = pool.submit(lambda: c.request(method, path, content=None if body is None else dumps(body),
                                              headers={"content-type": "application/json"}))
            try:
                r = f.result(timeout=10)
            except TimeoutError:
                counts["hang"] += 1
                wrong.append((method, path, body, "hang"))
                return
            k = f"{r.status_code // 100}xx"
            counts[k] = counts.get(k, 0) + 1
            if k != "4xx":
                wrong.append((method, path, str(body)[:80], r.status_code, r.text[:120]))
            assert c.get("/api/info").status_code == 200, "the server stopped answering"

        for path, good in FIELDS.items():
            for field, value in itertools.product(list(good) + ["unknown_field"], BAD_VALUES):
                body = {**good, field: value}
                if field == "unknown_field" and path.startswith("/v1"):
                    continue  # OpenAI clients send fields we don't use: ignored by design
                send("POST", path, body)
            send("POST", path, [good])  # not an object
        for path in GETS:
            send("GET", path)
        before = len(app.state.texts)
    t = time.strftime("%Y-%m-%d %H:%M")
    print(f"{t}: {sum(counts.values())} inputs: {counts['4xx']} refused (4xx), {counts['5xx']} 5xx, "
          f"{counts['hang']} hangs, {counts.get('2xx', 0)} accepted (values that are valid for their field, "
          f"e.g. 0 tokens, a seed of 0, token ids as a prompt: listed below); {before} texts open at the end")
    for w in wrong:
        print("  accepted:" if w[-2] == 200 or w[-2] == 201 else "  WRONG:", w)
    store.close()


if __name__ == "__main__":
    main()
