"""Several servers over one PostgreSQL, for real (issue 32, item 4): the session's local
PostgreSQL, two ``puffergpt serve --backend pgvector --dsn`` processes on the demo model, and
Debian's HAProxy round-robin in front (tests/cluster.py, docs/deploy.md's configuration).

- a learner's client generates through the balancer; its server is killed with -9 mid-text;
  its next request gets ``text_not_found``; it reopens the text through the balancer and
  continues, with the tokens of a solo numpy run; the sweep then leaves no ``text-``
  namespace behind, the killed server's included, while a text in use survives it;
- the page, in Chromium, carries on after its server is killed: between two actions (the text
  reopened; the tree, the selected token and the open view kept) and in the middle of a
  generation (carried on to the tokens asked for, those of a solo run);
- two servers saving insights into one notebook at once lose none."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from playwright.sync_api import expect

from cluster import Cluster
from puffergpt.model import tokenizer
from puffergpt.model.reference import Reference
from puffergpt.search import load, manifest
from puffergpt.stores.pgvector import PgvectorStore
from test_playground import browser, generated, open_page, shot, wait_idle  # noqa: F401  (browser: a fixture)

TTL_S = 8  # --text-ttl: short, so that the sweep comes within the test; a text in use renews every 2 s
PROMPT = "A young man"  # one of bench_clients' prompts: no <|endoftext|> in its first 24 greedy tokens


@pytest.fixture(scope="module")
def cluster(new_database, demo, tmp_path_factory):
    dsn = new_database()
    store = PgvectorStore(dsn)
    try:
        load.load(store, demo, manifest.model_key(demo.name), progress=False)  # once, before the servers
    finally:
        store.close()
    work = tmp_path_factory.mktemp("cluster")
    args = ["--model", "demo", "--backend", "pgvector", "--dsn", dsn, "--text-ttl", str(TTL_S),
            "--notebook", str(work / "notebook")]
    with Cluster(work, args) as c:
        c.dsn = dsn
        yield c


def text_namespaces(dsn: str) -> set[str]:
    store = PgvectorStore(dsn)
    try:
        return set(store.namespaces("text-"))
    finally:
        store.close()


def sse(lines) -> list[tuple[str, dict]]:
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: ") and name is not None:
            yield name, json.loads(line[6:])
            name = None


def holder(client: httpx.Client) -> str:
    """The server the balancer keeps this client on (its stickiness cookie)."""
    return client.cookies["puffergpt"]


def generate_through(client: httpx.Client, tid: str, n: int, kill=None) -> list[int]:
    """n tokens at temperature 0; ``kill(got)`` after each token may end the server mid-stream."""
    got = []
    try:
        with client.stream("POST", f"/api/texts/{tid}/generate", json={"max_tokens": n, "temperature": 0}) as r:
            assert r.status_code == 200, r.read()
            for name, data in sse(r.iter_lines()):
                assert name != "error", data
                if name == "token":
                    got.append(data["token_id"])
                    if kill is not None:
                        kill(got)
    except httpx.HTTPError:
        assert kill is not None, "the stream broke with no server killed"
    return got


def test_a_learner_continues_on_another_server_after_a_kill(cluster, demo):
    prompt = tokenizer.encode(PROMPT)
    solo = Reference(demo).greedy(prompt, 16)  # the tokens the learner must end with
    with httpx.Client(base_url=cluster.url, timeout=60) as client:
        t = client.post("/api/texts", json={"prompt": PROMPT}).json()
        tokens = prompt + generate_through(client, t["id"], 4)
        dead = holder(client)
        dead_ns = client.get(f"/api/texts/{t['id']}/kv").json()["namespace"]

        def kill(got):  # mid-text: two tokens into the next generation
            if len(got) == 2 and cluster.alive(dead):
                cluster.kill(dead)

        tokens += generate_through(client, t["id"], 8, kill)
        assert not cluster.alive(dead) and len(tokens) > len(prompt) + 4
        # The learner's next request reaches the other server, which does not hold the text.
        r = client.post(f"/api/texts/{t['id']}/generate", json={"max_tokens": 1, "temperature": 0})
        assert r.status_code == 404 and r.json()["error"]["code"] == "text_not_found", r.text
        # Reopened through the balancer from what the learner kept, then carried on.
        body = {"prompt_ids": tokens, "reopen": {"length": len(tokens), "generated": [
            {"position": p, "temperature": 0.0} for p in range(len(prompt), len(tokens))]}}
        t0 = time.perf_counter()
        r = client.post("/api/texts", json=body)
        took = time.perf_counter() - t0
        assert r.status_code == 201, r.text
        again = r.json()
        assert holder(client) != dead and again["reopened"]["read"] == len(tokens)
        print(f"\nreopened a text of {len(tokens)} tokens in {took * 1e3:.0f} ms through the balancer "
              f"(the server's own: {again['reopened']['ms']} ms, {again['reopened']['requests']} requests)")
        tokens += generate_through(client, again["id"], len(prompt) + 16 - len(tokens))
        assert tokens[len(prompt):] == solo, (tokenizer.decode(tokens[len(prompt):]), tokenizer.decode(solo))
        keep_in_use_until_swept(client, cluster.dsn, again["id"], dead_ns)
        assert client.delete(f"/api/texts/{again['id']}").status_code == 200
    assert wait_for(lambda: not text_namespaces(cluster.dsn)), text_namespaces(cluster.dsn)
    cluster.start(dead)  # the page's test needs both


def keep_in_use_until_swept(client: httpx.Client, dsn: str, tid: str, dead_ns: str) -> None:
    """Use the living text while the living server's sweep drops the killed server's keys; it survives."""
    mine = client.get(f"/api/texts/{tid}/kv").json()["namespace"]
    assert dead_ns in text_namespaces(dsn)
    deadline = time.monotonic() + 6 * TTL_S
    while dead_ns in text_namespaces(dsn):
        assert time.monotonic() < deadline, f"{dead_ns} was not swept within {6 * TTL_S} s"
        assert client.get(f"/api/texts/{tid}").status_code == 200  # in use: renewed
        time.sleep(0.5)
    assert mine in text_namespaces(dsn)
    assert client.get(f"/api/texts/{tid}/kv").json()["documents"] > 0


def wait_for(ok, within_s: float = 6 * TTL_S) -> bool:
    deadline = time.monotonic() + within_s
    while not ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def test_the_page_carries_on_after_its_server_is_killed(cluster, browser, demo):  # noqa: F811
    ctx, w = open_page(browser, cluster.url)
    p, server = w.page, None
    try:
        p.fill("#prompt", PROMPT)
        p.fill("#max-tokens", "4")
        p.locator("#temperature").fill("0")
        p.click("#generate")
        wait_idle(p)
        # A branch (the tree forks), a selected token, and its view open.
        generated(p).nth(1).click()
        p.locator("#candidates tbody tr").nth(1).locator("button.branch").click()
        wait_idle(p)
        expect(p.locator("#tree .tree-node")).not_to_have_count(0)
        forks = p.locator("#tree .note").inner_text()
        assert forks.startswith("2 continuations"), forks
        sel = generated(p).nth(2)
        sel_pos = sel.get_attribute("data-position")
        sel.click()
        p.click("#look-inside")
        expect(p.locator("#attention")).not_to_be_empty()
        before = [int(x) for x in p.locator("#tokens .token:not(.ghost)").evaluate_all(
            "els => els.map(e => e.dataset.tokenId)")]
        old_id = p.locator("#tokens").get_attribute("data-text-id")
        server = next(c["value"] for c in ctx.cookies() if c["name"] == "puffergpt")
        cluster.kill(server)
        p.click("#generate")  # carries on: the text reopened on the other server, then 4 more tokens
        wait_idle(p)
        expect(p.locator("#error")).to_be_empty()
        expect(p.locator("#notice")).to_contain_text("reopened")
        expect(p.locator("#tokens")).not_to_have_attribute("data-text-id", old_id)
        after = [int(x) for x in p.locator("#tokens .token:not(.ghost)").evaluate_all(
            "els => els.map(e => e.dataset.tokenId)")]
        assert after[:len(before)] == before and len(after) == len(before) + 4
        assert after[len(before):] == Reference(demo).greedy(before, 4)
        expect(p.locator(f'#tokens .token.selected[data-position="{sel_pos}"]')).to_have_count(1)
        expect(p.locator("#attention")).not_to_be_empty()  # the open view, kept
        assert p.locator("#tree .note").inner_text() == forks
        generated(p).first.click()
        expect(p.locator("#candidates tbody tr")).to_have_count(40)  # the candidates as they came
        shot(p, "playground-reopened-after-a-kill")
        assert not w.errors, w.errors
    finally:
        ctx.close()
        if server is not None and not cluster.alive(server):
            cluster.start(server)


def test_the_page_carries_on_a_generation_whose_server_died_mid_stream(cluster, browser, demo):  # noqa: F811
    for name in cluster.ports:  # both serving: the one the page is on is killed
        if not cluster.alive(name):
            cluster.start(name)
    ctx, w = open_page(browser, cluster.url)
    p, server = w.page, None
    try:
        prompt, n = "A river", 48  # no <|endoftext|> in its first 48 greedy tokens on the demo model
        p.fill("#prompt", prompt)
        p.fill("#max-tokens", str(n))
        p.locator("#temperature").fill("0")
        p.click("#generate")
        generated(p).nth(2).wait_for()  # three tokens in
        server = next(c["value"] for c in ctx.cookies() if c["name"] == "puffergpt")
        cluster.kill(server)
        wait_idle(p)
        expect(p.locator("#error")).to_be_empty()
        expect(p.locator("#notice")).to_contain_text("reopened")
        ids = [int(x) for x in generated(p).evaluate_all("els => els.map(e => e.dataset.tokenId)")]
        assert ids == Reference(demo).greedy(tokenizer.encode(prompt), n)  # as if nothing had happened
        assert not w.errors, w.errors
    finally:
        ctx.close()
        if server is not None and not cluster.alive(server):
            cluster.start(server)


def test_two_servers_saving_into_one_notebook_lose_nothing(cluster):
    n, errors = 6, []

    def save(name: str) -> None:
        with httpx.Client(base_url=cluster.server_url(name), timeout=60) as c:
            for i in range(n):
                r = c.post("/api/insights", json={"title": f"{name} insight {i}", "body": "words"})
                if r.status_code != 201:
                    errors.append(r.text)

    threads = [threading.Thread(target=save, args=(name,)) for name in cluster.ports]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    titles = [i["title"] for i in httpx.get(cluster.url + "/api/insights", timeout=30).json()["insights"]]
    assert sorted(titles) == sorted(f"{s} insight {i}" for s in cluster.ports for i in range(n))
