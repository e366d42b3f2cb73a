"""The command line: the `generate --json` contract on both engines, bad input as a
clear one-line error (never a traceback), and make-model."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from puffergpt.cli import main
from puffergpt.model import checkpoints, hub, tokenizer
from puffergpt.model.reference import Reference

PROMPT = "Hello world, this is"
ENGINES = ["reference", "search"]


@pytest.fixture(scope="module")
def cli_ckpt(tmp_path_factory) -> Path:
    """A tiny checkpoint (n_ctx 128, full GPT-2 vocabulary), made once for this module."""
    return checkpoints.make_model(tmp_path_factory.mktemp("cli-ckpt") / "tiny", "tiny", seed=5)


@pytest.fixture(scope="module")
def cli_data(tmp_path_factory, cli_ckpt) -> Path:
    """A data directory with the tiny checkpoint loaded, by `puffergpt load`."""
    data = tmp_path_factory.mktemp("cli-data")
    r = run("load", "--model", str(cli_ckpt), "--data", str(data))
    assert r.exit_code == 0, r.output
    assert "documents" in r.stdout and "ready" in r.stdout
    return data


@pytest.fixture(scope="module")
def greedy(cli_ckpt):
    """The numpy reference's greedy continuation of PROMPT."""
    ref = Reference(checkpoints.load(str(cli_ckpt)))
    return lambda n: ref.greedy(tokenizer.encode(PROMPT), n)


def run(*args: str, env: dict | None = None):
    # PUFFERGPT_DATA from the environment must not point the tests at a user's store.
    return CliRunner().invoke(main, list(args), env={"PUFFERGPT_DATA": None, **(env or {})})


def engine_args(engine: str, ckpt: Path, data: Path | None) -> list[str]:
    args = ["--model", str(ckpt), "--engine", engine]
    return args + ["--data", str(data)] if engine == "search" else args


def generate_json(engine, ckpt, data, *args, prompt=PROMPT) -> tuple[list[dict], dict]:
    r = run("generate", prompt, *engine_args(engine, ckpt, data), "--json", *args)
    assert r.exit_code == 0, r.output
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert "summary" in lines[-1] and len(lines[-1]) == 1, lines[-1]
    assert all("summary" not in line for line in lines[:-1])
    return lines[:-1], lines[-1]["summary"]


def assert_clear_error(r, *words: str) -> None:
    """A non-zero exit with one clear message and no traceback."""
    assert r.exit_code != 0, r.output
    assert isinstance(r.exception, SystemExit), f"unhandled {type(r.exception).__name__}: {r.exception}"
    assert "Traceback" not in r.output
    assert "Error:" in r.output
    for w in words:
        assert w in r.output, f"{w!r} not in {r.output!r}"


@pytest.fixture
def engine_data(request, cli_ckpt):
    """(engine, data dir) for each engine; the search engine's store is loaded first."""
    engine = request.param
    return engine, request.getfixturevalue("cli_data") if engine == "search" else None


# --- the --json contract ----------------------------------------------------------------------

@pytest.mark.parametrize("engine_data", ENGINES, indirect=True)
def test_generate_json_contract(engine_data, cli_ckpt):
    engine, data = engine_data
    n, k = 4, 5
    tokens, summary = generate_json(engine, cli_ckpt, data, "-n", str(n), "--top-k", str(k), "--seed", "1")
    prompt_ids = tokenizer.encode(PROMPT)
    assert len(tokens) == n
    for i, t in enumerate(tokens):
        assert set(t) == {"position", "token_id", "text", "candidates", "requests", "round_trips", "ms"}
        assert t["position"] == len(prompt_ids) + i
        assert t["text"] == tokenizer.token_text(t["token_id"])
        assert isinstance(t["requests"], int) and isinstance(t["ms"], (int, float)) and t["ms"] >= 0
        c = t["candidates"]
        assert len(c) == k
        assert all(set(x) == {"token_id", "text", "logit", "prob", "p_all", "p_all_t"} for x in c)
        # p_all: over the whole vocabulary (transformers' in test_writes.py): at most the top k's share of 1,
        # and the sampler's prob is it renormalised over the top k
        p_all = np.array([x["p_all"] for x in c])
        assert 0 < p_all.sum() <= 1 + 1e-9 and np.allclose(p_all / p_all.sum(), [x["prob"] for x in c])
        assert all(x["text"] == tokenizer.token_text(x["token_id"]) for x in c)
        assert len({x["token_id"] for x in c}) == k
        logits = [x["logit"] for x in c]
        assert logits == sorted(logits, reverse=True), "candidates are best first"
        probs = [x["prob"] for x in c]
        assert sum(probs) == pytest.approx(1.0, abs=1e-6)
        assert all(0 < p < 1 for p in probs)  # temperature 1: every candidate has a chance
        assert probs == sorted(probs, reverse=True)
        assert t["token_id"] in {x["token_id"] for x in c}
    assert summary["engine"] == engine and summary["model"] == str(cli_ckpt)
    assert summary["prompt_tokens"] == len(prompt_ids) and summary["new_tokens"] == n
    usage_fields = {"tokens", "requests", "round_trips", "bytes", "ms", "cost_usd"}
    assert set(summary["prefill"]) == usage_fields == set(summary["decode"])
    assert summary["prefill"]["tokens"] == len(prompt_ids)
    assert summary["decode"]["tokens"] == n - 1
    assert summary["decode"]["requests"] == sum(t["requests"] for t in tokens[1:])
    if engine == "search":
        assert summary["backend"] == "embedded"
        assert summary["prefill"]["requests"] > 0 and all(t["requests"] > 0 for t in tokens)
        # the prefill: reading the prompt, then the top-k search
        assert tokens[0]["requests"] == summary["prefill"]["requests"]
    else:
        assert summary["backend"] is None
        assert summary["prefill"]["requests"] == 0 and all(t["requests"] == 0 for t in tokens)


@pytest.mark.parametrize("engine_data", ENGINES, indirect=True)
def test_temperature_0_is_the_reference_greedy(engine_data, cli_ckpt, greedy):
    engine, data = engine_data
    n, k = 6, 3
    tokens, summary = generate_json(engine, cli_ckpt, data, "-n", str(n), "--temperature", "0", "--top-k", str(k))
    assert [t["token_id"] for t in tokens] == greedy(n)
    for t in tokens:
        assert t["token_id"] == t["candidates"][0]["token_id"]
        assert [x["prob"] for x in t["candidates"]] == [1.0] + [0.0] * (k - 1)


def test_engines_agree_on_logits(cli_ckpt, cli_data):
    ref, _ = generate_json("reference", cli_ckpt, None, "-n", "2", "--temperature", "0", "--top-k", "10")
    srch, _ = generate_json("search", cli_ckpt, cli_data, "-n", "2", "--temperature", "0", "--top-k", "10")
    for a, b in zip(ref, srch, strict=True):
        assert [x["token_id"] for x in a["candidates"]] == [x["token_id"] for x in b["candidates"]]
        np.testing.assert_allclose([x["logit"] for x in a["candidates"]], [x["logit"] for x in b["candidates"]],
                                   atol=1e-4)


@pytest.mark.parametrize("engine_data", ENGINES, indirect=True)
def test_same_seed_same_tokens(engine_data, cli_ckpt):
    engine, data = engine_data
    n = 4 if engine == "search" else 6

    def ids(seed):
        tokens, _ = generate_json(engine, cli_ckpt, data, "-n", str(n), "--temperature", "1", "--seed", str(seed))
        return [t["token_id"] for t in tokens]

    first = ids(7)
    assert len(first) == n
    assert ids(7) == first
    assert ids(8) != first  # the seed does matter (40 near-equal candidates, several draws)


def test_plain_output_is_prompt_then_continuation(cli_ckpt, greedy):
    r = run("generate", PROMPT, "--model", str(cli_ckpt), "--engine", "reference", "-n", "5", "--temperature", "0")
    assert r.exit_code == 0, r.output
    # Tokens are written as they come, through an incremental UTF-8 decoder: the same text as decode().
    assert r.stdout == PROMPT + tokenizer.decode(greedy(5)) + "\n"
    assert "prefill: " in r.stderr and "decode: 4 tokens" in r.stderr


def test_zero_new_tokens(cli_ckpt):
    tokens, summary = generate_json("reference", cli_ckpt, None, "-n", "0")
    assert tokens == []
    assert summary["new_tokens"] == 0 and summary["decode"]["tokens"] == 0


def test_prompt_that_exactly_fills_the_context(cli_ckpt):
    prompt = " a" * 120  # 120 tokens; 8 more reach the context of 128
    assert len(tokenizer.encode(prompt)) == 120
    tokens, _ = generate_json("reference", cli_ckpt, None, "-n", "8", "--temperature", "0", prompt=prompt)
    assert [t["position"] for t in tokens] == list(range(120, 128))


# --- bad input ------------------------------------------------------------------------------

LONG = " a" * 130  # 130 tokens > tiny's context of 128


@pytest.mark.parametrize("args, words", [
    (["", "--engine", "reference"], ["prompt is empty"]),
    ([LONG, "--engine", "reference"], ["context of 128"]),
    ([" a" * 100, "--engine", "reference", "-n", "40"], ["140 tokens", "context of 128"]),
    (["hi", "--engine", "reference", "-n", "-1"], ["-n must be >= 0"]),
    (["hi", "--engine", "reference", "--temperature", "-1"], ["temperature"]),
    (["hi", "--engine", "reference", "--temperature", "nan"], ["temperature"]),
    (["hi", "--engine", "reference", "--top-k", "0"], ["top_k", "50257"]),
    (["hi", "--engine", "reference", "--top-k", "50258"], ["top_k", "50257"]),
    (["hi", "--engine", "reference", "--top-k", "many"], ["--top-k"]),
])
def test_bad_generate_input(cli_ckpt, args, words):
    r = run("generate", *args, "--model", str(cli_ckpt))
    assert_clear_error(r, *words)


@pytest.mark.parametrize("args, words", [
    ([LONG], ["context of 128"]),
    (["hi", "--top-k", "50258"], ["top_k"]),
])
def test_bad_generate_input_search_engine(cli_ckpt, cli_data, args, words):
    r = run("generate", *args, "--model", str(cli_ckpt), "--data", str(cli_data))
    assert_clear_error(r, *words)


@pytest.mark.parametrize("engine", ENGINES)
def test_unknown_model(engine, tmp_path):
    r = run("generate", "hi", "--model", "nope", "--engine", engine, "--data", str(tmp_path / "data"))
    assert_clear_error(r, "unknown model 'nope'", "demo")
    assert not (tmp_path / "data").exists()  # said so before opening a store


def test_model_directory_that_is_not_a_checkpoint(tmp_path):
    d = tmp_path / "not-a-checkpoint"
    d.mkdir()
    (d / "README").write_text("hello")
    r = run("generate", "hi", "--model", str(d), "--engine", "reference")
    assert_clear_error(r, "not a checkpoint", "config.json")
    r = run("load", "--model", str(d), "--data", str(tmp_path / "data"))
    assert_clear_error(r, "not a checkpoint")
    r = run("generate", "hi", "--model", str(d), "--data", str(tmp_path / "data"))
    assert_clear_error(r)


def test_model_that_is_a_file(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"\0" * 16)
    for engine in ENGINES:
        r = run("generate", "hi", "--model", str(f), "--engine", engine, "--data", str(tmp_path / "data"))
        assert_clear_error(r, "is a file")


def test_search_engine_loads_on_first_use(cli_ckpt, tmp_path, greedy):
    """As serve does: a model not in the store yet is loaded, then used."""
    r = run("generate", PROMPT, "--model", str(cli_ckpt), "--data", str(tmp_path / "empty-data"), "--json",
            "--temperature", "0", "-n", "4")
    assert r.exit_code == 0, r.output
    assert "not loaded" in r.stderr and "loading it now" in r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [t["token_id"] for t in lines[:-1]] == greedy(4)


def test_analogy_and_replay_load_the_model_on_first_use(cli_ckpt, tmp_path):
    """Every command that computes opens its model one way (cli.options.open_model): on an empty
    data directory, analogy and `notebook replay --engine search` load the model as generate
    does, then answer as numpy does."""
    from puffergpt import notebook as nb
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.session import Run
    from test_notebook import step_evidence

    ckpt = checkpoints.load(str(cli_ckpt))
    r = run("analogy", " man", " woman", " king", "--model", str(cli_ckpt), "--data", str(tmp_path / "a"),
            "-k", "3", "--json")
    assert r.exit_code == 0, r.output
    assert "loading it now" in r.stderr
    assert [x["token_id"] for x in json.loads(r.stdout)["results"]] == numpy_analogy(cli_ckpt, 3)[0]

    data = tmp_path / "b"
    evidence = step_evidence(Run(NumpyWeights(ckpt)), str(cli_ckpt), n=1)  # recorded on numpy, replayed on searches
    ins = nb.Notebook(data / "notebook").save("First use", "", [], evidence)
    r = run("notebook", "replay", ins.id, "--data", str(data), "--engine", "search", "--json")
    assert r.exit_code == 0, r.output
    assert "loading it now" in r.stderr
    out = json.loads(r.stdout)
    assert out["matches"] and out["max_abs_diff"] <= nb.TOLERANCE, out


def test_data_that_cannot_be_a_directory(cli_ckpt, tmp_path):
    f = tmp_path / "a-file"
    f.write_text("x")
    for data in (f, f / "below"):
        r = run("generate", "hi", "--model", str(cli_ckpt), "--data", str(data))
        assert_clear_error(r, "data directory", "--data")
        r = run("load", "--model", str(cli_ckpt), "--data", str(data))
        assert_clear_error(r, "data directory")
    assert f.read_text() == "x"


def test_generate_ablate_and_versus_refuse_by_name(cli_ckpt):
    """A part the model lacks, a part misspelt, a token id outside the vocabulary: one line naming it."""
    args = ["--model", str(cli_ckpt), "--engine", "reference", "-n", "1"]
    assert_clear_error(run("generate", PROMPT, *args, "--ablate", "mlp 0", "--ablate", "attn 2.0"),
                       "--ablate: 'attn 2.0' is not in this model", "layers 0..1", "heads 0..3")
    assert_clear_error(run("generate", PROMPT, *args, "--ablate", "L2 H0"), "'L2 H0' is not a part", "'attn L.H'")
    assert_clear_error(run("generate", PROMPT, *args, "--json", "--inspect", "--versus", "50257"),
                       "--versus: token id 50257 is outside the vocabulary")
    assert_clear_error(run("generate", PROMPT, *args, "--versus", "5"), "--versus", "--json --inspect")
    r = run("generate", PROMPT, *args, "--ablate", "attn 1.3", "--temperature", "0")
    assert r.exit_code == 0, r.output
    assert "[switched off at every position: attn 1.3]" in r.stderr


def test_gpt2_offline_names_the_alternatives(monkeypatch, tmp_path):
    import huggingface_hub

    def unreachable(*a, **kw):
        raise OSError("network unreachable")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    monkeypatch.setattr(hub, "default_cache_dir", lambda: tmp_path / "cache")
    r = run("generate", "hi", "--model", "gpt2", "--engine", "reference")
    assert_clear_error(r, "could not download", "--model demo", "make-model")


def test_bad_input_in_a_real_process(tmp_path):
    exe = Path(sys.executable).with_name("puffergpt")
    if not exe.exists():
        exe = Path(shutil.which("puffergpt") or "puffergpt")
    f = tmp_path / "a-file"
    f.write_text("x")
    env = {k: v for k, v in os.environ.items() if k != "PUFFERGPT_DATA"}
    p = subprocess.run([str(exe), "generate", "hi", "--model", str(tmp_path), "--data", str(f)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    assert p.stderr.startswith("Error: ") and "is not a checkpoint" in p.stderr
    assert p.stdout == ""


# --- make-model -----------------------------------------------------------------------------

def test_make_model_writes_a_loadable_checkpoint(tmp_path):
    out = tmp_path / "out"
    r = run("make-model", str(out), "--preset", "tiny", "--seed", "3")
    assert r.exit_code == 0, r.output
    assert str(out) in r.stdout and "seed 3" in r.stdout
    ck = checkpoints.load(str(out))
    assert ck.config == checkpoints.PRESETS["tiny"]
    want = checkpoints.random_params(checkpoints.PRESETS["tiny"], 3)
    assert set(ck.params) == set(want)
    for k, v in want.items():
        np.testing.assert_array_equal(ck.params[k], v, err_msg=k)


def test_make_model_into_a_non_empty_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    r = run("make-model", str(out), "--preset", "tiny")
    assert_clear_error(r, "not empty")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    assert (out / "notes.txt").read_text() == "keep me"


def test_make_model_unknown_preset(tmp_path):
    r = run("make-model", str(tmp_path / "out"), "--preset", "huge")
    assert r.exit_code == 2 and "Traceback" not in r.output and "huge" in r.output
    assert not (tmp_path / "out").exists()


def test_generate_while_serve_holds_the_data_says_where_the_server_is(tmp_path):
    """The embedded store is one process's: a command that finds `serve` holding the data
    directory says so, with the server's URL and how to ask it instead. Here `serve` runs 2
    worker processes (they open the directory beside it), and none outlives its SIGTERM."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k != "PUFFERGPT_DATA"}
    server = subprocess.Popen([sys.executable, "-m", "puffergpt.cli", "serve", "--model", "demo", "--data", str(data),
                               "--port", str(port), "--workers", "2"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/info", timeout=2).read()
                break
            except OSError:
                assert server.poll() is None, server.stdout.read()
                assert time.monotonic() < deadline, "serve did not come up"
                time.sleep(0.5)
        status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status", timeout=5).read())
        assert status["workers"] == 2, status
        workers = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True, text=True).stdout.split()
        assert len(workers) == 2, workers
        r = run("generate", "hi", "--model", "demo", "--data", str(data))
        assert_clear_error(r, "in use by another puffergpt process", f"pid {server.pid}", "puffergpt serve",
                           f"http://127.0.0.1:{port}/v1/completions")
    finally:
        server.terminate()
        server.wait(timeout=30)
    left = [w for w in workers if os.path.exists(f"/proc/{w}") and "zombie" not in open(f"/proc/{w}/status").read()]
    assert left == [], f"workers outlived serve: {left}"
    # SIGTERM ends serve as Ctrl-C does: its workers stopped first, serving.json removed
    assert server.returncode == 143
    assert not (data / "serving.json").exists()
    # a serving.json left behind (a server killed) names a pid that no longer holds the
    # directory: it is ignored, and the store opens
    (data / "serving.json").write_text(json.dumps({"url": f"http://127.0.0.1:{port}/", "pid": server.pid}))
    r = run("generate", "hi", "--model", "demo", "--data", str(data), "-n", "2")
    assert r.exit_code == 0, r.output


def numpy_analogy(ckpt_dir: Path, k: int) -> tuple[list[int], np.ndarray]:
    """" man" : " woman" :: " king" : ?, in numpy on the checkpoint: the k token ids nearest by
    cosine to wte[B] - wte[A] + wte[C], A, B and C excluded, and every token's cosine."""
    w = checkpoints.load(str(ckpt_dir)).params["wte.weight"].astype(np.float64)
    a, b, c = (tokenizer.encode(x)[0] for x in (" man", " woman", " king"))
    v = w[b] - w[a] + w[c]
    sims = w @ v / (np.linalg.norm(w, axis=1) * np.linalg.norm(v))
    return [int(i) for i in np.argsort(-sims, kind="stable") if int(i) not in (a, b, c)][:k], sims


def test_analogy_json_equals_numpy(cli_ckpt, cli_data):
    """`analogy A B C --json`: the k tokens nearest by cosine to wte[B] - wte[A] + wte[C],
    A, B and C excluded, as numpy finds them on the checkpoint."""
    r = run("analogy", " man", " woman", " king", "--model", str(cli_ckpt), "--data", str(cli_data), "-k", "5",
            "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)["results"]
    want, sims = numpy_analogy(cli_ckpt, 5)
    assert [x["token_id"] for x in got] == want
    assert np.abs(np.array([x["score"] for x in got]) - sims[want]).max() < 1e-4
    assert set(got[0]) >= {"token_id", "text", "score"}
    text = run("analogy", " man", " woman", " king", "--model", str(cli_ckpt), "--data", str(cli_data), "-k", "3")
    assert text.exit_code == 0 and "is to" in text.stdout and len(text.stdout.splitlines()) == 5, text.output
    assert "note: how often each token was seen in training is unknown" in text.stdout  # a made model: no counts


@pytest.mark.parametrize("args, words", [
    (["man", "queen", " king"], ["'queen' is 2 GPT-2 tokens", "' queen' is one token"]),
    ([" man", " woman", " king", "-k", "0"], ["-k"]),
    ([" man", " woman", " king", "-k", "101"], ["-k"]),
    ([" man", " woman"], ["Missing argument"]),
])
def test_analogy_bad_input(cli_ckpt, cli_data, args, words):
    r = run("analogy", *args, "--model", str(cli_ckpt), "--data", str(cli_data))
    assert r.exit_code != 0 and "Traceback" not in r.output, r.output
    for w in words:
        assert w in r.output, (w, r.output)


@pytest.mark.parametrize("command", ["serve", "mcp"])
def test_a_notebook_that_cannot_be_opened_is_named_and_frees_the_store(tmp_path, cli_ckpt, cli_data, command):
    """serve and mcp open the model and the notebook the same way (options.open_served): a
    notebook path that is a file is refused with the option to change, and the store is closed
    again, so the next command opens it."""
    not_a_folder = tmp_path / "notes.txt"
    not_a_folder.write_text("a file, not a notebook")
    r = run(command, "--model", str(cli_ckpt), "--data", str(cli_data), "--notebook", str(not_a_folder))
    assert r.exit_code != 0, r.output
    assert "choose another with --notebook DIR" in r.output, r.output
    again = run("generate", PROMPT, "--model", str(cli_ckpt), "--data", str(cli_data), "-n", "1")
    assert again.exit_code == 0, again.output


@pytest.mark.parametrize("bad", ["0", "65", "two"])
def test_serve_refuses_a_bad_workers(bad):
    r = run("serve", "--model", "demo", "--workers", bad)
    assert r.exit_code == 2 and "--workers" in r.output and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("bad", ["0", "1001", "many"])
def test_serve_refuses_a_bad_max_running(bad):
    """The bound on texts generating at once is 1..1000, refused before anything opens."""
    r = run("serve", "--model", "demo", "--max-running", bad)
    assert r.exit_code == 2 and "--max-running" in r.output and "Traceback" not in r.output, r.output
