"""The embedded store's weights on zvec, beyond the contract: the read-only path against numpy
(one thread and several), writes after searches, filters it can't express, damage, the digest
of its files (what zvec rewrites at every close left out, and shown harmless), and the CPUs it
needs: every search path on an emulated CPU without AVX-512, and the fallback to Qdrant Edge on
one without AVX2 (qemu-user). SIGKILL during a load, during writes and while serving:
tests/stores/test_embedded.py, in both modes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from puffergpt.search import load, manifest
from puffergpt.stores import Query, StoreError
from puffergpt.stores import zvec as zv
from puffergpt.stores.embedded import EmbeddedStore

SCHEMA = {"matrix": "str", "row": "int", "norm2": "float"}


def weights(store, rng, dim=769, rows=3072, other=1000):
    """A weights-like namespace, a collection per matrix: a (rows, dim) matrix 'fc' beside another."""
    w = rng.standard_normal((rows, dim)).astype(np.float32)
    o = rng.standard_normal((other, dim)).astype(np.float32)
    store.create_namespace("w", dim, SCHEMA, "inner_product", partition="matrix")
    for name, m in (("other", o), ("fc", w)):
        store.upsert("w", [f"{name}.{i}" for i in range(len(m))], m,
                     {"matrix": [name] * len(m), "row": np.arange(len(m)), "norm2": (m.astype(np.float64) ** 2).sum(1)})
    return w


def test_the_read_only_path_scores_like_numpy(tmp_path):
    """GPT-2's widest product (3,072 rows of 769) on its own collection, on one thread and a batch
    on two: every score against float64 numpy, and a top-40 in numpy's order."""
    rng = np.random.default_rng(1)
    s = EmbeddedStore(tmp_path, threads=1)
    w = weights(s, rng)
    x = rng.standard_normal((3, 769)).astype(np.float32)
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    got = np.full((3, 3072), np.nan)
    hits = s.search("w", [Query(v, (("matrix", "=", "fc"),)) for v in x], "inner_product", include=("row",))
    got[hits.query, hits.attrs["row"]] = hits.distance
    assert s.weights._ns["w"].read_only and len(s.weights._ns["w"].parts) == 2  # searched where zvec returns arrays
    diff = np.abs(got - want).max()
    print(f"max |zvec - numpy| over 3 x 3,072 scores: {diff:.2e} (scores up to {np.abs(want).max():.0f})")
    assert diff < 1e-5 * np.abs(want).max()  # float32 sums of 769 terms: ~1e-7 relative
    top = s.search("w", [Query(x[0], (("matrix", "=", "fc"),), top_k=40)], "inner_product", include=("row",))
    assert top.attrs["row"].tolist() == np.argsort(-want[0])[:40].tolist()
    s.close()
    s = EmbeddedStore(tmp_path, threads=2)  # reopened: the batch's queries on two threads at once
    par = s.search("w", [Query(v, (("matrix", "=", "fc"),)) for v in x], "inner_product", include=("row",))
    again = np.full((3, 3072), np.nan)
    again[par.query, par.attrs["row"]] = par.distance
    np.testing.assert_array_equal(again, got)
    s.close()


def test_writes_after_searches_are_seen(tmp_path):
    """A read-only collection reopens writable for a write, and read-only again for the next search."""
    s = EmbeddedStore(tmp_path)
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
    s = EmbeddedStore(tmp_path)
    weights(s, np.random.default_rng(3), dim=4, rows=4, other=1)
    with pytest.raises(StoreError, match="finite numbers only"):
        s.search("w", [Query(np.ones(4, np.float32), (("norm2", "<", float("nan")),))], "inner_product")
    with pytest.raises(StoreError, match="at most 100,000 hits"):
        s.search("w", [Query(np.ones(4, np.float32), top_k=100_001)], "inner_product")
    s.close()


def test_a_damaged_namespace_names_the_repair(tmp_path):
    s = EmbeddedStore(tmp_path)
    weights(s, np.random.default_rng(4), dim=4, rows=4, other=1)
    s.close()
    for col in (tmp_path / "zvec" / "w").glob("p*/col"):  # its files gone: what a wiped disk or a bad restore leaves
        for p in col.iterdir():
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    s = EmbeddedStore(tmp_path)
    with pytest.raises(StoreError, match=r"can't read namespace 'w'.*puffergpt load --repair"):
        s.count("w")
    s.close()


def test_the_digest_leaves_out_only_what_zvec_rewrites_and_that_is_harmless(tmp_path):
    """zvec 0.8.0 rewrites 20 bytes of each Flat index file whenever it closes the collection,
    even read-only (update times, a footer crc): the raw sha256 changes, the digest the stamp uses
    does not. Those bytes flipped: the footer's are refused by zvec itself when it opens the file;
    the linear meta's update time changes no search. Any other byte changes the digest."""
    s = EmbeddedStore(tmp_path)
    w = weights(s, np.random.default_rng(5), dim=16, rows=40, other=3)
    s.close()
    (index,) = (tmp_path / "zvec" / "w").glob("p1/col/*/*.proxima")  # fc's vectors
    holes = zv._rewritten(index)
    assert [n for _, n in holes] == [4, 8, 8], holes
    raw, digest = zv.datadir.sha256(index), zv._index_digest(index)
    time.sleep(1.1)  # update times are in seconds
    s = EmbeddedStore(tmp_path)
    x = np.random.default_rng(6).standard_normal(16).astype(np.float32)
    q = [Query(x, (("matrix", "=", "fc"),))]
    assert len(s.search("w", q, "inner_product").query) == 40
    s.close()
    assert zv.datadir.sha256(index) != raw and zv._index_digest(index) == digest
    footer, _, linear = holes

    def flipped(at: int) -> bytes:
        with open(index, "r+b") as f:
            f.seek(at)
            old = f.read(1)
            f.seek(at)
            f.write(bytes([old[0] ^ 0x01]))
        return old

    old = flipped(linear[0])  # the linear meta's update time: searches unchanged
    s = EmbeddedStore(tmp_path)
    hits = s.search("w", q, "inner_product", include=("row",))
    np.testing.assert_allclose(hits.distance[np.argsort(hits.attrs["row"])], w.astype(np.float64) @ x, rtol=1e-5,
                               atol=1e-5)
    s.close()
    for at in (footer[0] + 48, footer[0]):  # the footer's update time, its crc: zvec refuses the file
        flipped(at)
        s = EmbeddedStore(tmp_path)
        with pytest.raises(StoreError, match=r"can't read namespace 'w'.*puffergpt load --repair"):
            s.count("w")
        s.close()
        flipped(at)
    assert zv._index_digest(index) == digest
    start = index.read_bytes().find(w[0].tobytes())  # a vector's byte
    flipped(start + 3)
    assert zv._index_digest(index) != digest
    old = struct.unpack("<I", index.read_bytes()[footer[0]:footer[0] + 4])  # the file still parses
    assert zv._rewritten(index) == holes and old


PROBE = textwrap.dedent("""
    import sys, tempfile
    from pathlib import Path
    import numpy as np
    from puffergpt.stores import Query
    from puffergpt.stores.embedded import EmbeddedStore
    worst = 0.0
    with tempfile.TemporaryDirectory() as d:
        s = EmbeddedStore(Path(d), threads=2)
        assert s.fallback == (sys.argv[1] == "fallback"), s.fallback
        rng = np.random.default_rng(0)
        for dim in [int(x) for x in sys.argv[2:]]:
            ns = f"d{dim}"
            s.create_namespace(ns, dim, {"row": "int", "matrix": "str"}, partition="matrix")
            w = rng.standard_normal((40, dim)).astype(np.float32)
            s.upsert(ns, [str(i) for i in range(40)], w, {"row": np.arange(40), "matrix": ["a"] * 20 + ["b"] * 20})
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
x86 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="emulates an x86-64 CPU; this machine is "
                         + os.uname().machine)


def qemu(cpu: str, *args: str) -> subprocess.CompletedProcess:
    path = shutil.which("qemu-x86_64")
    if path is None:
        pytest.fail("qemu-x86_64 is missing: the CPU checks emulate CPUs with it (apt-get install qemu-user)")
    return subprocess.run([path, "-cpu", cpu, sys.executable, *args], capture_output=True, text=True, timeout=600)


@x86
def test_searches_on_a_cpu_without_avx512():
    """zvec's .so is stripped (no function names), so the disassembly check that
    test_pg_portability.py makes of pgvector can't tell dispatched AVX-512 code from the rest.
    Instead every search path runs on an emulated Haswell (AVX2, FMA, no AVX-512): qemu-user
    stops a process at its first AVX-512 instruction with SIGILL, as the control shows."""
    control = qemu("Haswell", "-c", EVEX)
    assert control.returncode in (-signal.SIGILL, 128 + signal.SIGILL), "qemu ran an AVX-512 instruction"
    r = qemu("Haswell", "-c", PROBE, "zvec", "1", "3", "8", "15", "16", "17", "31", "32", "33", "64", "65", "768",
             "769", "3073")
    assert r.returncode == 0, f"zvec died on a CPU without AVX-512 (rc {r.returncode}): {r.stderr[-1500:]}"
    assert float(r.stdout.split()[-1]) < 1e-5, r.stdout


NEHALEM = textwrap.dedent("""
    import builtins, io, runpy, sys
    real = builtins.open
    def cpuinfo(path, *a, **k):  # a Nehalem's flags (qemu-user shows the host's /proc/cpuinfo)
        if str(path) == "/proc/cpuinfo":
            return io.StringIO("processor\\t: 0\\nflags\\t\\t: fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt\\n")
        return real(path, *a, **k)
    builtins.open = cpuinfo
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


FELL_BACK = ("puffergpt: this CPU lacks AVX2, FMA, BMI1, which zvec needs: the embedded store keeps the weights "
             "on Qdrant Edge, whose searches are slower")


@x86
def test_a_cpu_without_avx2_falls_back_to_qdrant_edge(tmp_path, tiny_dir, tiny):
    """zvec 0.8.0 dies with SIGILL on import without AVX2 (an emulated Nehalem shows it): there the
    embedded store reads /proc/cpuinfo first, keeps everything on Qdrant Edge and says so in one
    line; its searches still equal numpy's, and `puffergpt generate` gives numpy's tokens."""
    from puffergpt.model.reference import Reference

    bare = qemu("Nehalem", "-c", "import zvec")
    assert bare.returncode in (-signal.SIGILL, 128 + signal.SIGILL), "zvec now imports without AVX2: see NEEDS"
    (tmp_path / "probe.py").write_text(PROBE)
    r = qemu("Nehalem", "-c", NEHALEM, str(tmp_path / "probe.py"), "fallback", "3", "64", "769")
    assert r.returncode == 0, r.stderr[-1500:]
    assert float(r.stdout.split()[-1]) < 1e-5, r.stdout
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == [FELL_BACK], r.stderr
    data = tmp_path / "data"  # loaded here (natively, as a machine without AVX2 would), generated there
    s = EmbeddedStore(data, fallback=True)
    load.load(s, tiny, manifest.model_key(str(tiny_dir)), progress=False)
    s.close()
    (tmp_path / "cli.py").write_text("from puffergpt.cli import main\nmain()\n")
    r = qemu("Nehalem", "-c", NEHALEM, str(tmp_path / "cli.py"), "generate", "Hello", "--model", str(tiny_dir),
             "--data", str(data), "-n", "3", "--temperature", "0", "--json")
    assert r.returncode == 0 and r.stderr.splitlines()[0] == FELL_BACK, r.stderr[-1500:]
    got = [json.loads(ln)["token_id"] for ln in r.stdout.splitlines() if '"token_id"' in ln]
    assert got == Reference(tiny).greedy([15496], 3)  # "Hello"
