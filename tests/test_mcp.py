"""``puffergpt mcp`` driven by the official MCP SDK's client over stdio, as an assistant
would: the tools listed, a greedy generation checked against the numpy reference, a look
inside, insights saved (each one git commit) and replayed; the same through a running
``serve`` (``--server URL``)."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import numpy as np
import pytest
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters

import puffergpt
from puffergpt import notebook as nb
from puffergpt.app.protocol import MAX_NEW_TOKENS
from puffergpt.mcp import server as mcp_server
from puffergpt.model import tokenizer
from puffergpt.model.reference import Reference
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import serving

PROMPT = "The cat sat on the"
N = 5
TOOLS = {"generate", "inspect", "save_insight", "list_insights", "replay_insight", "list_lessons", "run_lesson"}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def mcp_session(args: list[str], script) -> dict:
    """Start ``puffergpt mcp ARGS`` through the SDK's stdio client, run ``script(client)`` on it."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "puffergpt.cli", "mcp", *args])

    async def main():
        async with Client(params) as client:
            return await script(client)

    return anyio.run(main)


async def call(client, tool: str, **arguments) -> dict:
    r = await client.call_tool(tool, arguments)
    assert not r.is_error, (tool, r.content)
    return r.structured_content


async def error(client, tool: str, **arguments) -> str:
    r = await client.call_tool(tool, arguments)
    assert r.is_error, (tool, r.structured_content)
    return " ".join(c.text for c in r.content)


def reference_greedy(ckpt, ids: list[int], n: int) -> list[int]:
    out = Reference(ckpt).greedy(ids, n)
    return out[:out.index(tokenizer.EOT) + 1] if tokenizer.EOT in out else out  # generation stops after it


async def tour(client, ckpt, model: str) -> dict:
    """Every tool once, checked; returns what the caller checks against its notebook."""
    assert {t.name for t in (await client.list_tools()).tools} >= TOOLS
    ids = tokenizer.encode(PROMPT)
    g = await call(client, "generate", prompt=PROMPT, max_tokens=N, temperature=0, candidates=5)
    want = reference_greedy(ckpt, ids, N)
    assert g["tokens"] == want and g["text"] == tokenizer.decode(want) and g["prompt_ids"] == ids
    ref = Reference(ckpt).logits(ids + want[:-1])  # (T, V): the logits each step chose from
    diffs = []
    for step in g["steps"]:
        row = ref[step["position"] - 1]
        best = np.argsort(-row)[:5]
        assert [c["token_id"] for c in step["candidates"]] == best.tolist()
        diffs += [abs(c["logit"] - row[c["token_id"]]) for c in step["candidates"]]
    assert max(diffs) < 1e-3, f"candidates' logits differ from numpy's by up to {max(diffs):.3g}"

    p = g["steps"][0]["position"]
    got = await call(client, "inspect", text_id=g["text_id"], position=p, lens_k=3)
    att = np.array(got["attention"])  # (n_layer, n_head, p)
    assert att.shape == (ckpt.config.n_layer, ckpt.config.n_head, p)
    assert np.abs(att.sum(-1) - 1).max() < 1e-4  # each head's weights are a softmax over 0..p-1
    assert got["final_top1"]["token_id"] == want[0] and len(got["lens"]) >= ckpt.config.n_layer
    assert got["searches"] > 0 and "attribution" in got

    too_many = await error(client, "generate", prompt=PROMPT, max_tokens=MAX_NEW_TOKENS + 1)
    assert "max_tokens: Input should be less than or equal to 512" in too_many and "pydantic" not in too_many
    assert "no open text 'nope'" in await error(client, "inspect", text_id="nope", position=1)
    assert "the title is empty" in await error(client, "save_insight", title="   ")

    chat = await call(client, "save_insight", title="Greedy is argmax", body="At temperature 0 the best logit wins.",
                      tags=["sampling"])
    first = g["steps"][0]
    evidence = {"kind": "candidates", "model": model, "prompt_ids": ids + want, "position": p, "token_id": want[0],
                "sampling": {"temperature": 0.0, "top_k": 40, "seed": None},
                "candidates": [{"token_id": c["token_id"], "logit": c["logit"]} for c in first["candidates"]]}
    page = await call(client, "save_insight", title="The first step", body="", tags=[], evidence=evidence)
    listed = (await call(client, "list_insights"))["insights"]
    assert {i["id"] for i in listed} == {page["id"], chat["id"]}  # saved in the same second: either order
    assert [i["id"] for i in (await call(client, "list_insights", query="ARGMAX"))["insights"]] == [chat["id"]]
    nothing = await call(client, "replay_insight", insight_id=chat["id"])
    assert nothing["replayable"] is False and nothing["reason"] == nb.NOTHING_TO_REPLAY
    replayed = await call(client, "replay_insight", insight_id=page["id"])
    assert replayed["matches"] and replayed["max_abs_diff"] <= nb.TOLERANCE
    assert "no insight 'nope'" in await error(client, "replay_insight", insight_id="nope")
    listed = await call(client, "list_lessons")
    assert len(listed["lessons"]) >= 5 and {"id", "title", "steps"} <= set(listed["lessons"][0])
    ran = await call(client, "run_lesson", lesson_id="temperature", prompt=PROMPT)
    assert ran["prompt"] == PROMPT and len(ran["steps"]) == 3
    assert all(isinstance(x["holds"], bool) and x["claim"] and x["view"] for x in ran["steps"])
    assert "there is no lesson 'nope'" in await error(client, "run_lesson", lesson_id="nope")
    return {"chat": chat, "page": page}


def check_commits(book: Path, saved: dict) -> None:
    """Each save is one commit holding its file."""
    assert git(book, "rev-list", "--count", "HEAD").strip() == "2"
    for s in saved.values():
        assert git(book, "show", "--format=", "--name-only", s["commit"]).split() == [s["path"]]
    assert (book / saved["chat"]["path"]).read_text().startswith("---\nversion: 2\n")


def test_mcp_over_stdio_with_its_own_store(tmp_path, tiny, tiny_dir):
    book = tmp_path / "notebook"
    args = ["--data", str(tmp_path / "data"), "--model", str(tiny_dir), "--notebook", str(book)]
    saved = mcp_session(args, lambda c: tour(c, tiny, str(tiny_dir)))
    check_commits(book, saved)
    assert saved["chat"]["file"] == str(book / saved["chat"]["path"])


def test_mcp_through_a_running_server(tmp_path, tiny, loaded):
    store, key = loaded(tiny)
    book = nb.Notebook(tmp_path / "notebook")
    engine = open_engine(store, tiny.name, key)
    with serving(create_app(engine, ServerConfig(), notebook=book)) as base:
        saved = mcp_session(["--server", base], lambda c: tour(c, tiny, engine.model))
    check_commits(book.path, saved)


def test_mcp_refuses_server_with_a_model_of_its_own():
    cmd = [sys.executable, "-m", "puffergpt.cli", "mcp", "--server", "http://127.0.0.1:1", "--model", "demo"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode != 0 and r.stdout == "" and "leave out --model" in r.stderr
    assert "Traceback" not in r.stderr  # one clear line


# --- text ids checked and escaped before any URL is built (issue 31) ---

BAD_TEXT_IDS = {  # id -> what the error names
    "../insights?q=x#": "'../insights?q=x#'",
    "\x00": "'\\x00'",
    "a" * 100_000: "(100,000 characters)",
    "0123456789AB": "'0123456789AB'",  # upper case: not what generate makes
    "": "''",
}


def remote_with(handler) -> mcp_server.Remote:
    """A Remote whose HTTP goes to ``handler`` (httpx's mock transport), not a socket."""
    r = mcp_server.Remote("http://127.0.0.1:8000")
    r.http.close()
    r.http = httpx.Client(base_url=r.url, transport=httpx.MockTransport(handler))
    return r


def test_remote_checks_a_text_id_before_building_a_url():
    seen = []
    remote = remote_with(lambda request: seen.append(request) or httpx.Response(200, json={"insights": []}))
    for bad, named in BAD_TEXT_IDS.items():
        with pytest.raises(ValueError, match="no open text") as e:
            remote.inspect(bad, 1, 5)
        assert named in str(e.value) and len(str(e.value)) < 300, str(e.value)[:300]
    assert seen == []  # no request went out: no other route answered for an inspection


def test_remote_escapes_each_path_segment():
    """An id the server hands back goes into the next URL as one segment, whatever it holds."""
    paths = []

    def handler(request: httpx.Request) -> httpx.Response:
        paths.append(request.url.raw_path.decode())
        if request.url.path == "/api/texts":
            return httpx.Response(200, json={"id": "../insights?q=x#", "tokens": [{"token_id": 464}]})
        return httpx.Response(200, text="event: done\ndata: {}\n\n")

    remote_with(handler).generate("The", 1, mcp_server.Sampling(0.0, 1), 1)
    assert paths == ["/api/texts", "/api/texts/..%2Finsights%3Fq%3Dx%23/generate"]


def test_bad_text_ids_are_tool_errors_through_a_running_server(tmp_path, tiny, loaded):
    """The probe's case: ``inspect`` with ``../insights?q=x#`` answered the notebook's list
    as a successful inspection; ``\\x00`` and 100,000 characters a bare "Error executing tool"."""
    store, key = loaded(tiny)
    book = nb.Notebook(tmp_path / "notebook")
    book.save("Listed", "", [])
    engine = open_engine(store, tiny.name, key)

    async def script(client):
        out = {}
        for bad in BAD_TEXT_IDS:
            r = await client.call_tool("inspect", {"text_id": bad, "position": 1})
            out[bad] = (r.is_error, " ".join(c.text for c in r.content), r.structured_content)
        return out

    with serving(create_app(engine, ServerConfig(), notebook=book)) as base:
        got = mcp_session(["--server", base], script)
    for bad, named in BAD_TEXT_IDS.items():
        is_error, text, structured = got[bad]
        assert is_error and "no open text" in text and named in text, (bad[:50], text[:300], structured)
        assert "Listed" not in text  # the notebook's list never answers an inspection


# --- the tools as a client sees them (issue 33): strict, described, annotated, versioned ---

READ_ONLY = {"generate": True, "inspect": True, "list_insights": True, "replay_insight": True, "save_insight": False,
             "list_lessons": True, "run_lesson": True}


def in_process(backend, script) -> dict:
    """``script(client)`` on the SDK's client connected in-process to our server over ``backend``."""
    async def main():
        async with Client(mcp_server.make_server(backend)) as client:
            return await script(client)

    return anyio.run(main)


def test_tools_are_strict_described_annotated_and_versioned():
    """No model needed: the schemas, descriptions and argument errors come before any backend
    (here a server at the discard port, which nothing reaches)."""
    async def script(client):
        tools = {t.name: t for t in (await client.list_tools()).tools}
        bad = {"bogus": await error(client, "generate", prompt=PROMPT, bogus=1),
               "bounds": await error(client, "generate", prompt=PROMPT, max_tokens=0, temperature="hot"),
               "missing": await error(client, "save_insight", tags=[""])}
        return client.server_info, tools, bad

    info, tools, bad = in_process(mcp_server.Remote("http://127.0.0.1:9"), script)
    assert info.name == "puffergpt" and info.version == puffergpt.__version__ != ""
    assert set(tools) == TOOLS
    for name, t in tools.items():
        assert t.input_schema["additionalProperties"] is False, (name, t.input_schema)
        assert t.description == inspect.cleandoc(t.description), name
        assert not [line for line in t.description.splitlines() if line[:1].isspace()], (name, t.description)
        assert t.annotations.read_only_hint is READ_ONLY[name], (name, t.annotations)
    assert tools["save_insight"].annotations.destructive_hint is False  # a commit added, nothing lost
    assert "generate: bogus: generate takes no such argument (it takes prompt, max_tokens," in bad["bogus"]
    assert "max_tokens: Input should be greater than or equal to 1" in bad["bounds"] and "temperature:" in bad["bounds"]
    assert "title: Field required" in bad["missing"] and "tags.0:" in bad["missing"]
    for said in bad.values():
        assert "pydantic" not in said and "For further information" not in said and "\n" not in said, said


ENDS = ("The cat sat on the mat.", 9)  # the demo model at temperature 1, top_k 40, seed 9: it writes <|endoftext|>


def test_generate_ends_at_endoftext_as_v1_does(loaded, demo, tmp_path):
    """The same seed through /v1/completions and MCP's generate (through a running serve):
    the same tokens, ending with <|endoftext|>, and the same text and finish_reason, with no
    literal <|endoftext|> in it."""
    store, key = loaded(demo)
    prompt, seed = ENDS
    with serving(create_app(open_engine(store, demo.name, key), ServerConfig())) as base:
        v1 = httpx.post(f"{base}/v1/completions", json={"model": "demo", "prompt": prompt, "max_tokens": 24,
                                                        "temperature": 1, "top_k": 40, "seed": seed}, timeout=120)
        got = in_process(mcp_server.Remote(base), lambda c: call(c, "generate", prompt=prompt, max_tokens=24,
                                                                 temperature=1, top_k=40, seed=seed))
    (choice,) = v1.json()["choices"]
    assert got["tokens"][-1] == tokenizer.EOT and len(got["tokens"]) < 24, "seed 9 no longer ends: choose another"
    assert got["tokens"][:-1] == tokenizer.encode(got["text"]) and "<|endoftext|>" not in got["text"]
    assert (got["text"], got["finish_reason"]) == (choice["text"], choice["finish_reason"]) == (got["text"], "stop")
    assert v1.json()["usage"]["completion_tokens"] == len(got["tokens"])
