"""Shared fixtures: checkpoints the project makes or ships, and stores loaded with them."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from puffergpt.model import checkpoints
from puffergpt.search import load, manifest
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
            key = manifest.model_key(ckpt.name)
            load.load(store, ckpt, key, metric=metric, progress=False)
            made[k] = (store, key)
        return made[k]

    yield get
    for store, _ in made.values():
        store.close()




@pytest.fixture(scope="session")
def indexed(tmp_path_factory, demo):
    """(store, key, data dir): the demo model with its approximate (HNSW) index over wte
    (``puffergpt load --output-index``), in an embedded store of its own, made once per session."""
    data = tmp_path_factory.mktemp("indexed")
    store = open_store("embedded", data)
    key = manifest.model_key(demo.name)
    load.load(store, demo, key, progress=False)
    load.build_output_index(store, key, demo.name, progress=False)
    yield store, key, data
    store.close()


# --- Tiers --------------------------------------------------------------------------------
# Each test is marked by what it needs, by rule, so a new test lands in its tier without anyone
# remembering to mark it (the markers are registered in pyproject.toml). `make test-fast` runs
# `-m "not browser and not pgvector and not oracle"`: no Chromium, no PostgreSQL, no torch.
#   browser   it uses the `browser` fixture (headless Chromium driven by Playwright; every page
#             fixture asks for it).
#   pgvector  it asks for the session's PostgreSQL (`pg`, and through it `pg_dsn`, `new_database`,
#             `bare_server`), it is parametrized onto the "pgvector" backend (the store contract),
#             or it lives in tests/stores/test_pg*.py (the backend's own modules, which also start
#             a local server of their own).
#   oracle    it compares against torch/transformers: it uses the `hf` fixture, its module imports
#             torch or transformers (or importorskip's them) outside any function, or its own body
#             does; plus the few that reach transformers through the code under test (ORACLE_VIA).
ORACLE_LIBS = frozenset({"torch", "transformers"})
ORACLE_VIA = {"tests/test_bench.py::test_bench_quick_json": "bench --quick runs transformers beside the engines"}


def _needs_oracle_lib(node) -> bool:
    """Whether this statement imports torch/transformers or importorskip's them."""
    if isinstance(node, ast.Import):
        return any(a.name.split(".")[0] in ORACLE_LIBS for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] in ORACLE_LIBS
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "importorskip":
        return bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value in ORACLE_LIBS
    return False


def _walk_outside_functions(node):
    for child in ast.iter_child_nodes(node):
        if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield child
            yield from _walk_outside_functions(child)


@functools.cache
def _oracle_scan(path: str) -> tuple[bool, frozenset[str]]:
    """(whether the module needs torch/transformers at import, the functions whose bodies do)."""
    tree = ast.parse(Path(path).read_text(), path)
    at_import = any(_needs_oracle_lib(n) for n in _walk_outside_functions(tree))
    bodies = frozenset(f.name for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                       and any(_needs_oracle_lib(n) for n in ast.walk(f)))
    return at_import, bodies


def _tiers(item) -> set[str]:
    names, path = set(item.fixturenames), Path(str(item.path))
    params = getattr(getattr(item, "callspec", None), "params", {})
    tiers = set()
    if "browser" in names:
        tiers.add("browser")
    pg_module = path.parent.name == "stores" and path.name.startswith("test_pg")
    if "pg" in names or "pgvector" in params.values() or pg_module:
        tiers.add("pgvector")
    at_import, bodies = _oracle_scan(str(path))
    if "hf" in names or at_import or item.originalname in bodies or item.nodeid in ORACLE_VIA:
        tiers.add("oracle")
    return tiers


def pytest_collection_modifyitems(config, items):
    for item in items:
        for tier in sorted(_tiers(item)):
            item.add_marker(tier)
