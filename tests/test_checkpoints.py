"""Checkpoints: make, load (fp32/fp16/bf16, HF prefixes), errors, verified download, the demo fallback."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from math import prod
from pathlib import Path

import numpy as np
import pytest

from puffergpt.model import checkpoints, hub
from puffergpt.model.checkpoints import PRESETS, CheckpointError, GPT2Config, expected_shapes
from puffergpt.model.hub import HUB_MODELS, HubModel, fetch_verified

TINY = PRESETS["tiny"]


@pytest.fixture(scope="module")
def tiny_ckpt_dir(tmp_path_factory) -> Path:
    """A tiny checkpoint, made once for this module; tests copy it before changing it."""
    return checkpoints.make_model(tmp_path_factory.mktemp("ckpts") / "tiny", "tiny", seed=11)


@pytest.fixture(scope="module")
def tiny_ckpt(tiny_ckpt_dir):
    return checkpoints.load_dir(tiny_ckpt_dir)


def small_config() -> GPT2Config:
    # Smaller than tiny (vocab 100) for the tests that rewrite tensors by hand.
    return GPT2Config(n_vocab=100, n_ctx=16, n_embd=8, n_layer=2, n_head=2)


def copy_with(src: Path, dst: Path, tensors: dict | None = None, config: str | None = None) -> Path:
    """A copy of checkpoint src, with its tensors and/or config.json replaced."""
    from safetensors.numpy import save_file

    dst.mkdir(parents=True)
    if config is None:
        shutil.copy(src / "config.json", dst / "config.json")
    else:
        (dst / "config.json").write_text(config)
    if tensors is None:
        shutil.copy(src / "model.safetensors", dst / "model.safetensors")
    else:
        save_file(tensors, str(dst / "model.safetensors"))
    return dst


# --- make_model and the presets -------------------------------------------------------------

def test_make_model_tiny_loads_back_with_expected_shapes(tiny_ckpt_dir, tiny_ckpt):
    assert sorted(p.name for p in tiny_ckpt_dir.iterdir()) == ["config.json", "model.safetensors"]
    cfg = json.loads((tiny_ckpt_dir / "config.json").read_text())
    assert cfg["model_type"] == "gpt2" and cfg["n_positions"] == 128 and cfg["vocab_size"] == 50257
    assert tiny_ckpt.config == TINY
    want = expected_shapes(TINY)
    assert set(tiny_ckpt.params) == set(want)
    for k, shape in want.items():
        assert tiny_ckpt.params[k].shape == shape, k
        assert tiny_ckpt.params[k].dtype == np.float32, k
        assert tiny_ckpt.params[k].flags["C_CONTIGUOUS"], k
    assert tiny_ckpt.params["wte.weight"].shape == (50257, 64)
    assert tiny_ckpt.params["h.1.mlp.c_fc.weight"].shape == (64, 256)  # Conv1D: (in, out)
    assert tiny_ckpt.n_params() == sum(prod(s) for s in want.values())


def test_same_seed_same_weights_other_seed_different(tmp_path, tiny_ckpt):
    same = checkpoints.load_dir(checkpoints.make_model(tmp_path / "a", "tiny", seed=11))
    other = checkpoints.load_dir(checkpoints.make_model(tmp_path / "b", "tiny", seed=12))
    for k in tiny_ckpt.params:
        np.testing.assert_array_equal(same.params[k], tiny_ckpt.params[k], err_msg=k)
    assert all(not np.array_equal(other.params[k], tiny_ckpt.params[k]) for k in tiny_ckpt.params)


def test_gpt2_preset_has_gpt2_small_parameter_count():
    shapes = expected_shapes(PRESETS["gpt2"])
    assert sum(prod(s) for s in shapes.values()) == 124_439_808
    assert len(shapes) == 4 + 12 * 12
    assert shapes["wte.weight"] == (50257, 768) and shapes["wpe.weight"] == (1024, 768)
    assert shapes["h.11.attn.c_attn.weight"] == (768, 2304)


def test_make_model_refuses_a_non_empty_directory_and_an_unknown_preset(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not empty"):
        checkpoints.make_model(tmp_path / "out", "tiny", 0)
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "out" / "model.safetensors").exists()
    with pytest.raises(CheckpointError, match="unknown preset 'huge'"):
        checkpoints.make_model(tmp_path / "new", "huge", 0)


# --- dtypes and key prefixes ------------------------------------------------------------------

def test_fp16_checkpoint_loads_as_float32_equal_to_upcast(tmp_path, tiny_ckpt):
    d = checkpoints.save_dir(tmp_path / "fp16", TINY, tiny_ckpt.params, dtype=np.float16)
    from safetensors import safe_open

    with safe_open(str(d / "model.safetensors"), "np") as f:
        assert f.get_tensor("wte.weight").dtype == np.float16  # really written as fp16
    got = checkpoints.load_dir(d)
    for k, v in tiny_ckpt.params.items():
        assert got.params[k].dtype == np.float32
        np.testing.assert_array_equal(got.params[k], v.astype(np.float16).astype(np.float32), err_msg=k)
    # fp16 is not fp32: the round trip really lost precision somewhere.
    assert not np.array_equal(got.params["wte.weight"], tiny_ckpt.params["wte.weight"])


def test_bf16_checkpoint_loads_as_float32_equal_to_upcast(tmp_path, tiny_ckpt):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    d = tmp_path / "bf16"
    d.mkdir()
    bf = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tiny_ckpt.params.items()}
    save_file(bf, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(TINY.to_hf()))
    got = checkpoints.load_dir(d)
    assert set(got.params) == set(tiny_ckpt.params)
    for k, t in bf.items():
        assert got.params[k].dtype == np.float32 and got.params[k].shape == tuple(t.shape)
        np.testing.assert_array_equal(got.params[k], t.float().numpy(), err_msg=k)
    assert not np.array_equal(got.params["wte.weight"], tiny_ckpt.params["wte.weight"])


def test_bf16_mixed_with_fp32_tensors(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    c = small_config()
    params = checkpoints.random_params(c, 5)
    d = tmp_path / "mixed"
    d.mkdir()
    t = {k: torch.from_numpy(v).to(torch.bfloat16) if k.startswith("h.0.") else torch.from_numpy(v)
         for k, v in params.items()}
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(c.to_hf()))
    got = checkpoints.load_dir(d)
    np.testing.assert_array_equal(got.params["h.1.mlp.c_fc.weight"], params["h.1.mlp.c_fc.weight"])
    np.testing.assert_array_equal(got.params["h.0.mlp.c_fc.weight"], t["h.0.mlp.c_fc.weight"].float().numpy())


def test_transformer_prefixed_keys_load(tmp_path):
    # GPT2LMHeadModel.save_pretrained writes "transformer.wte.weight", ...; the tied
    # lm_head is not written.
    c = small_config()
    params = checkpoints.random_params(c, 1)
    d = tmp_path / "hf"
    d.mkdir()
    from safetensors.numpy import save_file

    prefixed = {"transformer." + k: v for k, v in params.items()}
    save_file(prefixed, str(d / "model.safetensors"), metadata={"format": "pt"})
    hf_cfg = c.to_hf() | {"transformers_version": "4.44.0", "attn_pdrop": 0.1, "summary_type": "cls_index"}
    (d / "config.json").write_text(json.dumps(hf_cfg))
    got = checkpoints.load_dir(d)
    assert got.config == c
    assert set(got.params) == set(expected_shapes(c))
    for k, v in params.items():
        np.testing.assert_array_equal(got.params[k], v, err_msg=k)


# --- errors -------------------------------------------------------------------------------------

def test_missing_tensor_names_it(tmp_path, tiny_ckpt_dir, tiny_ckpt):
    t = {k: v for k, v in tiny_ckpt.params.items() if k != "h.1.attn.c_proj.bias"}
    d = copy_with(tiny_ckpt_dir, tmp_path / "missing", tensors=t)
    with pytest.raises(CheckpointError, match=r"h\.1\.attn\.c_proj\.bias") as e:
        checkpoints.load_dir(d)
    assert "missing" in str(e.value)


def test_wrong_shape_names_the_tensor_and_shapes(tmp_path, tiny_ckpt_dir, tiny_ckpt):
    t = dict(tiny_ckpt.params)
    t["h.0.mlp.c_fc.weight"] = np.ascontiguousarray(t["h.0.mlp.c_fc.weight"].T)  # (out, in): not Conv1D
    d = copy_with(tiny_ckpt_dir, tmp_path / "shape", tensors=t)
    with pytest.raises(CheckpointError, match=r"h\.0\.mlp\.c_fc\.weight") as e:
        checkpoints.load_dir(d)
    assert "(256, 64)" in str(e.value) and "(64, 256)" in str(e.value)


def test_config_and_tensors_disagree(tmp_path, tiny_ckpt_dir):
    # A config.json for a wider model than the tensors.
    cfg = json.dumps(GPT2Config(n_ctx=128, n_embd=128, n_layer=2, n_head=4).to_hf())
    d = copy_with(tiny_ckpt_dir, tmp_path / "cfg", config=cfg)
    with pytest.raises(CheckpointError, match="wte.weight"):
        checkpoints.load_dir(d)


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors"])
def test_directory_without_a_file(tmp_path, tiny_ckpt_dir, missing):
    d = copy_with(tiny_ckpt_dir, tmp_path / "ck")
    (d / missing).unlink()
    with pytest.raises(CheckpointError, match=f"{missing} is missing"):
        checkpoints.load_dir(d)


def test_empty_directory(tmp_path):
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        checkpoints.load(str(tmp_path))


def test_config_not_json(tmp_path, tiny_ckpt_dir):
    d = copy_with(tiny_ckpt_dir, tmp_path / "ck", config="{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        checkpoints.load_dir(d)


@pytest.mark.parametrize("cfg, word", [
    ({"model_type": "llama"}, "model_type"),
    ({"activation_function": "relu"}, "activation_function"),
    ({"n_inner": 100}, "n_inner"),
    ({"n_embd": 64, "n_head": 5}, "multiple"),
])
def test_config_that_is_not_gpt2(tmp_path, tiny_ckpt_dir, cfg, word):
    d = copy_with(tiny_ckpt_dir, tmp_path / "ck", config=json.dumps(TINY.to_hf() | cfg))
    with pytest.raises(CheckpointError, match=word):
        checkpoints.load_dir(d)


def _corruptions(data: bytes) -> dict[str, bytes]:
    return {
        "empty": b"",
        "garbage": b"this is not a safetensors file " * 8,
        "truncated": data[: len(data) // 2],
        "header only": data[:64],
        "bad header json": (3).to_bytes(8, "little") + b"{xx",
    }


@pytest.mark.parametrize("kind", list(_corruptions(b"x" * 200)))
def test_corrupt_safetensors(tmp_path, tiny_ckpt_dir, kind):
    d = copy_with(tiny_ckpt_dir, tmp_path / "ck")
    (d / "model.safetensors").write_bytes(_corruptions((tiny_ckpt_dir / "model.safetensors").read_bytes())[kind])
    with pytest.raises(CheckpointError, match="could not be read as safetensors"):
        checkpoints.load_dir(d)


def test_bf16_checkpoint_with_a_bool_buffer(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    c = small_config()
    t = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in checkpoints.random_params(c, 2).items()}
    t["h.0.attn.bias"] = torch.ones(1, 1, c.n_ctx, c.n_ctx, dtype=torch.bool)  # what older transformers saved
    d = tmp_path / "ck"
    d.mkdir()
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(c.to_hf()))
    got = checkpoints.load_dir(d)  # should load (the buffer is not a parameter), or raise CheckpointError
    assert got.params["wte.weight"].dtype == np.float32


@pytest.mark.parametrize("cfg", ["[]", '{"n_embd": "64"}', '{"n_head": 0}'])
def test_config_json_of_the_wrong_shape(tmp_path, tiny_ckpt_dir, cfg):
    d = copy_with(tiny_ckpt_dir, tmp_path / "ck", config=cfg)
    with pytest.raises(CheckpointError, match="JSON object|positive integer"):
        checkpoints.load_dir(d)


# --- resolve / check_model --------------------------------------------------------------------

def test_unknown_model_name():
    for f in (checkpoints.check_model, checkpoints.resolve, checkpoints.load):
        with pytest.raises(CheckpointError, match="unknown model 'nope'") as e:
            f("nope")
        assert "demo" in str(e.value) and "gpt2" in str(e.value) and "path" in str(e.value)


def test_plain_file_is_not_a_checkpoint(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"\0" * 10)
    for fn in (checkpoints.check_model, checkpoints.resolve, checkpoints.load):
        with pytest.raises(CheckpointError, match="is a file, not a checkpoint directory"):
            fn(str(f))


def test_resolve_a_directory(tiny_ckpt_dir):
    checkpoints.check_model(str(tiny_ckpt_dir))  # no error
    path, source = checkpoints.resolve(str(tiny_ckpt_dir))
    assert path == tiny_ckpt_dir
    assert source["path"] == str(tiny_ckpt_dir.resolve())
    ck = checkpoints.load(str(tiny_ckpt_dir))
    assert ck.name == str(tiny_ckpt_dir) and ck.config == TINY


def test_known_names_need_no_download_to_check():
    for name in ["demo", *HUB_MODELS]:
        checkpoints.check_model(name)


# --- the pinned hub checkpoint ------------------------------------------------------------------

def test_gpt2_pin():
    m = HUB_MODELS["gpt2"]
    assert m.repo == "openai-community/gpt2"
    assert m.revision == "607a30d783dfa663caf39e06633721c8d4cfcd7e"
    assert m.size == 548_105_171
    assert m.sha256 == "248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707"
    # The hub file: 124,439,808 fp32 parameters, 12 fp32 (1024, 1024) attn.bias mask
    # buffers (which load_dir ignores), and a safetensors header of some KB.
    n = sum(prod(s) for s in expected_shapes(PRESETS["gpt2"]).values())
    assert 0 < m.size - 4 * (n + 12 * 1024 * 1024) < 100_000


# --- fetch_verified ----------------------------------------------------------------------------

GOOD = b"the pinned bytes\n" * 100


def writer(data: bytes, name: str = "model.safetensors"):
    def fetch(tmp: Path) -> Path:
        p = tmp / "sub" / name  # hf_hub_download writes under local_dir, maybe in folders
        p.parent.mkdir(parents=True)
        p.write_bytes(data)
        return p
    return fetch


def test_fetch_verified_wrong_bytes(tmp_path):
    dest = tmp_path / "cache" / "model.safetensors"
    bad = GOOD[:-1] + b"!"  # same size, other content
    with pytest.raises(CheckpointError, match="sha256") as e:
        fetch_verified(writer(bad), dest, hashlib.sha256(GOOD).hexdigest(), len(GOOD))
    assert hashlib.sha256(bad).hexdigest() in str(e.value)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []  # no temporary file or folder is left behind


def test_fetch_verified_wrong_size(tmp_path):
    dest = tmp_path / "cache" / "model.safetensors"
    with pytest.raises(CheckpointError, match="bytes") as e:
        fetch_verified(writer(GOOD[:100]), dest, hashlib.sha256(GOOD).hexdigest(), len(GOOD))
    assert f"{len(GOOD):,}" in str(e.value)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_fetch_verified_interrupted(tmp_path):
    dest = tmp_path / "cache" / "model.safetensors"

    def fetch(tmp: Path) -> Path:
        (tmp / "model.safetensors.incomplete").write_bytes(GOOD[:10])
        raise ConnectionError("connection reset")

    with pytest.raises(ConnectionError):
        fetch_verified(fetch, dest, hashlib.sha256(GOOD).hexdigest(), len(GOOD))
    assert list(dest.parent.iterdir()) == []


def test_fetch_verified_good_file_lands_at_dest(tmp_path):
    dest = tmp_path / "cache" / "model.safetensors"
    got = fetch_verified(writer(GOOD), dest, hashlib.sha256(GOOD).hexdigest(), len(GOOD))
    assert got == dest
    assert dest.read_bytes() == GOOD
    assert list(dest.parent.iterdir()) == [dest]


def test_fetch_verified_unpinned(tmp_path):
    dest = tmp_path / "cache" / "config.json"
    fetch_verified(writer(b"{}", "config.json"), dest, None)
    assert dest.read_bytes() == b"{}"


# --- download ------------------------------------------------------------------------------------

def files_under(p: Path) -> list[Path]:
    return [f for f in p.rglob("*") if f.is_file()] if p.exists() else []


def hub_answers(monkeypatch) -> list[str]:
    """The hub answers download's first, bounded request (no network); returns the URLs asked."""
    import huggingface_hub

    asked = []
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, **kw: asked.append(url))
    return asked


def test_download_offline_names_the_alternatives(tmp_path, monkeypatch):
    import huggingface_hub

    hub_answers(monkeypatch)  # the hub answers, then the download itself fails
    calls = []

    def unreachable(*args, **kwargs):
        calls.append((args, kwargs))
        raise OSError("network unreachable")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", unreachable)
    for f in (lambda: hub.download(HUB_MODELS["gpt2"], tmp_path), lambda: checkpoints.load("gpt2", cache_dir=tmp_path)):
        with pytest.raises(CheckpointError) as e:
            f()
        msg = str(e.value)
        assert "--model demo" in msg and "make-model" in msg
        assert "openai-community/gpt2" in msg and "network unreachable" in msg
    assert calls and calls[0][0][:2] == ("openai-community/gpt2", "model.safetensors")
    assert calls[0][1]["revision"] == HUB_MODELS["gpt2"].revision
    assert files_under(tmp_path) == []


def fake_hub(monkeypatch, src: Path, files: dict[str, bytes] | None = None) -> list[str]:
    """A hub that answers, and hf_hub_download that copies from src (or writes files[name]) into local_dir."""
    import huggingface_hub

    hub_answers(monkeypatch)
    calls = []

    def fake(repo, filename, revision=None, local_dir=None, **kw):
        calls.append(filename)
        out = Path(local_dir) / filename
        if files and filename in files:
            out.write_bytes(files[filename])
        else:
            shutil.copy(src / filename, out)
        return str(out)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    return calls


def test_download_verifies_and_caches(tmp_path, monkeypatch, tiny_ckpt_dir, tiny_ckpt):
    st = (tiny_ckpt_dir / "model.safetensors").read_bytes()
    m = HubModel("someone/tiny", "0123456789abcdef", hashlib.sha256(st).hexdigest(), len(st))
    calls = fake_hub(monkeypatch, tiny_ckpt_dir)
    out = hub.download(m, tmp_path / "cache")
    assert out == tmp_path / "cache" / "someone--tiny" / "0123456789abcdef"
    assert sorted(calls) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "model.safetensors.verified"]
    got = checkpoints.load_dir(out)
    np.testing.assert_array_equal(got.params["wte.weight"], tiny_ckpt.params["wte.weight"])
    # A second call finds the cache and does not fetch.
    calls.clear()
    assert hub.download(m, tmp_path / "cache") == out
    assert calls == []


def test_download_of_the_wrong_file_leaves_nothing(tmp_path, monkeypatch, tiny_ckpt_dir):
    st = (tiny_ckpt_dir / "model.safetensors").read_bytes()
    m = HubModel("someone/tiny", "0123456789abcdef", hashlib.sha256(st).hexdigest(), len(st))
    tampered = bytearray(st)
    tampered[-1] ^= 1
    fake_hub(monkeypatch, tiny_ckpt_dir, {"model.safetensors": bytes(tampered)})
    with pytest.raises(CheckpointError, match="sha256"):
        hub.download(m, tmp_path / "cache")
    assert files_under(tmp_path / "cache") == []


def test_hub_source_is_recorded(tmp_path, monkeypatch, tiny_ckpt_dir):
    st = (tiny_ckpt_dir / "model.safetensors").read_bytes()
    m = HubModel("someone/tiny", "0123456789abcdef", hashlib.sha256(st).hexdigest(), len(st))
    monkeypatch.setitem(HUB_MODELS, "tiny-hub", m)
    fake_hub(monkeypatch, tiny_ckpt_dir)
    ck = checkpoints.load("tiny-hub", cache_dir=tmp_path)
    assert ck.name == "tiny-hub"
    assert ck.source == {"name": "tiny-hub"} | asdict(m)


# --- the hub out of reach: the demo model, within seconds ----------------------------------------

def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released): connecting is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hub_at(monkeypatch, endpoint: str) -> None:
    """Hub URLs point at ``endpoint``; HF_ENDPOINT itself is read when huggingface_hub is imported."""
    import huggingface_hub

    real = huggingface_hub.hf_hub_url
    monkeypatch.setattr(huggingface_hub, "hf_hub_url",
                        lambda repo, filename, **kw: real(repo, filename, endpoint=endpoint, **kw))


@pytest.fixture
def silent_hub():
    """A loopback socket that accepts connections and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def pinned_tiny(monkeypatch, tiny_ckpt_dir) -> HubModel:
    """GPT-2 small's pin replaced by the tiny checkpoint, so a whole download takes milliseconds."""
    st = (tiny_ckpt_dir / "model.safetensors").read_bytes()
    m = HubModel("someone/tiny", "0123456789abcdef", hashlib.sha256(st).hexdigest(), len(st))
    monkeypatch.setitem(HUB_MODELS, "gpt2", m)
    return m


def timed_default_model(cache: Path, **kw) -> tuple[str, str | None, float]:
    t0 = time.monotonic()
    name, note = hub.default_model(progress=False, cache_dir=cache, **kw)
    return name, note, time.monotonic() - t0


def assert_fallback_note(note: str | None, *words: str) -> None:
    assert note is not None and "\n" not in note and len(note) < 400, note
    assert note.startswith("GPT-2 small could not be downloaded (")
    assert "run again with a network" in note and "--model PATH" in note and "Hugging Face layout" in note
    for w in words:
        assert w in note, (w, note)


def test_refused_hub_serves_demo_within_seconds(tmp_path, monkeypatch):
    port = closed_port()
    hub_at(monkeypatch, f"http://127.0.0.1:{port}")
    name, note, elapsed = timed_default_model(tmp_path)
    assert name == "demo" and elapsed < 10, (name, elapsed)  # huggingface_hub alone takes ~23 s here
    assert_fallback_note(note, f"127.0.0.1:{port} refused the connection")
    assert files_under(tmp_path) == []


def test_silent_hub_times_out(tmp_path, monkeypatch, silent_hub):
    hub_at(monkeypatch, silent_hub)
    name, note, elapsed = timed_default_model(tmp_path, timeout=1.0)
    assert name == "demo" and elapsed < 4, elapsed
    assert_fallback_note(note, "did not answer within 1 s")


def test_deadline_bounds_a_lookup_that_hangs(tmp_path, monkeypatch):
    # A DNS lookup that hangs is bounded by no socket timeout; the probe's deadline bounds it.
    import huggingface_hub

    release = threading.Event()
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, **kw: release.wait(30))
    try:
        name, note, elapsed = timed_default_model(tmp_path, timeout=0.5)
    finally:
        release.set()
    assert name == "demo" and elapsed < 3, elapsed
    assert_fallback_note(note, "did not answer within 0.5 s")


@pytest.mark.parametrize("env, words", [
    ({"HF_ENDPOINT": "http://127.0.0.1:{port}"}, ["127.0.0.1:{port} refused the connection"]),
    ({"HF_HUB_OFFLINE": "1"}, ["HF_HUB_OFFLINE is set"]),
])
def test_environment_in_a_real_process(tmp_path, env, words):
    # The variables a user sets, read where huggingface_hub reads them (at import), and the
    # default cache under XDG_CACHE_HOME.
    port = closed_port()
    env = {k: v.format(port=port) for k, v in env.items()}
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "XDG_"))}
    clean |= {"HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache")} | env
    code = ("import json; from puffergpt.model import hub; "
            "print(json.dumps([hub.default_model(progress=False), str(hub.default_cache_dir())]))")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean, timeout=60)
    elapsed = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    (name, note), cache = json.loads(p.stdout)
    assert name == "demo" and elapsed < 10, (name, elapsed)
    assert_fallback_note(note, *(w.format(port=port) for w in words))
    assert cache == str(tmp_path / "cache" / "puffergpt" / "checkpoints")


def test_explicit_gpt2_fails_fast_naming_the_alternatives(tmp_path, monkeypatch):
    port = closed_port()
    hub_at(monkeypatch, f"http://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(CheckpointError) as e:
        checkpoints.load("gpt2", cache_dir=tmp_path)
    assert time.monotonic() - t0 < 10
    msg = str(e.value)
    assert "could not download openai-community/gpt2@607a30d783df" in msg and "refused the connection" in msg
    assert "--model demo" in msg and "--model PATH" in msg and "make-model" in msg
    assert files_under(tmp_path) == []


def test_partial_file_in_the_cache_is_ignored(tmp_path, monkeypatch, tiny_ckpt_dir):
    # A truncated model.safetensors where the verified one belongs (and a killed download's
    # temporary folder beside it): never loaded, and the demo model still serves.
    m = HUB_MODELS["gpt2"]
    out = tmp_path / "openai-community--gpt2" / m.revision
    out.mkdir(parents=True)
    shutil.copy(tiny_ckpt_dir / "config.json", out / "config.json")
    (out / "model.safetensors").write_bytes((tiny_ckpt_dir / "model.safetensors").read_bytes()[:5000])
    (out / ".download-killed").mkdir()
    (out / ".download-killed" / "model.safetensors").write_bytes(b"\0" * 1000)
    hub_at(monkeypatch, f"http://127.0.0.1:{closed_port()}")
    name, note, elapsed = timed_default_model(tmp_path)
    assert name == "demo" and elapsed < 10
    assert_fallback_note(note, "the cached model.safetensors was damaged (5,000 of 548,105,171 bytes)",
                         "removed", "refused")
    assert not (out / "model.safetensors").exists()
    with pytest.raises(CheckpointError, match="could not download"):  # explicit gpt2 never loads the partial file
        checkpoints.load("gpt2", cache_dir=tmp_path)


def test_cached_and_verified_needs_no_hub(tmp_path, monkeypatch, pinned_tiny, tiny_ckpt_dir, tiny_ckpt):
    calls = fake_hub(monkeypatch, tiny_ckpt_dir)
    assert hub.default_model(progress=False, cache_dir=tmp_path) == ("gpt2", None)
    assert sorted(calls) == ["config.json", "model.safetensors"]
    # Now offline: the verified cache serves GPT-2 without asking the hub or hashing again.
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda *a, **kw: pytest.fail("asked the hub"))
    monkeypatch.setattr(hub, "sha256_file", lambda *a, **kw: pytest.fail("hashed again"))
    assert hub.default_model(progress=False, cache_dir=tmp_path) == ("gpt2", None)
    got = checkpoints.load("gpt2", cache_dir=tmp_path)
    np.testing.assert_array_equal(got.params["wte.weight"], tiny_ckpt.params["wte.weight"])


def test_cached_file_changed_since_its_check_is_removed(tmp_path, monkeypatch, pinned_tiny, tiny_ckpt_dir):
    fake_hub(monkeypatch, tiny_ckpt_dir)
    out = hub.download(pinned_tiny, tmp_path)
    st = out / "model.safetensors"
    data = bytearray(st.read_bytes())
    data[-1] ^= 1  # same size, one bit flipped
    st.write_bytes(bytes(data))
    os.utime(st, ns=(st.stat().st_atime_ns, st.stat().st_mtime_ns + 1))  # a new mtime even on coarse clocks
    import huggingface_hub

    def no_route(*a, **kw):  # what a machine with no network at all answers
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", no_route)
    name, note, _ = timed_default_model(tmp_path)
    assert name == "demo"
    assert_fallback_note(note, "its sha256 is not the pinned one", "removed", "no network: no route to huggingface.co")
    assert not st.exists() and not (out / "model.safetensors.verified").exists()


@pytest.mark.parametrize("served, words", [
    (b"truncated", ["was incomplete (9 of"]),
    (None, ["did not match its pinned sha256"]),
])
def test_damaged_download_is_discarded_and_demo_serves(tmp_path, monkeypatch, pinned_tiny, tiny_ckpt_dir, served,
                                                       words):
    st = (tiny_ckpt_dir / "model.safetensors").read_bytes()
    tampered = served if served is not None else st[:-1] + bytes([st[-1] ^ 1])
    fake_hub(monkeypatch, tiny_ckpt_dir, {"model.safetensors": tampered})
    name, note, _ = timed_default_model(tmp_path)
    assert name == "demo"
    assert_fallback_note(note, *words, "discarded")
    assert files_under(tmp_path) == []


def test_download_that_breaks_after_the_hub_answered(tmp_path, monkeypatch, pinned_tiny):
    import huggingface_hub

    hub_answers(monkeypatch)

    def reset(*a, **kw):
        raise ConnectionError("connection reset by peer")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", reset)
    name, note, _ = timed_default_model(tmp_path)
    assert name == "demo"
    assert_fallback_note(note, "the download failed: ConnectionError: connection reset by peer")
    assert files_under(tmp_path) == []
