"""Who may use the server (issue 33, item 1: ``server/auth.py``): with ``--api-key`` every
request under /v1 and every write needs ``Authorization: Bearer KEY`` (401 in OpenAI's
shape on /v1, nothing runs, no commit); reads of the page need none; ``--public-read-only``
generates for anyone and refuses the notebook's writes; ``serve`` on an address other
machines reach refuses to start without a key, ``--public-read-only`` or ``--no-auth``."""

from __future__ import annotations

import subprocess

import click
import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from puffergpt import notebook as nb
from puffergpt.cli import main
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.guards.auth import check_exposure

KEYS = ("first-key-0123", "second-key-4567")
COMPLETION = {"prompt": "hello", "max_tokens": 2, "temperature": 0}
INSIGHT = {"title": "a key saved this", "body": "", "tags": []}


def commits(book) -> int:
    r = subprocess.run(["git", "-C", str(book.path), "rev-list", "--all", "--count"], capture_output=True, text=True)
    return int(r.stdout or 0)


@pytest.fixture(scope="module")
def apps(loaded, tiny, tmp_path_factory):
    """config name -> (TestClient, notebook): keys; public read-only; both."""
    store, key = loaded(tiny)
    engine = open_engine(store, tiny.name, key)
    made = {}
    for name, config in {"keys": ServerConfig(api_keys=KEYS), "read-only": ServerConfig(public_read_only=True),
                         "both": ServerConfig(api_keys=KEYS[:1], public_read_only=True)}.items():
        book = nb.Notebook(tmp_path_factory.mktemp("auth") / "notebook")
        made[name] = (TestClient(create_app(engine, config, notebook=book)).__enter__(), book)
    yield made
    for c, _ in made.values():  # the lifespan's end closes every text (the store is the session's)
        c.__exit__(None, None, None)


def bearer(key: str) -> dict:
    return {"authorization": f"Bearer {key}"}


def test_v1_wants_a_key_in_openais_shape(apps):
    c, _ = apps["keys"]
    for headers in ({}, bearer("not-the-key-000"), {"authorization": f"Basic {KEYS[0]}"}, bearer(KEYS[0] + "x")):
        for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/completions", COMPLETION)):
            r = c.request(method, path, json=body, headers=headers)
            assert r.status_code == 401, (headers, path, r.text)
            assert r.headers["www-authenticate"].startswith("Bearer")
            err = r.json()["error"]
            assert (err["type"], err["code"], err["param"]) == ("invalid_request_error", "invalid_api_key", None), err
            assert "Authorization: Bearer" in err["message"] and KEYS[0] not in err["message"], err
    for k in KEYS:  # either key
        assert c.get("/v1/models", headers=bearer(k)).status_code == 200
        r = c.post("/v1/completions", json=COMPLETION, headers=bearer(k))
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2, r.text
    # the openai SDK, as a client meets it: its own AuthenticationError, then the answer with the key
    import openai

    def sdk(key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{c.base_url}/v1", api_key=key, http_client=c, max_retries=0)

    model = sdk(KEYS[0]).models.list().data[0].id
    with pytest.raises(openai.AuthenticationError) as e:
        sdk("not-the-key-000").completions.create(model=model, **COMPLETION)
    assert e.value.code == "invalid_api_key"
    assert sdk(KEYS[1]).completions.create(model=model, **COMPLETION).usage.completion_tokens == 2


def test_the_openapi_document_says_how_to_send_the_key(apps):
    """With keys, every operation the key guards declares its 401 and a bearer scheme (what a
    GPT action's importer asks for); the page's reads declare neither."""
    doc = apps["keys"][0].get("/openapi.json").json()
    assert doc["components"]["securitySchemes"] == {"apiKey": {"type": "http", "scheme": "bearer"}}
    ops = {(p, m): op for p, item in doc["paths"].items() for m, op in item.items()}
    guarded = {k for k, op in ops.items() if "security" in op}
    open_posts = {("/tokenize", "post"), ("/detokenize", "post")}  # as vLLM: no key outside /v1
    assert guarded == {(p, m) for p, m in ops if m != "get" or p.startswith("/v1")} - open_posts, guarded ^ set(ops)
    assert all("401" in ops[k]["responses"] for k in guarded)
    assert "security" not in ops[("/api/info", "get")] and "401" not in ops[("/api/info", "get")]["responses"]


def test_every_write_wants_the_key_and_reads_of_the_page_do_not(apps):
    c, book = apps["keys"]
    before = commits(book)
    for path, body in (("/api/texts", {"prompt": "hello"}), ("/api/insights", INSIGHT), ("/api/insights/push", {}),
                       ("/api/neighbours", {"word": " man", "k": 3})):
        r = c.post(path, json=body)
        assert r.status_code == 401 and "Authorization: Bearer" in str(r.json()), (path, r.text)
        assert "key field" not in str(r.json()), r.text  # an API client: the header, not the page's field
        page = c.post(path, json=body, headers={"sec-fetch-mode": "cors"})  # a browser's: the page's field
        assert page.status_code == 401 and "key field at the top of the page" in str(page.json()), page.text
    # the tokenizer at the root wants no key, as vLLM's (lm-eval's remote tokenizer sends its own auth_token)
    assert c.post("/tokenize", json={"prompt": "hello"}).json()["count"] == 1
    assert c.post("/detokenize", json={"tokens": [31373]}).json()["prompt"] == "hello"
    assert commits(book) == before and c.get("/api/insights").json()["insights"] == []  # nothing written
    for path in ("/", "/api/info", "/api/status", "/api/insights", "/static/api.js"):
        assert c.get(path).status_code == 200, path
    assert c.get("/api/info").json()["auth"] == {"api_key": True, "public_read_only": False}  # the page asks
    r = c.post("/api/texts", json={"prompt": "hello"}, headers=bearer(KEYS[1]))
    assert r.status_code == 201, r.text
    assert c.delete(f"/api/texts/{r.json()['id']}").status_code == 401
    assert c.delete(f"/api/texts/{r.json()['id']}", headers=bearer(KEYS[1])).status_code == 200
    r = c.post("/api/insights", json=INSIGHT, headers=bearer(KEYS[0]))
    assert r.status_code == 201 and commits(book) == before + 1, r.text


def test_public_read_only_generates_for_anyone_and_writes_no_notebook(apps):
    c, book = apps["read-only"]
    before = commits(book)
    assert c.post("/v1/completions", json=COMPLETION).status_code == 200
    r = c.post("/api/texts", json={"prompt": "hello"})
    assert r.status_code == 201 and c.delete(f"/api/texts/{r.json()['id']}").status_code == 200
    for path, body in (("/api/insights", INSIGHT), ("/api/insights/push", {})):
        r = c.post(path, json=body, headers=bearer(KEYS[0]))  # no key is set: no one writes
        message = str(r.json())  # {"detail"} today; whatever /api's error shape, the words are in it
        assert r.status_code == 403 and "read-only" in message and "--api-key" in message, r.text
    assert commits(book) == before and c.get("/api/insights").status_code == 200
    assert c.get("/api/info").json()["auth"] == {"api_key": False, "public_read_only": True}
    # with a key too: anyone generates, the key's holder writes
    c, book = apps["both"]
    assert c.post("/v1/completions", json=COMPLETION).status_code == 200
    assert c.post("/api/insights", json=INSIGHT).status_code == 401
    assert c.post("/api/insights", json=INSIGHT, headers=bearer(KEYS[0])).status_code == 201


def test_mcp_server_sends_the_key(apps):
    """`puffergpt mcp --server URL --api-key KEY` drives a server started with that key."""
    from puffergpt.mcp.server import Remote, RemoteError
    from puffergpt.model.sampling import Sampling
    from puffergpt.server.app import serving

    c, _ = apps["keys"]
    with serving(c.app) as url:
        with pytest.raises(RemoteError, match="401"):
            Remote(url).generate("hello", 2, Sampling(0.0, 5, None), 3)
        got = Remote(url, api_key=KEYS[1]).generate("hello", 2, Sampling(0.0, 5, None), 3)
        assert len(got["steps"]) == 2, got


@pytest.mark.parametrize("args, env, words", [
    (["--host", "0.0.0.0"], {}, ["reachable from other machines", "--api-key", "--public-read-only", "--no-auth"]),
    (["--host", "192.168.1.20", "--no-auth", "--api-key", KEYS[0]], {}, ["can't go with"]),
    (["--host", "0.0.0.0", "--api-key", "short"], {}, ["at least 8 characters"]),
    (["--host", "0.0.0.0"], {"PUFFERGPT_API_KEY": f"{KEYS[0]}, has space"}, ["PUFFERGPT_API_KEY", "without spaces"]),
])
def test_serve_on_an_open_address_without_a_key_refuses_to_start(args, env, words):
    r = CliRunner().invoke(main, ["serve", "--model", "demo", *args], env={"PUFFERGPT_DATA": None, **env})
    assert r.exit_code == 2 and all(w in r.output for w in words), r.output
    assert "Traceback" not in r.output and "loading" not in r.output  # refused before anything loads


def test_workers_serve_with_the_keys_and_hosts_given():
    """serve --workers N: each worker's config is the parent's, through its stdin's JSON."""
    import json
    from dataclasses import asdict

    from puffergpt.server.processes.workers import worker_config

    config = ServerConfig(api_keys=KEYS, public_read_only=True, trusted_hosts=("127.0.0.1", "host.docker.internal"),
                          cors_origins=("http://localhost:3000",))
    assert worker_config(json.loads(json.dumps(asdict(config)))) == config


def test_what_may_serve_where():
    for host in ("127.0.0.1", "127.0.0.5", "localhost", "::1", "[::1]"):
        check_exposure(host, (), False, False)  # loopback: anyone here is the user
    for ok in ((KEYS, False, False), ((), True, False), ((), False, True)):
        check_exposure("0.0.0.0", *ok)
    with pytest.raises(ValueError, match="reachable from other machines"):
        check_exposure("puffer.example.org", (), False, False)


def test_serve_reads_its_keys_from_a_file_never_its_command_line(tmp_path, monkeypatch):
    """--api-key-file PATH (issue 43): keys one a line, comments left out, beside --api-key; an open
    address with only the file is served with its keys; a file that can't serve says why, no key shown."""
    import puffergpt.cli.serving as serving_cli
    import puffergpt.server.guards.auth as auth

    seen = []

    def exposure(host, keys, *rest):
        seen.append(keys)
        return check_exposure(host, keys, *rest)

    def stop(model):  # after the keys are read and checked: before anything loads
        raise click.UsageError("stopped here")

    monkeypatch.setattr(auth, "check_exposure", exposure)
    monkeypatch.setattr(serving_cli, "resolve_model", stop)
    f = tmp_path / "keys"
    f.write_text(f"# the team's keys\n{KEYS[0]}\n\n  {KEYS[1]}  \n")
    f.chmod(0o600)
    env = {"PUFFERGPT_DATA": None, "PUFFERGPT_API_KEY": None}
    r = CliRunner().invoke(main, ["serve", "--host", "0.0.0.0", "--api-key-file", str(f)], env=env)
    assert "stopped here" in r.output and seen == [tuple(KEYS[:2])], r.output  # an open address, served with them
    other = "third-key-89ab"
    r = CliRunner().invoke(main, ["serve", "--api-key", other, "--api-key-file", str(f)], env=env)
    assert seen[-1] == (other, *KEYS[:2]), r.output
    for text, words in (("# none\n", "holds no key"), ("shortkey\nabc\n", "at least 8 characters"),
                        (None, "can't read")):
        bad = tmp_path / "bad"
        bad.unlink(missing_ok=True)
        if text is not None:
            bad.write_text(text)
        r = CliRunner().invoke(main, ["serve", "--api-key-file", str(bad)], env=env)
        assert r.exit_code == 2 and "--api-key-file" in r.output and words in r.output, r.output
        assert "abc" not in r.output  # never a key itself
