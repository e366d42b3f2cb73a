"""`puffergpt bench --clients N`: learners against a real server on 127.0.0.1 (the demo model in
an embedded store), their tokens together and solo against the numpy reference, every error
reported, bad inputs refused with a message. No timing is asserted: speed lives in
benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import socket
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

from puffergpt.bench import clients as bc
from puffergpt.cli import main
from puffergpt.model import tokenizer
from puffergpt.model.reference import NumpyWeights, Reference
from puffergpt.model.sampling import Sampling
from puffergpt.model.session import Run
from puffergpt.search.manifest import open_engine
from puffergpt.server import ServerConfig, create_app
from puffergpt.server.app import serving
from puffergpt.texts.text import opened


@pytest.fixture(scope="module")
def served(loaded, demo):
    """The demo model served by ``server.app.serving`` (uvicorn in a thread), as the bench serves it: its URL."""
    store, key = loaded(demo)
    with serving(create_app(open_engine(store, demo.name, key), ServerConfig())) as url:
        yield url


def reference_greedy(ckpt, prompt: str, n: int) -> list[int]:
    """numpy's greedy tokens, ending at <|endoftext|> as a text's generation does."""
    out = Reference(ckpt).greedy(tokenizer.encode(prompt), n)
    return out[:out.index(tokenizer.EOT) + 1] if tokenizer.EOT in out else out


def test_learners_together_are_solo_and_the_numpy_reference(served, demo):
    report = bc.run(served, bc.Plan(clients=3, tokens=4))
    assert report["errors"] == [] and report["ended_early"] == []
    assert report["outputs"] == {"equal": 3, "of": 3, "first_difference": None}
    assert {"speedup", "first_token_worst_together_vs_median_solo", "targets", "machine", "model"} <= set(report)
    assert report["model"] == "demo" and report["clients"] == 3 and report["tokens"] == 4
    for phase in ("solo", "together"):
        p = report[phase]
        assert p["tokens"] == 12 and p["wall_s"] > 0 and p["tokens_per_s"] > 0
        assert p["first_token_s"]["of"] == 3 and p["first_token_s"]["worst"] >= p["first_token_s"]["median"] > 0
        assert p["first_token_from_open_s"]["median"] >= p["first_token_s"]["median"]  # opening the text comes first
        assert [r["learner"] for r in p["runs"]] == [0, 1, 2]
    for s, t in zip(report["solo"]["runs"], report["together"]["runs"], strict=True):
        want = reference_greedy(demo, s["prompt"], 4)
        assert s["token_ids"] == t["token_ids"] == want, s["prompt"]
        assert s["text"] == tokenizer.decode(want) and s["error"] is None
    assert len({r["prompt"] for r in report["solo"]["runs"]}) == 3  # a prompt a learner
    shown = bc.table(report)
    assert "outputs equal to solo: 3/3" in shown and "errors: none" in shown
    json.dumps(report)  # what --json writes


def test_seeded_sampling_together_is_solo_and_the_numpy_sampler(served, demo):
    report = bc.run(served, bc.Plan(clients=2, tokens=3, temperature=0.8, seed=7))
    assert report["outputs"]["equal"] == 2 and report["errors"] == []
    for r in report["together"]["runs"]:
        i = r["learner"]
        with opened(lambda: Run(NumpyWeights(demo)), tokenizer.encode(r["prompt"])) as text:
            want = [st.token_id for st in text.generate(3, Sampling(0.8, 40, 7 + i))]
        assert r["token_ids"] == want, r["prompt"]


def test_the_prompts_are_distinct_and_the_demo_model_continues_them(demo):
    assert len(set(bc.PROMPTS)) == len(bc.PROMPTS) == bc.MAX_CLIENTS
    for prompt in bc.PROMPTS[:8]:  # the 8 learners: none ends before 24 tokens
        assert tokenizer.EOT not in Reference(demo).greedy(tokenizer.encode(prompt), 24), prompt


def test_errors_are_reported_not_hidden(loaded, demo, monkeypatch):
    """A server whose limit is under what the learners ask: every refusal is in the report."""
    store, key = loaded(demo)
    app = create_app(open_engine(store, demo.name, key), ServerConfig(max_new_tokens=2))
    monkeypatch.setattr(bc.Plan, "check", lambda self, info: None)  # past the bench's own check
    with serving(app) as url:
        report = bc.run(url, bc.Plan(clients=2, tokens=3))
    assert report["outputs"]["equal"] == 0 and report["outputs"]["first_difference"]["learner"] == 0
    errors = report["errors"]
    assert [(e["phase"], e["learner"]) for e in errors] == [("solo", 0), ("solo", 1), ("together", 0), ("together", 1)]
    assert all("400" in e["error"] and "over this server's limit of 2" in e["error"] for e in errors)
    assert "errors: 4" in bc.table(report) and report["together"]["tokens"] == 0


def test_a_text_that_could_not_be_closed_is_reported(served, monkeypatch):
    real = bc.call

    def no_close(conn, server, method, path, body=None, jar=None):
        if method == "DELETE":
            raise bc.Refused(f"{method} {path}", 503, b'{"error": {"message": "the store failed"}}')
        return real(conn, server, method, path, body, jar)

    monkeypatch.setattr(bc, "call", no_close)
    plan = bc.Plan(clients=1, tokens=2)
    run = bc.learn(bc.Server.of(served), plan, 0)
    assert run.error is None and len(run.token_ids) == 2  # its tokens came: they count
    assert run.close_error.startswith("closing the text: DELETE /api/texts/")
    assert "503 the store failed" in run.close_error
    report = bc.report_of(bc.Server.of(served), "at --url", {"model": "demo", "backend": "embedded"}, plan,
                          {"solo": [run], "together": [run]}, {}, [0.0, 0.0, 0.0])
    assert [e["error"] for e in report["errors"]] == [run.close_error] * 2 and report["outputs"]["equal"] == 1


def test_a_stream_without_done_is_an_error(monkeypatch):
    """A stream cut short, or one whose done disagrees with the tokens that came, is reported."""
    run = bc.Run(0, "A man")
    monkeypatch.setattr(bc, "events", lambda *a: iter([("token", {"token_id": 5})]))
    assert bc.generate(None, None, "/x", {}, run, lambda: None) == "the stream ended without a done event"
    run = bc.Run(0, "A man")
    monkeypatch.setattr(bc, "events", lambda *a: iter([("token", {"token_id": 5}), ("done", {"tokens": 2})]))
    assert bc.generate(None, None, "/x", {}, run, lambda: None) == "done says 2 tokens, 1 token events came"


def test_the_cli_starts_its_own_server_with_workers_and_stops_it(tmp_path, tiny_dir, tiny):
    """Its own server is `puffergpt serve` in a process of its own, here with 2 worker
    processes behind its front: the learners' tokens are numpy's, the texts were spread over
    both workers, and nothing of the server outlives the bench."""
    out = tmp_path / "clients.json"
    r = CliRunner().invoke(main, ["bench", "--clients", "2", "--tokens", "3", "--model", str(tiny_dir),
                                  "--data", str(tmp_path / "data"), "--json", str(out), "--workers", "2"])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    assert report["server"] == "`puffergpt serve` started by bench, 2 worker processes"
    assert report["errors"] == [] and report["server_status"]["after_together"]["workers"] == 2
    assert report["outputs"]["equal"] == 2
    for run in report["together"]["runs"]:
        assert run["token_ids"] == reference_greedy(tiny, run["prompt"], 3)
    assert "together vs one after another" in r.output and "outputs equal to solo: 2/2" in r.output
    left = subprocess.run(["pgrep", "-f", f"serve --model {tiny_dir}"], capture_output=True, text=True).stdout
    assert left == "", f"the bench's own server outlived it: {left}"
    assert not (tmp_path / "data" / "puffergpt.lock").exists() or try_lock(tmp_path / "data" / "puffergpt.lock")


def try_lock(path) -> bool:
    """True if no process holds the data directory's lock any more."""
    import fcntl

    with open(path) as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False


def test_the_cli_against_a_url(served, tmp_path):
    out = tmp_path / "url.json"
    r = CliRunner().invoke(main, ["bench", "--clients", "2", "--tokens", "2", "--url", served, "--json", str(out)])
    assert r.exit_code == 0, r.output
    report = json.loads(out.read_text())
    assert report["url"] == served.rstrip("/") + "/" and report["server"] == "at --url"
    assert report["outputs"]["equal"] == 2 and np.isfinite(report["speedup"])


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once the socket is closed


@pytest.mark.parametrize("args, message", [
    (["--clients", "0"], "--clients must be in 1..64, got 0"),
    (["--clients", "65"], "--clients must be in 1..64, got 65"),
    (["--clients", "2", "--tokens", "0"], "0 is not in the range x>=1"),
    (["--clients", "2", "--temperature", "0.5"], "needs --seed"),
    (["--clients", "2", "--url", "ftp://example.org/"], "is not a server's address"),
    (["--clients", "2", "--quick"], "--quick is for the engines' bench, not --clients"),
    (["--clients", "2", "--backends", "embedded,pgvector"], "one server on one backend"),
    (["--tokens", "4"], "--tokens goes with --clients"),
    (["--clients", "2", "--url", "{served}", "--model", "demo"], "--model sets up the server bench starts itself"),
    (["--clients", "2", "--url", "{served}", "--workers", "2"], "--workers sets up the server bench starts itself"),
    (["--clients", "2", "--workers", "0"], "--workers takes 1..64 processes"),
    (["--clients", "2", "--workers", "many"], "--workers takes a number of processes"),
    (["--workers", "2"], "--workers goes with --clients"),
    (["--clients", "2", "--url", "{served}", "--tokens", "513"], "over this server's limit of 512"),
    (["--clients", "2", "--url", "{served}", "--tokens", "300"], "context of 256 tokens: use --tokens 254 or fewer"),
    (["--clients", "40", "--url", "{served}"], "holds at most 32: use fewer --clients"),
    (["--clients", "2", "--url", "http://127.0.0.1:{closed}/"], "could not reach a puffergpt server"),
])
def test_bad_inputs_are_refused_with_a_message(served, args, message):
    args = [a.format(served=served, closed=closed_port()) for a in args]
    r = CliRunner().invoke(main, ["bench", *args])
    assert r.exit_code != 0 and message in r.output, r.output
    assert "Traceback" not in r.output
