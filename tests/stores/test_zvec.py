"""The zvec store beyond the contract: persistence, the read-only weights path against numpy,
writes after searches, one process per data directory, its format version, SIGKILL during
and after a load, the demo model's greedy tokens against the embedded store and numpy, and
its search paths on a CPU without AVX-512 (emulated by qemu-user)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from helpers import held_by_another_process
from puffergpt import checkpoints, loading
from puffergpt.stores import Query, StoreError, open_store

SCHEMA = {"matrix": "str", "row": "int", "norm2": "float"}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from puffergpt.cli import main; main()", *args]


def weights(store, rng, dim=769, rows=3072, other=1000):
    """A weights-like namespace: a (rows, dim) matrix 'fc' among another matrix's rows."""
    w = rng.standard_normal((rows, dim)).astype(np.float32)
    o = rng.standard_normal((other, dim)).astype(np.float32)
    store.create_namespace("w", dim, SCHEMA)
    for name, m in (("other", o), ("fc", w)):
        store.upsert("w", [f"{name}.{i}" for i in range(len(m))], m,
                     {"matrix": [name] * len(m), "row": np.arange(len(m)), "norm2": (m.astype(np.float64) ** 2).sum(1)})
    return w


def test_documents_ids_and_attributes_survive_a_reopen(tmp_path):
    s = open_store("zvec", tmp_path)
    w = weights(s, np.random.default_rng(0), dim=8, rows=50, other=20)
    s.create_namespace("keys", 4, {"pos": "int"}, ephemeral=True)
    s.put_meta("manifest:x", {"a": 1})
    s.close()
    s = open_store("zvec", tmp_path)
    assert s.namespaces() == ["w"] and s.get_meta("manifest:x") == {"a": 1}  # the ephemeral one went
    assert s.count("w") == 70 and s.count("w", (("matrix", "=", "fc"), ("row", ">=", 45))) == 5
    np.testing.assert_array_equal(s.fetch("w", ["fc.7", "fc.3"]), w[[7, 3]])
    q = np.ones(8, np.float32)
    hits = s.search("w", [Query(q, (("matrix", "=", "fc"),), top_k=3)], "inner_product", include=("row", "matrix"))
    assert hits.attrs["row"].tolist() == np.argsort(-(w @ q))[:3].tolist() and set(hits.attrs["matrix"]) == {"fc"}
    assert json.loads((tmp_path / "zvec" / "format.json").read_text()) == {"format": 1}
    s.close()


def test_the_read_only_path_scores_like_numpy(tmp_path):
    """GPT-2's widest product (3,072 rows of 769) on the read-only path, on one thread and a
    batch on two: every score against float64 numpy, and a top-40 in numpy's order."""
    rng = np.random.default_rng(1)
    s = open_store("zvec", tmp_path, threads=1)
    w = weights(s, rng)
    x = rng.standard_normal((3, 769)).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    got = np.full((3, 3072), np.nan)
    hits = s.search("w", [Query(v, (("matrix", "=", "fc"),)) for v in x], "inner_product", include=("row",))
    got[hits.query, hits.attrs["row"]] = hits.distance
    assert s._ns["w"].read_only  # searched where zvec returns arrays
    diff = np.abs(got - want).max()
    print(f"max |zvec - numpy| over 3 x 3,072 scores: {diff:.2e} (scores up to {np.abs(want).max():.0f})")
    assert diff < 1e-5 * np.abs(want).max()  # float32 sums of 769 terms: ~1e-7 relative
    top = s.search("w", [Query(x[0], (("matrix", "=", "fc"),), top_k=40)], "inner_product", include=("row",))
    assert top.attrs["row"].tolist() == np.argsort(-want[0])[:40].tolist()
    s.close()
    s = open_store("zvec", tmp_path, threads=2)  # reopened: the batch's queries on two threads at once
    par = s.search("w", [Query(v, (("matrix", "=", "fc"),)) for v in x], "inner_product", include=("row",))
    again = np.full((3, 3072), np.nan)
    again[par.query, par.attrs["row"]] = par.distance
    np.testing.assert_array_equal(again, got)
    s.close()


def test_writes_after_searches_are_seen(tmp_path):
    """A read-only namespace reopens writable for a write, and read-only again for the next search."""
    s = open_store("zvec", tmp_path)
    weights(s, np.random.default_rng(2), dim=4, rows=10, other=5)
    q = np.ones(4, np.float32)
    assert len(s.search("w", [Query(q, (("matrix", "=", "fc"),))], "inner_product").query) == 10
    s.upsert("w", ["fc.3", "fc.10"], np.full((2, 4), 5, np.float32),
             {"matrix": ["fc", "fc"], "row": [3, 10], "norm2": [100.0, 100.0]})
    s.delete("w", (("matrix", "=", "fc"), ("row", "<", 2)))
    hits = s.search("w", [Query(q, (("matrix", "=", "fc"),), top_k=2)], "inner_product", include=("row",))
    assert sorted(hits.attrs["row"].tolist()) == [3, 10] and hits.distance.tolist() == [20.0, 20.0]
    assert s.count("w", (("matrix", "=", "fc"),)) == 9 and s.count("w", (("norm2", "=", 100.0),)) == 2
    s.close()


def test_filters_it_cannot_express_are_refused(tmp_path):
    s = open_store("zvec", tmp_path)
    weights(s, np.random.default_rng(3), dim=4, rows=4, other=1)
    q = Query(np.ones(4, np.float32), (("matrix", "<", "fc"),))
    with pytest.raises(StoreError, match="can't compare the text attribute 'matrix' with '<'"):
        s.search("w", [q], "inner_product")
    with pytest.raises(StoreError, match="finite numbers only"):
        s.search("w", [Query(np.ones(4, np.float32), (("norm2", "<", float("nan")),))], "inner_product")
    with pytest.raises(StoreError, match="at most 100,000 hits"):
        s.search("w", [Query(np.ones(4, np.float32), top_k=100_001)], "inner_product")
    s.close()


def test_one_process_at_a_time(tmp_path):
    with held_by_another_process("zvec", tmp_path) as pid:
        with pytest.raises(StoreError, match=rf"in use by another puffergpt process \(pid {pid}\).*--data DIR"):
            open_store("zvec", tmp_path)
    s = open_store("zvec", tmp_path)  # the lock went with the process
    with pytest.raises(StoreError, match=f"pid {os.getpid()}"):
        open_store("zvec", tmp_path)
    s.close()


def test_another_format_is_named_with_the_fix(tmp_path):
    open_store("zvec", tmp_path).close()
    (tmp_path / "zvec" / "format.json").write_text('{"format": 99}')
    with pytest.raises(StoreError, match=r"format 99.*reads format 1.*mv .*zvec.*puffergpt load --model MODEL "
                                         r"--backend zvec"):
        open_store("zvec", tmp_path)


def test_a_damaged_namespace_names_the_repair(tmp_path):
    s = open_store("zvec", tmp_path)
    weights(s, np.random.default_rng(4), dim=4, rows=4, other=1)
    s.close()
    col = tmp_path / "zvec" / "ns" / "w" / "col"
    for p in col.iterdir():  # its files gone: what a wiped disk or a bad restore leaves
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    s = open_store("zvec", tmp_path)
    with pytest.raises(StoreError, match=r"can't read namespace 'w'.*puffergpt load --repair"):
        s.count("w")
    s.close()


def _kill_load_at(data: Path, model: str, pct: int) -> None:
    """Start `puffergpt load --backend zvec` and SIGKILL it once its bar shows pct%."""
    p = subprocess.Popen(cli("load", "--model", model, "--backend", "zvec", "--data", str(data)),
                         stderr=subprocess.PIPE, text=True)
    seen, deadline = "", time.monotonic() + 300
    while time.monotonic() < deadline:
        seen += p.stderr.read(64) or ""
        found = [int(x) for x in re.findall(r"(\d+)%", seen)]
        if found and found[-1] >= pct or p.poll() is not None:
            break
    assert p.poll() is None, f"the load ended before it could be killed: {seen[-500:]}"
    os.kill(p.pid, signal.SIGKILL)
    p.wait()


def test_load_killed_mid_way_then_rerun(tmp_path, tiny_dir):
    """SIGKILL during `puffergpt load`: the store opens, says the model is not loaded, and the
    rerun completes with the manifest of a clean load and every document once."""
    key = loading.model_key(str(tiny_dir))
    clean = open_store("zvec", tmp_path / "clean")
    want = loading.load(clean, checkpoints.load(str(tiny_dir)), key, progress=False)
    clean.close()
    data = tmp_path / "killed"
    _kill_load_at(data, str(tiny_dir), 30)
    s = open_store("zvec", data)
    m = s.get_meta(f"manifest:{key}")
    assert m is not None and not m["complete"]
    written = sum(s.count(ns) for ns in s.namespaces(f"{key}."))
    assert 0 < written < want["documents"], written
    s.close()
    r = subprocess.run(cli("generate", "hi", "--model", str(tiny_dir), "--backend", "zvec", "--data", str(data),
                           "--temperature", "0", "-n", "2"), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]  # generate loads what is missing first
    s = open_store("zvec", data)
    got = s.get_meta(f"manifest:{key}")
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)
    assert {ns: s.count(ns) for ns in s.namespaces(f"{key}.")} == want["namespaces"]
    assert loading.verify(s, got) == {}
    s.close()


def test_killed_while_serving_after_a_load(tmp_path, tiny_dir):
    """SIGKILL while `generate` reads a loaded store (a text's keys being written): the store
    opens, its manifest is complete and every document matches it."""
    key = loading.model_key(str(tiny_dir))
    s = open_store("zvec", tmp_path)
    want = loading.load(s, checkpoints.load(str(tiny_dir)), key, progress=False)
    s.close()
    p = subprocess.Popen(cli("generate", "hi", "--model", str(tiny_dir), "--backend", "zvec", "--data", str(tmp_path),
                             "--temperature", "0", "-n", "120", "--json"), stdout=subprocess.PIPE, text=True)
    assert '"token_id"' in p.stdout.readline()  # serving: killed between tokens or inside one
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    s = open_store("zvec", tmp_path)
    assert s.get_meta(f"manifest:{key}") == want and loading.verify(s, want) == {}
    assert s.namespaces() == sorted(want["namespaces"])  # the text's keys went with the process
    s.close()


WRITER = textwrap.dedent("""
    import sys, numpy as np
    from puffergpt.stores import open_store
    s = open_store("zvec", sys.argv[1])
    s.create_namespace("w", 8, {"row": "int"})
    s.upsert("w", [str(i) for i in range(100)], np.ones((100, 8), np.float32), {"row": np.arange(100)})
    s.put_meta("vouched", {"rows": 100})  # the documents are written out before this
    print("vouched", flush=True)
    i = 100
    while True:  # unflushed writes, killed at any point
        s.upsert("w", [str(i)], np.ones((1, 8), np.float32), {"row": [i]})
        i += 1
""")


def test_killed_while_writing_keeps_what_was_vouched_for(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "vouched"
    time.sleep(1.0)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert not (tmp_path / "zvec" / "ns" / "w" / "closed").exists()  # so the next open replays zvec's log
    s = open_store("zvec", tmp_path)
    assert s.get_meta("vouched") == {"rows": 100}
    n = s.count("w")
    print(f"{n - 100} unflushed documents were kept")
    assert n >= 100 and s.count("w", (("row", "<", 100),)) == 100
    hits = s.search("w", [Query(np.ones(8, np.float32))], "inner_product", include=("row",))
    assert len(hits.query) == n and np.allclose(hits.distance, 8.0)
    s.close()


def test_demo_tokens_equal_the_embedded_store_and_numpy(tmp_path, demo):
    """`puffergpt load --backend zvec`, then greedy tokens: the same as the embedded store's and numpy's."""
    prompt = "The capital of France is"

    def tokens(*how: str) -> list[int]:
        r = subprocess.run(cli("generate", prompt, "--model", "demo", *how, "--data", str(tmp_path),
                               "--temperature", "0", "-n", "12", "--json"), capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-2000:]
        return [json.loads(line)["token_id"] for line in r.stdout.splitlines() if '"token_id"' in line]

    r = subprocess.run(cli("load", "--model", "demo", "--backend", "zvec", "--data", str(tmp_path)),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "ready" in r.stdout, r.stdout + r.stderr[-2000:]
    got = tokens("--backend", "zvec")
    assert len(got) == 12
    assert got == tokens("--backend", "embedded") == tokens("--engine", "reference")


PROBE = textwrap.dedent("""
    import sys, tempfile
    from pathlib import Path
    import numpy as np
    from puffergpt.stores import Query, open_store
    worst = 0.0
    with tempfile.TemporaryDirectory() as d:
        s = open_store("zvec", Path(d))
        rng = np.random.default_rng(0)
        for dim in [int(x) for x in sys.argv[1:]]:
            for eph in (False, True):  # the read-only path (weights) and the writable one (keys)
                ns = f"d{dim}{'e' if eph else ''}"
                s.create_namespace(ns, dim, {"row": "int"}, ephemeral=eph)
                w = rng.standard_normal((40, dim)).astype(np.float32)
                s.upsert(ns, [str(i) for i in range(40)], w, {"row": np.arange(40)})
                q = rng.standard_normal((2, dim)).astype(np.float32)
                qq, ww = q.astype(np.float64), w.astype(np.float64)
                nq, nw = np.linalg.norm(qq, axis=1), np.linalg.norm(ww, axis=1)
                want = {"inner_product": qq @ ww.T, "euclidean_squared": ((qq[:, None] - ww[None]) ** 2).sum(-1),
                        "cosine_distance": 1 - qq @ ww.T / np.outer(nq, nw)}
                for m in s.metrics:
                    h = s.search(ns, [Query(v) for v in q], m, include=("row",))
                    got = np.zeros((2, 40))
                    got[h.query, h.attrs["row"]] = h.distance
                    worst = max(worst, float(np.abs(got - want[m]).max() / max(1.0, np.abs(want[m]).max())))
        s.close()
    print("worst", worst)
""")
EVEX = "import ctypes, mmap; b = mmap.mmap(-1, 4096, prot=7); b.write(bytes([0x62, 0xf1, 0x7d, 0x48, 0xef, 0xc0, " \
       "0xc3])); ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(b)))()"  # vpxord zmm0; ret


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="emulates an x86-64 CPU; this machine is "
                    + os.uname().machine)
def test_searches_on_a_cpu_without_avx512():
    """zvec's .so is stripped (no function names), so the disassembly check that
    test_pg_portability.py makes of pgvector can't tell dispatched AVX-512 code from the rest.
    Instead every search path runs on an emulated Haswell (AVX2, FMA, no AVX-512): qemu-user
    stops a process at its first AVX-512 instruction with SIGILL, as the control shows."""
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        pytest.fail("qemu-x86_64 is missing: this check emulates a CPU without AVX-512 with it "
                    "(apt-get install qemu-user)")
    run = lambda *a: subprocess.run([qemu, "-cpu", "Haswell", sys.executable, *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=600)
    control = run("-c", EVEX)
    assert control.returncode in (-signal.SIGILL, 128 + signal.SIGILL), "qemu ran an AVX-512 instruction"
    r = run("-c", PROBE, "1", "3", "8", "15", "16", "17", "31", "32", "33", "64", "65", "768", "769", "3073")
    assert r.returncode == 0, f"zvec died on a CPU without AVX-512 (rc {r.returncode}): {r.stderr[-1500:]}"
    assert float(r.stdout.split()[-1]) < 1e-5, r.stdout


WITHOUT_AVX2 = textwrap.dedent("""
    import builtins, io
    real = builtins.open
    def cpuinfo(path, *a, **k):  # a Nehalem's flags (qemu-user shows the host's /proc/cpuinfo)
        if str(path) == "/proc/cpuinfo":
            return io.StringIO("processor\\t: 0\\nflags\\t\\t: fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt\\n")
        return real(path, *a, **k)
    builtins.open = cpuinfo
    from puffergpt.stores import StoreError, open_store
    try:
        open_store("zvec", "/nonexistent")
    except StoreError as e:
        print(e)
""")


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="emulates an x86-64 CPU; this machine is "
                    + os.uname().machine)
def test_a_cpu_without_avx2_gets_an_error_not_sigill():
    """zvec 0.8.0 dies with SIGILL on import without AVX2 (an emulated Nehalem shows it); the
    store reads /proc/cpuinfo first and says what is missing and which backend to use."""
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        pytest.fail("qemu-x86_64 is missing: this check emulates a CPU without AVX2 with it "
                    "(apt-get install qemu-user)")
    bare = subprocess.run([qemu, "-cpu", "Nehalem", sys.executable, "-c", "import zvec"], capture_output=True,
                          timeout=300)
    assert bare.returncode in (-signal.SIGILL, 128 + signal.SIGILL), "zvec now imports without AVX2: see NEEDS"
    r = subprocess.run([qemu, "-cpu", "Nehalem", sys.executable, "-c", WITHOUT_AVX2], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-1500:]
    assert "needs a CPU with AVX2, FMA, BMI1; this one lacks AVX2, FMA, BMI1" in r.stdout
    assert "--backend embedded" in r.stdout
