"""Damaged files of the embedded store, as a user meets them, in both its modes (the weights on
zvec; everything on Qdrant Edge where zvec can't run): `verify` names the damage and exits
non-zero without crashing; `generate` and `serve` refuse with the same message and the command
that fixes it; that command fixes it (the engine then gives numpy's tokens). Each kind is one a
probe found (issues 19 and 31: bit rot with the file's mtime restored) or one like it.

Every command runs in a child process: before the fix, some of these damages made the
database abort the process that read them."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import helpers
from helpers import vector_file
from puffergpt.model import tokenizer
from puffergpt.model.reference import Reference
from puffergpt.model.sampling import Sampling
from puffergpt.search import load, manifest
from puffergpt.search.manifest import open_engine
from puffergpt.stores.embedded import EmbeddedStore
from puffergpt.texts.text import Text

PROMPT = "Hello world, this is"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PUFFERGPT_DATA"}
    return subprocess.run([sys.executable, "-c", "from puffergpt.cli import main; main()", *args],
                          check=False, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tiny_dir, tiny) -> dict[str, Path]:
    """A data directory of each mode holding the tiny model, closed, to copy and damage."""
    out = {}
    for mode in ("zvec", "fallback"):
        out[mode] = data = tmp_path_factory.mktemp(mode) / "data"
        store = EmbeddedStore(data, fallback=mode == "fallback")
        load.load(store, tiny, manifest.model_key(str(tiny_dir)), progress=False)
        store.close()
    return out


def segment(data: Path, n_in: int) -> Path:
    """The one segment of a namespace's shard (the tiny model's: width 64, or 256 for mlp.c_proj)."""
    (seg,) = glob.glob(str(data / "qdrant" / f"*.{n_in}" / "shard" / "segments" / "*"))
    return Path(seg)


def collection(data: Path, matrix: str) -> Path:
    """The zvec collection of one matrix (its partition: p<code>, the code in namespace.json)."""
    for ns in data.glob("zvec/*"):
        codes = json.loads((ns / "namespace.json").read_text())["codes"]["matrix"]
        if matrix in codes:
            return ns / f"p{codes.index(matrix)}" / "col"
    raise AssertionError(f"no collection of {matrix} under {data}")


def xor(path: Path, offset: int, n: int, mask: int, step: int = 1) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = bytearray(f.read(n))
        b[::step] = bytes(x ^ mask for x in b[::step])
        f.seek(offset)
        f.write(b)


def flip_exponents(data: Path) -> None:
    """The probe's case: 64 exponent bytes flipped in a vector file, its mtime restored (bit rot
    leaves it alone): h.0.attn.c_attn's first 64 numbers doubled or halved."""
    s = EmbeddedStore(data, fallback=(data / "qdrant").exists())
    ns = next(n for n in s.namespaces() if n.endswith(".64"))
    first = s.fetch(ns, ["h.0.attn.c_attn.0"])[0]
    s.close()
    helpers.flip_exponents(*vector_file(data, ns, first))


def truncate_index(data: Path) -> None:
    (index,) = collection(data, "h.1.mlp.c_fc").glob("*/*.proxima")
    os.truncate(index, index.stat().st_size // 2)


def flip_id_map(data: Path) -> None:
    (table,) = collection(data, "wte").glob("idmap.0/*.sst")
    xor(table, table.stat().st_size // 3, 64, 0xFF)


def swap_matrices(data: Path) -> None:
    """Two matrices' names swapped in the list of partition codes: each collection now says it
    holds the other's rows (same shapes: both c_proj of width 64)."""
    p = next(p for p in data.glob("zvec/*.64/namespace.json"))
    lay = json.loads(p.read_text())
    codes = lay["codes"]["matrix"]
    i, j = codes.index("h.0.attn.c_proj"), codes.index("h.1.attn.c_proj")
    codes[i], codes[j] = codes[j], codes[i]
    p.write_text(json.dumps(lay))


def remove_scalars(data: Path) -> None:
    (ipc,) = collection(data, "h.0.mlp.c_proj").glob("*/scalar.*.ipc")
    ipc.unlink()


def flip_mappings(data: Path) -> None:
    p = segment(data, 64) / "mutable_id_tracker.mappings"
    xor(p, p.stat().st_size // 2, 64, 0xFF)


def set_deleted(data: Path) -> None:
    with open(segment(data, 64) / "vector_storage-inner_product" / "deleted" / "flags_a.dat", "r+b") as f:
        f.write(b"\xff" * 256)  # 2,048 documents' vectors flagged deleted


def edit_documents(data: Path) -> None:
    meta = json.loads((data / "meta.json").read_text())
    (key,) = [k for k in meta if k.startswith("manifest:")]
    meta[key]["documents"] += 5
    (data / "meta.json").write_text(json.dumps(meta))


# (mode, damage) -> what verify names (the rest of the message is the same for all). The fallback
# mode (Qdrant Edge, the default before zvec) keeps the kinds that take each path: a read-back
# mismatch, the reader aborting, a store error, the manifest.
ALTERED = r"h\.0\.attn\.c_attn: .*checksum.*\(altered\)"
DAMAGE = {
    ("zvec", "exponent bytes flipped in a vector file, mtime restored"): (flip_exponents, ALTERED),
    ("zvec", "a vector file truncated"): (truncate_index, r"namespace \S+\.64: .*can't read namespace"),
    ("zvec", "64 bytes flipped in the id map"): (flip_id_map, r"wte: namespace \S+\.64.* lost documents its ids list"),
    ("zvec", "two matrices' names swapped"): (
        swap_matrices, r"h\.0\.attn\.c_proj: document h\.0\.attn\.c_proj\.0 is missing from the search results"),
    ("zvec", "a scalar file removed"): (remove_scalars, r"namespace \S+\.256: .*can't read namespace"),
    ("fallback", "exponent bytes flipped in a vector file, mtime restored"): (flip_exponents, ALTERED),
    ("fallback", "64 bytes flipped in mutable_id_tracker.mappings"): (
        flip_mappings,
        r"namespace \S+\.64: its files are damaged \(opening it\).*reader died \(killed by signal",
    ),
    ("fallback", "deleted flags set"): (set_deleted, r"h\.0\.attn\.c_attn: .*lost the vectors of \d+ documents"),
    ("fallback", "manifest documents count edited"): (
        edit_documents, r"manifest: it says \d+ documents, its matrices hold"),
}


def error(r: subprocess.CompletedProcess) -> str:
    """The command's error message (what click prints after 'Error: '), progress bars left out."""
    assert "Traceback" not in r.stderr and r.returncode == 1, (r.returncode, r.stderr[-3000:])
    return r.stderr[r.stderr.index("Error: "):].strip()


@pytest.mark.parametrize("mode,kind", list(DAMAGE), ids=[f"{m}-{k}" for m, k in DAMAGE])
def test_damage_is_named_refused_and_repaired(tmp_path, clean, tiny_dir, tiny, mode, kind):
    from puffergpt.stores.zvec import NEEDS, cpu_lacks

    if mode == "zvec" and cpu_lacks():  # there the store keeps everything on Qdrant Edge: the fallback cases
        pytest.skip(f"zvec 0.8.0 needs {', '.join(NEEDS)}; this CPU lacks {', '.join(cpu_lacks())}")
    damage, named = DAMAGE[mode, kind]
    data = Path(shutil.copytree(clean[mode], tmp_path / "data"))
    damage(data)
    model, where = str(tiny_dir), ["--data", str(data)]

    said = error(cli("generate", PROMPT, "--model", model, *where, "-n", "4", "--temperature", "0"))
    assert re.search(named, said), said
    fix = f"run `puffergpt load --model {model} --backend embedded --data {data} --repair` to rewrite it"
    assert said.startswith(f"Error: the stored model {model!r} does not match its manifest") and said.endswith(fix), (
        said
    )
    assert error(cli("serve", "--model", model, *where, "--port", "0", timeout=120)) == said
    assert error(cli("verify", "--model", model, *where)) == said  # the message verify gives

    r = cli("load", "--model", model, *where, "--repair")
    assert r.returncode == 0, r.stderr[-3000:]
    store = EmbeddedStore(data, fallback=mode == "fallback")
    try:  # the engine, checking the store as serve does, gives numpy's tokens again
        t = Text(open_engine(store, model, verify=True).open())
        t.append(tokenizer.encode(PROMPT))
        assert [s.token_id for s in t.generate(4, Sampling(0, 40))] == Reference(tiny).greedy(
            tokenizer.encode(PROMPT), 4
        )
        t.close()
    finally:
        store.close()
    assert cli("verify", "--model", model, *where).returncode == 0
