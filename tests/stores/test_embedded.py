"""The embedded store (Qdrant Edge) beyond the contract: persistence, one process per data
directory, the old DuckDB format, and a load killed with SIGKILL half-way."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from helpers import held_by_another_process
from puffergpt import checkpoints, loading
from puffergpt.stores import Query, StoreError, open_store
from puffergpt.stores.embedded import EmbeddedStore

SCHEMA = {"matrix": "str", "row": "int"}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from puffergpt.cli import main; main()", *args]


def test_documents_ids_and_attributes_survive_a_reopen(tmp_path):
    """Attributes a search returns come from memory, rebuilt from the shard's payload on open."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 16)).astype(np.float32)
    s = open_store("embedded", tmp_path)
    s.create_namespace("m", 16, SCHEMA, "inner_product")
    s.upsert("m", [f"a.{i}" for i in range(300)], a, {"matrix": ["a"] * 300, "row": np.arange(300)})
    s.delete("m", (("row", ">=", 250),))
    s.put_meta("k", {"x": [1, 2]})
    s.close()
    s = open_store("embedded", tmp_path)
    x = rng.standard_normal(16).astype(np.float32)
    hits = s.search("m", [Query(x, (("matrix", "=", "a"),))], "inner_product", include=("row", "id"))
    got = np.full(250, np.nan)
    got[hits.attrs["row"]] = hits.distance
    np.testing.assert_allclose(got, a[:250].astype(np.float64) @ x, rtol=1e-5, atol=1e-5)
    assert hits.attrs["id"].tolist() == [f"a.{r}" for r in hits.attrs["row"]]
    assert s.count("m") == 250 and s.get_meta("k") == {"x": [1, 2]}
    s.upsert("m", ["a.300"], a[:1], {"matrix": ["a"], "row": [300]})  # a new slot after the reopen
    np.testing.assert_array_equal(s.fetch("m", ["a.300", "a.0"]), a[[0, 0]])
    assert s.count("m", (("id", "in", ["a.300", "a.1", "nope"]),)) == 2
    s.close()


def test_every_match_even_after_attributes_move(tmp_path):
    """A search without top_k returns every match: documents moved from matrix a to b count for b."""
    s = open_store("embedded", tmp_path)
    s.create_namespace("m", 4, SCHEMA)
    v = np.random.default_rng(1).standard_normal((40, 4)).astype(np.float32)
    s.upsert("m", [f"d{i}" for i in range(40)], v, {"matrix": ["a"] * 40, "row": np.arange(40)})
    s.upsert("m", [f"d{i}" for i in range(30)], v[:30], {"matrix": ["b"] * 30, "row": np.arange(30)})
    for metric in s.metrics:
        hits = s.search(
            "m", [Query(v[0], (("matrix", "=", "b"),)), Query(v[1], (("matrix", "in", ["a", "b"]),))], metric, ("row",)
        )
        assert (hits.query == 0).sum() == 30 and (hits.query == 1).sum() == 40, metric
    s.close()


def test_cosine_keeps_the_vectors_as_given(tmp_path):
    """Qdrant normalises Cosine vectors when it writes them; fetch still returns what was written."""
    s = open_store("embedded", tmp_path)
    s.create_namespace("c", 3, SCHEMA, "cosine_distance")
    v = np.array([[3, 4, 0], [1, 2, 2]], np.float32)
    s.upsert("c", ["x", "y"], v, {"matrix": ["a", "a"], "row": [0, 1]})
    np.testing.assert_array_equal(s.fetch("c", ["y", "x"]), v[[1, 0]])
    q = np.array([1, 0, 0], np.float32)
    hits = s.search("c", [Query(q)], "cosine_distance", ("row",))
    np.testing.assert_allclose(hits.distance[np.argsort(hits.attrs["row"])], [1 - 3 / 5, 1 - 1 / 3], rtol=1e-6)
    with pytest.raises(StoreError, match="created for cosine_distance, inner_product, not euclidean_squared"):
        s.search("c", [Query(q)], "euclidean_squared")
    s.close()


def test_wrong_values_are_clear_errors(tmp_path):
    s = open_store("embedded", tmp_path)
    s.create_namespace("m", 2, SCHEMA)
    with pytest.raises(StoreError, match="attribute 'row' holds int values"):
        s.upsert("m", ["x"], np.zeros((1, 2), np.float32), {"matrix": ["a"], "row": ["seven"]})
    with pytest.raises(StoreError, match="can't compare the text attribute 'matrix'"):
        s.count("m", (("matrix", "<", "b"),))
    with pytest.raises(StoreError, match="not of its type int"):
        s.count("m", (("row", "=", "x"),))
    with pytest.raises(StoreError, match="length 2"):
        s.search("m", [Query(np.zeros(3, np.float32))], "inner_product")
    assert s.count("m") == 0
    s.close()


def test_a_data_directory_held_by_another_process(tmp_path):
    with held_by_another_process("embedded", tmp_path) as pid:
        with pytest.raises(
            StoreError, match=rf"in use by another puffergpt process \(pid {pid}\).*another --data DIR"
        ):
            open_store("embedded", tmp_path)
        r = subprocess.run(
            cli("verify", "--model", "demo", "--data", str(tmp_path)), capture_output=True, text=True, timeout=120
        )
        assert r.returncode != 0 and f"pid {pid}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    open_store("embedded", tmp_path).close()  # the lock went with the process


def test_the_same_directory_twice_in_one_process(tmp_path):
    s = open_store("embedded", tmp_path)
    with pytest.raises(StoreError, match=f"pid {os.getpid()}"):
        open_store("embedded", tmp_path)
    s.close()
    open_store("embedded", tmp_path).close()


def test_a_store_of_the_old_duckdb_format(tmp_path):
    old = tmp_path / "puffergpt.duckdb"
    old.write_bytes(b"DUCK" + bytes(4092))  # only its name matters: it is never opened
    with pytest.raises(
        StoreError, match=r"old DuckDB format.*mv .*puffergpt\.duckdb.*puffergpt load --model MODEL --data "
    ):
        open_store("embedded", tmp_path)
    r = subprocess.run(
        cli("generate", "hi", "--model", "demo", "--data", str(tmp_path)), capture_output=True, text=True, timeout=120
    )
    assert r.returncode != 0 and "puffergpt load --model" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert old.stat().st_size == 4096 and sorted(p.name for p in tmp_path.iterdir()) == [
        "puffergpt.duckdb"
    ]  # untouched


def test_a_half_made_namespace_is_cleaned_up(tmp_path):
    """A namespace is made under a hidden name and renamed into place; leftovers go at the next open."""
    s = open_store("embedded", tmp_path)
    s.create_namespace("kept", 4, SCHEMA)
    s.close()
    half = tmp_path / "edge" / ".new-0123" / "shard"
    half.mkdir(parents=True)
    (half / "edge_config.json").write_text("{")  # what a kill in EdgeShard.create could leave
    s = open_store("embedded", tmp_path)
    assert s.namespaces() == ["kept"] and not half.exists()
    s.close()


def test_load_killed_mid_way_then_rerun(tmp_path, tiny_dir):
    """SIGKILL during `puffergpt load` leaves a half-written shard; the rerun completes with the
    manifest of a clean load, and every document is there once."""
    clean = open_store("embedded", tmp_path / "clean")
    key = loading.model_key(str(tiny_dir))
    want = loading.load(clean, checkpoints.load(str(tiny_dir)), key, progress=False)
    clean.close()
    data = tmp_path / "killed"
    p = subprocess.Popen(cli("load", "--model", str(tiny_dir), "--data", str(data)), stderr=subprocess.PIPE, text=True)
    seen, deadline = "", time.monotonic() + 300
    while time.monotonic() < deadline:  # tqdm's bar on stderr: kill at 30% of the documents
        seen += p.stderr.read(64) or ""
        pct = [int(x) for x in re.findall(r"(\d+)%", seen)]
        if pct and pct[-1] >= 30 or p.poll() is not None:
            break
    assert p.poll() is None, f"the load ended before it could be killed: {seen[-500:]}"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    s = open_store("embedded", data)
    m = s.get_meta(f"manifest:{key}")
    assert m is not None and not m["complete"]
    written = sum(s.count(ns) for ns in s.namespaces(f"{key}."))
    assert 0 < written < want["documents"], written  # half-written
    s.close()
    r = subprocess.run(
        cli("load", "--model", str(tiny_dir), "--data", str(data)), capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    s = open_store("embedded", data)
    got = s.get_meta(f"manifest:{key}")
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    assert {ns: s.count(ns) for ns in s.namespaces(f"{key}.")} == want["namespaces"]
    assert loading.verify(s, got) == {}
    s.close()


def test_disk_bytes_counts_only_this_stores_files(tmp_path):
    """A data directory shared with other stores (zvec, pgvector's local server) is measured
    for this store's own files alone (the bench's disk_mb per engine)."""
    store = EmbeddedStore(tmp_path)
    try:
        store.create_namespace("w", 4, {"row": "int"}, "inner_product")
        store.upsert("w", ["a", "b"], np.ones((2, 4), np.float32), {"row": [0, 1]})
        store.put_meta("k", {"v": 1})
        own = store.disk_bytes()
        shards = sum(p.stat().st_size for p in (tmp_path / "edge").rglob("*") if p.is_file())
        assert own >= shards > 0
        for other in ("zvec", "postgres"):
            (tmp_path / other).mkdir()
            (tmp_path / other / "big").write_bytes(b"x" * 1_000_000)
        assert store.disk_bytes() == own
    finally:
        store.close()


KEYS = {"layer": "int", "head": "int", "pos": "int"}


def write_keys(s, ns: str, v: np.ndarray) -> None:
    n = len(v)
    s.upsert(ns, [f"k{i}" for i in range(n)], v, {"layer": [0] * n, "head": np.arange(n) % 2, "pos": np.arange(n)})


def test_a_dropped_texts_shard_is_emptied_and_reused(tmp_path):
    """A text's keys (an ephemeral namespace) dropped: the shard is emptied and the next text of
    the same layout gets it, holding none of the old keys; its searches match numpy."""
    from puffergpt.stores import embedded

    rng = np.random.default_rng(3)
    s = open_store("embedded", tmp_path)
    s.create_namespace("text-a", 8, KEYS, "inner_product", ephemeral=True)
    old = rng.standard_normal((40, 8)).astype(np.float32)
    write_keys(s, "text-a", old)
    a_dir = s._dir("text-a")
    s.drop_namespace("text-a")
    assert "text-a" not in s.namespaces() and a_dir.is_dir()  # kept, empty, for the next
    s.create_namespace("text-b", 8, KEYS, "inner_product", ephemeral=True)
    assert s._dir("text-b") == a_dir and s.count("text-b") == 0
    new = rng.standard_normal((10, 8)).astype(np.float32)
    write_keys(s, "text-b", new)
    x = rng.standard_normal(8).astype(np.float32)
    hits = s.search("text-b", [Query(x, (("head", "=", 1), ("pos", "<", 9)))], "inner_product", include=("pos",))
    want = new.astype(np.float64) @ x
    assert sorted(hits.attrs["pos"].tolist()) == [1, 3, 5, 7]  # only the new text's keys
    np.testing.assert_allclose(hits.distance, want[hits.attrs["pos"]], rtol=1e-5, atol=1e-6)
    # Another layout makes a shard of its own; the spare of this one waits.
    s.create_namespace("text-c", 4, KEYS, "inner_product", ephemeral=True)
    assert s._dir("text-c") != a_dir
    # A shard is reused at most REUSE times, then really dropped.
    for _ in range(embedded.REUSE + 1):
        s.drop_namespace("text-b")
        s.create_namespace("text-b", 8, KEYS, "inner_product", ephemeral=True)
        write_keys(s, "text-b", new)
    assert s._dir("text-b") != a_dir and not a_dir.exists()
    spares = [sp.dir for sp in s._spare]
    s.close()
    assert spares == [] or not any(d.exists() for d in spares)
    assert list((tmp_path / "tmp").iterdir()) == []  # every text's shard gone with the store
