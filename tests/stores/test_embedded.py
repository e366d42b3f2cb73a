"""The embedded store beyond the contract: the weights on zvec and a text's keys on Qdrant Edge
under one data directory (and everything on Qdrant Edge in its fallback mode), persistence, one
process per data directory, the data directory's format (an earlier release's, the other mode's),
leftovers of a killed process, SIGKILL during a load, during writes and while serving, its
disk, and a text's shard reused."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from helpers import held_by_another_process
from puffergpt.search import load, manifest, verify
from puffergpt.stores import Query, StoreError, open_store
from puffergpt.stores.embedded import EmbeddedStore

SCHEMA = {"matrix": "str", "row": "int"}
MODES = [False, True]  # fallback: everything on Qdrant Edge


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from puffergpt.cli import main; main()", *args]


@pytest.mark.parametrize("fallback", MODES, ids=["zvec", "fallback"])
def test_documents_ids_and_attributes_survive_a_reopen(tmp_path, fallback):
    """Attributes a search returns come from memory, rebuilt from the database on open."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 16)).astype(np.float32)
    s = EmbeddedStore(tmp_path, fallback=fallback)
    s.create_namespace("m", 16, SCHEMA, "inner_product", partition="matrix")
    s.upsert("m", [f"a.{i}" for i in range(300)], a, {"matrix": ["a"] * 300, "row": np.arange(300)})
    s.delete("m", (("row", ">=", 250),))
    s.create_namespace("text-x", 4, {"pos": "int"}, ephemeral=True)
    s.put_meta("k", {"x": [1, 2]})
    s.close()
    s = EmbeddedStore(tmp_path, fallback=fallback)
    assert s.namespaces() == ["m"]  # the text's keys went with the process
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
    kept = "qdrant" if fallback else "zvec"
    assert json.loads((tmp_path / "format.json").read_text()) == {"format": 2, "weights": kept.replace(
        "qdrant", "qdrant-edge")}
    assert (tmp_path / kept / "m").is_dir() and not (tmp_path / {"zvec": "qdrant", "qdrant": "zvec"}[kept]).exists()


@pytest.mark.parametrize("fallback", MODES, ids=["zvec", "fallback"])
def test_cosine_keeps_the_vectors_as_given(tmp_path, fallback):
    """Both databases normalise Cosine vectors when they write them (zvec's come back off by a
    rounding); fetch still returns what was written, bit for bit."""
    s = EmbeddedStore(tmp_path, fallback=fallback)
    s.create_namespace("c", 770, SCHEMA, "cosine_distance")
    v = np.random.default_rng(4).standard_normal((20, 770)).astype(np.float32)
    s.upsert("c", [f"v{i}" for i in range(20)], v, {"matrix": ["a"] * 20, "row": np.arange(20)})
    np.testing.assert_array_equal(s.fetch("c", [f"v{i}" for i in range(20)][::-1]), v[::-1])
    q = v[0] + 1
    hits = s.search("c", [Query(q)], "cosine_distance", ("row",))
    vv = v.astype(np.float64)
    want = 1 - vv @ q / (np.linalg.norm(vv, axis=1) * np.linalg.norm(q.astype(np.float64)))
    np.testing.assert_allclose(hits.distance[np.argsort(hits.attrs["row"])], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(StoreError, match="created for cosine_distance.*not euclidean_squared"):
        s.search("c", [Query(q)], "euclidean_squared")
    s.close()


@pytest.mark.parametrize("fallback", MODES, ids=["zvec", "fallback"])
def test_wrong_values_are_clear_errors(tmp_path, fallback):
    s = EmbeddedStore(tmp_path, fallback=fallback)
    s.create_namespace("m", 2, SCHEMA, partition="matrix")
    with pytest.raises(StoreError, match="attribute 'row' holds int values"):
        s.upsert("m", ["x"], np.zeros((1, 2), np.float32), {"matrix": ["a"], "row": ["seven"]})
    s.upsert("m", ["x"], np.zeros((1, 2), np.float32), {"matrix": ["a"], "row": [7]})
    with pytest.raises(StoreError, match="can't compare the text attribute 'matrix'"):
        s.search("m", [Query(np.zeros(2, np.float32), (("matrix", "<", "b"),))], "inner_product")
    with pytest.raises(StoreError, match="not of its type int"):
        s.count("m", (("row", "=", "x"),))
    with pytest.raises(StoreError, match="length 2"):
        s.search("m", [Query(np.zeros(3, np.float32))], "inner_product")
    assert s.count("m") == 1
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
    s = open_store("embedded", tmp_path)  # the lock went with the process
    with pytest.raises(StoreError, match=f"pid {os.getpid()}"):  # and one process opens it once
        open_store("embedded", tmp_path)
    s.close()


def test_a_store_of_the_old_duckdb_format(tmp_path):
    old = tmp_path / "puffergpt.duckdb"
    old.write_bytes(b"DUCK" + bytes(4092))  # only its name matters: it is never opened
    with pytest.raises(
        StoreError, match=r"old DuckDB format.*mv .*puffergpt\.duckdb.*puffergpt load --model MODEL --data "
    ):
        open_store("embedded", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["puffergpt.duckdb"]  # untouched


@pytest.mark.parametrize("made", ["edge", "zvec"])
def test_a_data_directory_of_the_previous_release(tmp_path, made):
    """The previous release kept the weights under edge/ (Qdrant Edge) or, with --backend zvec,
    under zvec/, with no format.json: refused, untouched, with the commands that rebuild it, which
    work (the notebook stays where it is)."""
    data = tmp_path / "my data"
    (data / made / "gpt2.768").mkdir(parents=True)
    (data / "meta.json").write_text('{"manifest:gpt2": {}}')
    (data / "notebook").mkdir()
    before = sorted(p.name for p in data.iterdir())
    with pytest.raises(StoreError) as e:
        open_store("embedded", data)
    said = str(e.value)
    assert f"made by an earlier puffergpt ({made}, meta.json)" in said and "puffergpt load --model MODEL" in said
    assert sorted(p.name for p in data.iterdir()) == before
    r = subprocess.run(cli("generate", "hi", "--model", "demo", "--data", str(data)), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and said in r.stderr.replace("\n", " ") or said[:60] in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    move = said[said.index("`mkdir"):].split("`")[1]  # the commands, run as the user would
    subprocess.run(move, shell=True, check=True)
    open_store("embedded", data).close()
    assert sorted(p.name for p in (data / "old-store").iterdir()) == sorted([made, "meta.json"])
    assert (data / "notebook").is_dir()


def test_another_format_and_the_other_mode_are_named(tmp_path, caplog):
    EmbeddedStore(tmp_path / "z").close()
    with pytest.raises(StoreError, match=r"keeps the weights in zvec.*opened with everything on Qdrant Edge.*"
                                         r"puffergpt load --model MODEL --data NEWDIR"):
        EmbeddedStore(tmp_path / "z", fallback=True)
    EmbeddedStore(tmp_path / "q", fallback=True).close()
    with caplog.at_level(logging.WARNING, logger="puffergpt"):
        s = EmbeddedStore(tmp_path / "q")  # made in fallback mode, opened where zvec runs: kept, said
    assert s.fallback and [r.getMessage() for r in caplog.records if "Qdrant Edge" in r.getMessage()] == [
        f"puffergpt: {tmp_path / 'q'} keeps the weights on Qdrant Edge (made where zvec could not run), whose "
        f"searches are slower; to move them to zvec: `mkdir -p {tmp_path / 'q' / 'old-store'} && mv "
        f"{tmp_path / 'q' / 'format.json'} {tmp_path / 'q' / 'old-store'}/`, then `puffergpt load --model MODEL "
        f"--data {tmp_path / 'q'}`"]
    s.close()
    (tmp_path / "z" / "format.json").write_text('{"format": 99, "weights": "zvec"}')
    with pytest.raises(StoreError, match=r"format 99 \(zvec\); this puffergpt reads format 2.*mv .*format\.json"):
        open_store("embedded", tmp_path / "z")


@pytest.mark.parametrize("fallback", MODES, ids=["zvec", "fallback"])
def test_a_half_made_namespace_is_cleaned_up(tmp_path, fallback):
    """A namespace (and a zvec collection) is made under a hidden name and renamed into place;
    leftovers of a process killed half-way go at the next open."""
    s = EmbeddedStore(tmp_path, fallback=fallback)
    s.create_namespace("kept", 4, SCHEMA, partition="matrix")
    s.upsert("kept", ["a.0"], np.ones((1, 4), np.float32), {"matrix": ["a"], "row": [0]})
    s.close()
    kept = tmp_path / ("qdrant" if fallback else "zvec")
    half = [kept / ".new-0123" / "shard", kept / "kept" / ".new-4567" / "col"]
    for h in half:
        h.mkdir(parents=True)
        (h / "edge_config.json").write_text("{")  # what a kill in EdgeShard.create could leave
    s = EmbeddedStore(tmp_path, fallback=fallback)
    assert s.namespaces() == ["kept"] and s.count("kept") == 1 and not half[0].exists()
    assert fallback or not half[1].exists()
    s.close()


def test_disk_bytes_counts_only_this_stores_files(tmp_path):
    """A data directory shared with others (pgvector's local server, the notebook) is measured
    for this store's own files alone (the bench's disk_mb per engine)."""
    store = EmbeddedStore(tmp_path)
    try:
        store.create_namespace("w", 4, {"row": "int"}, "inner_product")
        store.upsert("w", ["a", "b"], np.ones((2, 4), np.float32), {"row": [0, 1]})
        store.put_meta("k", {"v": 1})
        own = store.disk_bytes()
        files = sum(p.stat().st_size for p in (tmp_path / "zvec").rglob("*") if p.is_file())
        assert own >= files > 0
        for other in ("postgres", "notebook"):
            (tmp_path / other).mkdir()
            (tmp_path / other / "big").write_bytes(b"x" * 1_000_000)
        assert store.disk_bytes() == own
    finally:
        store.close()


@pytest.fixture(scope="module")
def clean_load(tmp_path_factory, tiny_dir, tiny) -> dict:
    """The manifest of a clean load of the tiny model (the same in both modes)."""
    s = open_store("embedded", tmp_path_factory.mktemp("clean"))
    want = load.load(s, tiny, manifest.model_key(str(tiny_dir)), progress=False)
    s.close()
    return want


def made(data, fallback: bool):
    """A data directory of this mode (a command then opens it in that mode)."""
    EmbeddedStore(data, fallback=fallback).close()
    return data


@pytest.mark.parametrize("fallback", MODES, ids=["zvec", "fallback"])
def test_load_killed_mid_way_then_rerun(tmp_path, tiny_dir, clean_load, fallback):
    """SIGKILL during `puffergpt load`: the store opens, says the model is not loaded, and
    `generate` loads the rest: the manifest of a clean load and every document once."""
    key, want = manifest.model_key(str(tiny_dir)), clean_load
    data = made(tmp_path / "killed", fallback)
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
    assert 0 < written < want["documents"], written
    s.close()
    r = subprocess.run(cli("generate", "hi", "--model", str(tiny_dir), "--data", str(data), "--temperature", "0",
                           "-n", "2"), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]  # generate loads what is missing first
    s = open_store("embedded", data)
    got = s.get_meta(f"manifest:{key}")
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    assert {ns: s.count(ns) for ns in s.namespaces(f"{key}.")} == want["namespaces"]
    assert verify.verify(s, got) == {}
    s.close()


def test_killed_while_serving_after_a_load(tmp_path, tiny_dir, tiny):
    """SIGKILL while `generate` reads a loaded store (a text's keys being written): the store
    opens, its manifest is complete and every document matches it."""
    key = manifest.model_key(str(tiny_dir))
    s = open_store("embedded", tmp_path)
    want = load.load(s, tiny, key, progress=False)
    s.close()
    p = subprocess.Popen(cli("generate", "hi", "--model", str(tiny_dir), "--data", str(tmp_path),
                             "--temperature", "0", "-n", "120", "--json"), stdout=subprocess.PIPE, text=True)
    assert '"token_id"' in p.stdout.readline()  # serving: killed between tokens or inside one
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    s = open_store("embedded", tmp_path)
    assert s.get_meta(f"manifest:{key}") == want and verify.verify(s, want) == {}
    assert s.namespaces() == sorted(want["namespaces"])  # the text's keys went with the process
    s.close()


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from puffergpt.stores import open_store
    s = open_store("embedded", sys.argv[1])
    s.create_namespace("w", 8, {"row": "int"})
    s.upsert("w", [str(i) for i in range(100)], np.ones((100, 8), np.float32), {"row": np.arange(100)})
    s.put_meta("vouched", {"rows": 100})  # the documents are written out before this
    print("vouched", flush=True)
    i = 100
    while True:  # unflushed writes, killed at any point
        s.upsert("w", [str(i)], np.ones((1, 8), np.float32), {"row": [i]})
        i += 1
""")


@pytest.mark.parametrize("fallback", MODES, ids=["zvec", "fallback"])
def test_killed_while_writing_keeps_what_was_vouched_for(tmp_path, fallback):
    made(tmp_path, fallback)
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    assert p.stdout.readline().strip() == "vouched"
    time.sleep(1.0)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert fallback or not (tmp_path / "zvec" / "w" / "p0" / "closed").exists()  # so the next open replays zvec's log
    s = EmbeddedStore(tmp_path, fallback=fallback)
    assert s.get_meta("vouched") == {"rows": 100}
    n = s.count("w")
    print(f"{n - 100} unflushed documents were kept")
    assert n >= 100 and s.count("w", (("row", "<", 100),)) == 100
    hits = s.search("w", [Query(np.ones(8, np.float32))], "inner_product", include=("row",))
    assert len(hits.query) == n and np.allclose(hits.distance, 8.0)
    s.close()


KEYS = {"layer": "int", "head": "int", "pos": "int"}


def write_keys(s, ns: str, v: np.ndarray) -> None:
    n = len(v)
    s.upsert(ns, [f"k{i}" for i in range(n)], v, {"layer": [0] * n, "head": np.arange(n) % 2, "pos": np.arange(n)})


def test_a_dropped_texts_shard_is_emptied_and_reused(tmp_path):
    """A text's keys (an ephemeral namespace, on Qdrant Edge) dropped: the shard is emptied and
    the next text of the same layout gets it, holding none of the old keys; its searches match numpy."""
    from puffergpt.stores import qdrant_edge

    rng = np.random.default_rng(3)
    s = EmbeddedStore(tmp_path)
    keys = s.texts
    s.create_namespace("text-a", 8, KEYS, "inner_product", ephemeral=True)
    old = rng.standard_normal((40, 8)).astype(np.float32)
    write_keys(s, "text-a", old)
    a_dir = keys._dir("text-a")
    s.drop_namespace("text-a")
    assert "text-a" not in s.namespaces() and a_dir.is_dir()  # kept, empty, for the next
    s.create_namespace("text-b", 8, KEYS, "inner_product", ephemeral=True)
    assert keys._dir("text-b") == a_dir and s.count("text-b") == 0
    new = rng.standard_normal((10, 8)).astype(np.float32)
    write_keys(s, "text-b", new)
    x = rng.standard_normal(8).astype(np.float32)
    hits = s.search("text-b", [Query(x, (("head", "=", 1), ("pos", "<", 9)))], "inner_product", include=("pos",))
    want = new.astype(np.float64) @ x
    assert sorted(hits.attrs["pos"].tolist()) == [1, 3, 5, 7]  # only the new text's keys
    np.testing.assert_allclose(hits.distance, want[hits.attrs["pos"]], rtol=1e-5, atol=1e-6)
    # Another layout makes a shard of its own; the spare of this one waits.
    s.create_namespace("text-c", 4, KEYS, "inner_product", ephemeral=True)
    assert keys._dir("text-c") != a_dir
    # A shard is reused at most REUSE times, then really dropped.
    for _ in range(qdrant_edge.REUSE + 1):
        s.drop_namespace("text-b")
        s.create_namespace("text-b", 8, KEYS, "inner_product", ephemeral=True)
        write_keys(s, "text-b", new)
    assert keys._dir("text-b") != a_dir and not a_dir.exists()
    spares = [sp.dir for sp in keys._spare]
    s.close()
    assert spares == [] or not any(d.exists() for d in spares)
    assert list((tmp_path / "tmp").iterdir()) == []  # every text's shard gone with the store
