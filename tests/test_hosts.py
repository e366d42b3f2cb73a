"""Which Host headers the server answers (issue 33, item 3: ``server/hosts.py``): on a
loopback address its own names only (no DNS rebinding), and those ``--allowed-host`` adds:
``Host: host.docker.internal`` (Open WebUI in Docker) is answered with the flag, and refused
without it with a 400 naming the flag."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from puffergpt.cli import main
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.guards.hosts import trusted_hosts

DOCKER = "host.docker.internal"


@pytest.fixture(scope="module")
def engine(loaded, tiny):
    store, key = loaded(tiny)
    return open_engine(store, tiny.name, key)


def client(engine, allowed: tuple[str, ...], host: str) -> TestClient:
    names = trusted_hosts("127.0.0.1", allowed)  # what serve --host 127.0.0.1 --allowed-host ... trusts
    return TestClient(create_app(engine, ServerConfig(trusted_hosts=names)), base_url=f"http://{host}")


def test_host_docker_internal_is_answered_with_the_flag_only(engine):
    with client(engine, (), f"{DOCKER}:8000") as c:
        r = c.get("/v1/models")
        assert r.status_code == 400, r.text
        err = r.json()["error"]  # OpenAI's shape on /v1, naming the flag
        assert err["code"] == "invalid_host" and "--allowed-host" in err["message"] and DOCKER in err["message"]
        assert c.post("/api/texts", json={"prompt": "hi"}).status_code == 400
    with client(engine, (DOCKER,), f"{DOCKER}:8000") as c:
        assert c.get("/v1/models").status_code == 200
        r = c.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
    for host in ("127.0.0.1:8000", "localhost:8000", "[::1]:8000"):  # its own names still
        with client(engine, (DOCKER,), host) as c:
            assert c.get("/api/info").status_code == 200, host
    with client(engine, (DOCKER,), "evil.example") as c:  # and nothing else
        assert c.get("/api/info").status_code == 400


def test_which_names_are_trusted_where():
    assert trusted_hosts("0.0.0.0", ()) is None  # an open address: any Host, unless names are given
    assert trusted_hosts("0.0.0.0", ("Puffer.Example.org:443",)) == ("127.0.0.1", "localhost", "::1",
                                                                     "puffer.example.org")
    assert DOCKER in trusted_hosts("127.0.0.1", (DOCKER,))


@pytest.mark.parametrize("value", ["http://host.docker.internal", "*.example.org", "a.example/path", ""])
def test_a_bad_allowed_host_is_refused_naming_the_form(value):
    r = CliRunner().invoke(main, ["serve", "--model", "demo", "--allowed-host", value], env={"PUFFERGPT_DATA": None})
    assert r.exit_code == 2 and "host name or address" in r.output and "Traceback" not in r.output, r.output
