"""turbopuffer end to end, on the local emulator (tests/tpuf_emulator.py, not the service):
the CLI loads the demo model and generates the reference's greedy tokens and logits; a
model of GPT-2's depth loads completely; 429s, 5xxs and a dropped connection are survived."""

import json
import uuid

import pytest
from click.testing import CliRunner

from puffergpt.cli import main
from puffergpt.model import checkpoints
from puffergpt.model.checkpoints import GPT2Config
from puffergpt.search import load, verify
from puffergpt.stores.base import StoreError
from puffergpt.stores.turbopuffer import TurbopufferStore
from tpuf_emulator import running

PROMPT = "The list"


@pytest.fixture(autouse=True)
def no_service_settings(monkeypatch):
    for var in ("TURBOPUFFER_REGION", "TURBOPUFFER_BASE_URL"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def emu():
    with running() as e:
        yield e
        assert e.internal_errors == [] and e.limit_errors == []  # the store never broke a limit


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    """GPT-2's 12 layers at small widths (and a 300-token vocabulary), random weights."""
    c = GPT2Config(n_vocab=300, n_ctx=32, n_embd=16, n_layer=12, n_head=2)
    return checkpoints.load(
        str(checkpoints.save_dir(tmp_path_factory.mktemp("deep") / "deep", c, checkpoints.random_params(c, 4)))
    )


def store_on(emu, prefix=None, **settings) -> TurbopufferStore:
    return TurbopufferStore(emu.api_key, base_url=emu.url, prefix=prefix or f"t{uuid.uuid4().hex[:6]}-", **settings)


def generate(env, engine: str) -> list[dict]:
    r = CliRunner().invoke(main, ["generate", PROMPT, "--model", "demo", "--engine", engine, "--backend", "turbopuffer",
                                  "--temperature", "0", "--top-k", "40", "-n", "6", "--json"], env=env)
    assert r.exit_code == 0, r.output
    return [json.loads(line) for line in r.stdout.splitlines()][:-1]


def test_cli_load_and_greedy_generate_on_turbopuffer_equal_the_reference(emu):
    from helpers import assert_close

    env = {"TURBOPUFFER_API_KEY": emu.api_key, "TURBOPUFFER_BASE_URL": emu.url, "PUFFERGPT_DATA": None}
    r = CliRunner().invoke(main, ["load", "--model", "demo", "--backend", "turbopuffer"], env=env)
    assert r.exit_code == 0 and "ready" in r.stdout, r.output
    got, want = generate(env, "search"), generate(env, "reference")
    assert [t["token_id"] for t in got] == [t["token_id"] for t in want]
    for a, b in zip(got, want, strict=True):
        assert [c["token_id"] for c in a["candidates"]] == [c["token_id"] for c in b["candidates"]]
        assert_close(
            "turbopuffer top-40 logits",
            [c["logit"] for c in a["candidates"]],
            [c["logit"] for c in b["candidates"]],
            1e-3,
        )


def test_a_model_of_gpt2s_depth_loads_completely(emu, deep):
    from puffergpt.model.reference import Reference
    from puffergpt.model.sampling import Sampling
    from puffergpt.search.manifest import open_engine
    from puffergpt.texts.text import Text

    s = store_on(emu)
    m = load.load(s, deep, "deep", progress=False)
    assert len(json.dumps(m)) > 4096 and len(json.dumps(s.get_meta("loading:deep"))) > 4096  # over a filterable value
    assert m["complete"] and verify.verify(s, m) == {}
    text = Text(open_engine(s, deep.name, "deep").open())
    text.append([5, 17, 42])
    assert [t.token_id for t in text.generate(4, Sampling(0, 5))] == Reference(deep).greedy([5, 17, 42], 4)
    text.close()


def test_429_and_5xx_are_retried_with_backoff(emu, deep):
    s = store_on(emu)
    emu.inject(429, kind="write", after=3)
    emu.inject(503, kind="query", after=5)
    m = load.load(s, deep, "deep", progress=False)
    assert verify.verify(s, m) == {}
    for status in (429, 503):
        i = next(i for i, e in enumerate(emu.log) if e["status"] == status)
        failed, retry = emu.log[i], emu.log[i + 1:]
        again = next(e for e in retry if e["path"] == failed["path"] and e["retry"] == 1)
        assert again["status"] == 200 and again["t"] - failed["t"] >= 0.15  # waited before trying again


def test_a_dropped_connection_mid_load_then_a_rerun_gives_the_same_manifest(emu, deep):
    clean = load.load(store_on(emu), deep, "deep", progress=False)
    prefix = f"t{uuid.uuid4().hex[:6]}-"
    emu.inject("drop", kind="write", after=20, count=10**6)  # the network goes, for good
    with pytest.raises(StoreError, match="can't reach turbopuffer"):
        load.load(store_on(emu, prefix, max_retries=1), deep, "deep", progress=False)
    emu.clear_faults()
    s = store_on(emu, prefix)
    assert s.get_meta("manifest:deep")["complete"] is False  # it stopped half-way
    again = load.load(s, deep, "deep", progress=False)
    assert again == clean and verify.verify(s, again) == {}
