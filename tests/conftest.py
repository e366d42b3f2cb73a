"""Shared fixtures: checkpoints the project makes or ships, and stores loaded with them."""

from __future__ import annotations

import pytest

from puffergpt import checkpoints, loading
from puffergpt.stores import open_store


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return checkpoints.make_model(tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny(tiny_dir):
    return checkpoints.load(str(tiny_dir))


@pytest.fixture(scope="session")
def demo():
    # The demo model ships in the package: its absence is a failure, not a skip.
    return checkpoints.load("demo")


@pytest.fixture(scope="session")
def hf():
    """hf(ckpt) -> transformers' GPT2LMHeadModel of the same checkpoint (float32, eager
    attention so that output_attentions is the plain softmax): the independent oracle."""
    torch = pytest.importorskip("torch", reason="torch is in the test extra: make test installs it")
    transformers = pytest.importorskip("transformers")
    made = {}

    def get(ckpt):
        if ckpt.name not in made:
            path = checkpoints.demo_dir() if ckpt.name == "demo" else ckpt.name
            made[ckpt.name] = transformers.GPT2LMHeadModel.from_pretrained(
                str(path), torch_dtype=torch.float32, attn_implementation="eager").eval()
        return made[ckpt.name]

    return get


@pytest.fixture(scope="session")
def loaded(tmp_path_factory):
    """loaded(ckpt, metric) -> (store, key): a store holding ckpt's documents, made once per session."""
    made = {}

    def get(ckpt, metric="inner_product"):
        k = (ckpt.name, metric)
        if k not in made:
            store = open_store("embedded", tmp_path_factory.mktemp(f"store-{metric}"))
            key = loading.model_key(ckpt.name)
            loading.load(store, ckpt, key, metric=metric, progress=False)
            made[k] = (store, key)
        return made[k]

    yield get
    for store, _ in made.values():
        store.close()


