"""Damaged files of the embedded store (Qdrant Edge), as a user meets them: `verify` names
the damage and exits non-zero without crashing; `generate` and `serve` refuse with the
same message and the command that fixes it; that command fixes it (the engine then gives
numpy's tokens). Each kind is one the third probe found (issue 19) or one like it.

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

from puffergpt import loading, tokenizer
from puffergpt.loading import open_engine
from puffergpt.reference import Reference
from puffergpt.sampling import Sampling
from puffergpt.stores import open_store
from puffergpt.text import Text

PROMPT = "Hello world, this is"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PUFFERGPT_DATA"}
    return subprocess.run([sys.executable, "-c", "from puffergpt.cli import main; main()", *args],
                          check=False, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def clean(tmp_path_factory, tiny_dir, tiny) -> Path:
    """A data directory holding the tiny model, closed, to copy and damage."""
    data = tmp_path_factory.mktemp("clean") / "data"
    store = open_store("embedded", data)
    loading.load(store, tiny, loading.model_key(str(tiny_dir)), progress=False)
    store.close()
    return data


def segment(data: Path, n_in: int) -> Path:
    """The one segment of a namespace's shard (the tiny model's: width 64, or 256 for mlp.c_proj)."""
    (seg,) = glob.glob(str(data / "edge" / f"*.{n_in}" / "shard" / "segments" / "*"))
    return Path(seg)


def xor(path: Path, offset: int, n: int, mask: int, step: int = 1) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = bytearray(f.read(n))
        b[::step] = bytes(x ^ mask for x in b[::step])
        f.seek(offset)
        f.write(b)


def flip_exponents(data: Path) -> None:
    # float32 little-endian: byte 3 holds the sign and 7 exponent bits; its lowest bit set or
    # cleared doubles or halves the number (a plausible value, so nothing fails downstream).
    xor(segment(data, 64) / "vector_storage-inner_product" / "vectors" / "chunk_0.mmap", 3, 256, 0x01, step=4)


def flip_mappings(data: Path) -> None:
    p = segment(data, 64) / "mutable_id_tracker.mappings"
    xor(p, p.stat().st_size // 2, 64, 0xFF)


def set_deleted(data: Path) -> None:
    with open(segment(data, 64) / "vector_storage-inner_product" / "deleted" / "flags_a.dat", "r+b") as f:
        f.write(b"\xff" * 256)  # 2,048 documents' vectors flagged deleted


def truncate_vectors(data: Path) -> None:
    os.truncate(segment(data, 64) / "vector_storage-inner_product" / "vectors" / "chunk_0.mmap", 1 << 20)


def flip_payload(data: Path) -> None:
    xor(segment(data, 64) / "payload_storage" / "page_0.dat", 4096, 256, 0xFF)


def remove_versions(data: Path) -> None:
    (segment(data, 256) / "mutable_id_tracker.versions").unlink()


def edit_documents(data: Path) -> None:
    meta = json.loads((data / "meta.json").read_text())
    (key,) = [k for k in meta if k.startswith("manifest:")]
    meta[key]["documents"] += 5
    (data / "meta.json").write_text(json.dumps(meta))


# damage -> what verify names (the rest of the message is the same for all)
DAMAGE = {
    "exponent bytes flipped in a vector file": (flip_exponents, r"h\.0\.attn\.c_attn: .*checksum.*\(altered\)"),
    "64 bytes flipped in mutable_id_tracker.mappings": (
        flip_mappings,
        r"namespace \S+\.64: its files are damaged \(opening it\).*reader died \(killed by signal",
    ),
    "deleted flags set": (set_deleted, r"h\.0\.attn\.c_attn: .*lost the vectors of \d+ documents"),
    "a vector file truncated": (truncate_vectors, r"failed to read from .*out of bounds"),
    "payload bytes flipped": (flip_payload, r"namespace \S+\.64: .*can't read namespace"),
    "the id tracker's versions removed": (remove_versions, r"h\.0\.mlp\.c_proj: 0 documents stored, 64 expected"),
    "manifest documents count edited": (edit_documents, r"manifest: it says \d+ documents, its matrices hold"),
}


def error(r: subprocess.CompletedProcess) -> str:
    """The command's error message (what click prints after 'Error: '), progress bars left out."""
    assert "Traceback" not in r.stderr and r.returncode == 1, (r.returncode, r.stderr[-3000:])
    return r.stderr[r.stderr.index("Error: "):].strip()


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damage_is_named_refused_and_repaired(tmp_path, clean, tiny_dir, tiny, kind):
    damage, named = DAMAGE[kind]
    data = Path(shutil.copytree(clean, tmp_path / "data"))
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
    store = open_store("embedded", data)
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
