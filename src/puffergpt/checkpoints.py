"""GPT-2 checkpoints in Hugging Face layout: load, download, verify, make.

A checkpoint is a directory with ``config.json`` and ``model.safetensors``, with
GPT-2's tensor names (``wte.weight``, ``h.0.attn.c_attn.weight``, ...) and
Hugging Face's Conv1D orientation: a linear layer's weight is (in, out), so
``y = x @ W + b``. fp16 and bf16 tensors are upcast to float32 on load.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import socket
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

import numpy as np

from puffergpt.tokenizer import VOCAB_SIZE


class CheckpointError(Exception):
    """A checkpoint that can't be found, fetched or read; the message says what to do."""


class DownloadFailed(CheckpointError):
    """A hub file that could not be had now; ``reason`` says why in a few words, on one line."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class GPT2Config:
    n_vocab: int = VOCAB_SIZE
    n_ctx: int = 1024  # n_positions: the context limit
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_hf(cls, cfg: dict) -> "GPT2Config":
        """From a Hugging Face ``config.json`` (GPT-2's field names)."""
        if not isinstance(cfg, dict):
            raise CheckpointError("config.json must hold a JSON object")
        for k in ("vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head"):
            v = cfg.get(k, 1)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CheckpointError(f"config.json: {k} must be a positive integer, got {v!r}")
        if cfg.get("model_type", "gpt2") != "gpt2":
            raise CheckpointError(f"config.json has model_type {cfg.get('model_type')!r}; puffergpt runs GPT-2 checkpoints only")
        act = cfg.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise CheckpointError(f"config.json has activation_function {act!r}; puffergpt implements GPT-2's tanh GELU (gelu_new) only")
        if cfg.get("n_inner") not in (None, 4 * cfg.get("n_embd", 768)):
            raise CheckpointError("config.json sets n_inner; puffergpt expects GPT-2's 4 * n_embd")
        c = cls(
            n_vocab=cfg.get("vocab_size", VOCAB_SIZE),
            n_ctx=cfg.get("n_positions", cfg.get("n_ctx", 1024)),
            n_embd=cfg.get("n_embd", 768),
            n_layer=cfg.get("n_layer", 12),
            n_head=cfg.get("n_head", 12),
            eps=cfg.get("layer_norm_epsilon", 1e-5),
        )
        if c.n_embd % c.n_head:
            raise CheckpointError(f"config.json: n_embd {c.n_embd} is not a multiple of n_head {c.n_head}")
        return c

    def to_hf(self) -> dict:
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            "vocab_size": self.n_vocab,
            "n_positions": self.n_ctx,
            "n_ctx": self.n_ctx,
            "n_embd": self.n_embd,
            "n_layer": self.n_layer,
            "n_head": self.n_head,
            "n_inner": None,
            "activation_function": "gelu_new",
            "layer_norm_epsilon": self.eps,
            "bos_token_id": 50256,
            "eos_token_id": 50256,
            "tie_word_embeddings": True,
        }


def expected_shapes(c: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every tensor a GPT-2 checkpoint must hold, with its shape."""
    C = c.n_embd
    shapes = {"wte.weight": (c.n_vocab, C), "wpe.weight": (c.n_ctx, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(c.n_layer):
        p = f"h.{i}."
        shapes |= {
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
            p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,),
        }
    return shapes


@dataclass(frozen=True)
class Checkpoint:
    name: str  # what the user asked for: "gpt2", "demo", or a path
    config: GPT2Config
    params: dict[str, np.ndarray] = field(repr=False)  # GPT-2 names -> float32 arrays
    source: dict = field(default_factory=dict)  # repo, revision, sha256 where known

    def n_params(self) -> int:
        return sum(v.size for v in self.params.values())


# --- where checkpoints come from ----------------------------------------------------------

@dataclass(frozen=True)
class HubModel:
    repo: str
    revision: str
    sha256: str | None = None  # of model.safetensors; None where not pinned
    size: int | None = None


HUB_MODELS = {
    "gpt2": HubModel("openai-community/gpt2", "607a30d783dfa663caf39e06633721c8d4cfcd7e",
                     "248dfc3911869ec493c76e65bf2fcf7f615828b0254c12b473182f0f81d3a707", 548_105_171),
    # The rest of the family loads through the same code; they are not pinned here.
    "gpt2-medium": HubModel("openai-community/gpt2-medium", "main"),
    "gpt2-large": HubModel("openai-community/gpt2-large", "main"),
    "gpt2-xl": HubModel("openai-community/gpt2-xl", "main"),
    "distilgpt2": HubModel("distilbert/distilgpt2", "main"),
}

OFFLINE_HINT = (
    "Offline, use one of: --model demo (a small model that ships with puffergpt), "
    "--model PATH (a directory with config.json and model.safetensors in Hugging Face layout), "
    "or `puffergpt make-model OUT --preset gpt2` for random weights with GPT-2 small's shapes."
)


def demo_dir() -> Path:
    return Path(str(resources.files("puffergpt") / "models" / "demo"))


def check_model(model: str) -> None:
    """Raise unless ``model`` is a known name or an existing directory (no download)."""
    p = Path(model).expanduser()
    if model == "demo" or model in HUB_MODELS:
        return
    if p.is_dir():
        missing = [f for f in ("config.json", "model.safetensors") if not (p / f).exists()]
        if missing:
            raise CheckpointError(f"{model} is not a checkpoint: {' and '.join(missing)} missing (it needs config.json and model.safetensors)")
        return
    if Path(model).expanduser().exists():
        raise CheckpointError(f"{model} is a file, not a checkpoint directory (it needs config.json and model.safetensors)")
    known = ", ".join(["demo", *HUB_MODELS])
    raise CheckpointError(f"unknown model {model!r}: use one of {known}, or the path of a checkpoint directory")


def resolve(model: str, cache_dir: Path | None = None) -> tuple[Path, dict]:
    """A model name or path -> (local checkpoint directory, source info)."""
    check_model(model)
    if model == "demo":
        return demo_dir(), {"name": "demo"}
    if model in HUB_MODELS:
        return download(HUB_MODELS[model], cache_dir), {"name": model} | asdict(HUB_MODELS[model])
    p = Path(model).expanduser()
    return p, {"name": model, "path": str(p.resolve())}


def sha256_file(path: Path, progress: bool = False) -> str:
    from tqdm import tqdm

    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                     desc=f"sha256 {path.name}", disable=not progress) as bar:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


def fetch_verified(fetch: Callable[[Path], Path], dest: Path, sha256: str | None, size: int | None = None,
                   progress: bool = True) -> Path:
    """Run ``fetch(tmpdir) -> file``, check its size and sha256, then move it to ``dest``.

    The file becomes visible at ``dest`` only once verified, so an interrupted or
    corrupt download never passes for a good one.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".download-") as tmp:
        got = Path(fetch(Path(tmp)))
        n = got.stat().st_size
        if size is not None and n != size:
            raise DownloadFailed(f"{dest.name}: downloaded {n:,} bytes, expected {size:,}; the download is incomplete or not the pinned file. Run the command again.",
                                 f"the download of {dest.name} was incomplete ({n:,} of {size:,} bytes) and was discarded")
        if sha256 is not None:
            digest = sha256_file(got, progress=progress)
            if digest != sha256:
                raise DownloadFailed(f"{dest.name}: sha256 {digest} does not match the pinned {sha256}; the file was discarded. Run the command again, or use a local checkpoint.",
                                     f"the downloaded {dest.name} did not match its pinned sha256 and was discarded")
        os.replace(got, dest)
    return dest


def default_cache_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("puffergpt")) / "checkpoints"


# Seconds to wait for the hub's first answer. huggingface_hub alone, with nothing cached,
# retries with backoff and then a 60 s metadata timeout (about 23 s offline); one bounded
# request first makes an unreachable hub fail in seconds.
HUB_TIMEOUT_S = 5.0


def default_model(timeout: float = HUB_TIMEOUT_S, progress: bool = True,
                  cache_dir: Path | None = None) -> tuple[str, str | None]:
    """The model to serve when none is named: ("gpt2", None) when GPT-2 small is in the
    cache (verified) or can be downloaded now; otherwise ("demo", note), the note one line
    saying why GPT-2 small could not be had and how to get it. A damaged cached file is
    removed, never used, and never keeps the demo model from serving."""
    m = HUB_MODELS["gpt2"]
    try:
        download(m, cache_dir, timeout=timeout, progress=progress)
        return "gpt2", None
    except DownloadFailed as e:
        why = e.reason
    except (CheckpointError, OSError) as e:  # e.g. a cache directory that can't be written
        why = _one_line(e)
    return "demo", (f"GPT-2 small could not be downloaded ({why}); to get it, run again with a network "
                    f"({m.size / 1e6:,.0f} MB, once) or pass --model PATH to a local copy in Hugging Face layout.")


def download(m: HubModel, cache_dir: Path | None = None, timeout: float = HUB_TIMEOUT_S, progress: bool = True) -> Path:
    """Download a hub checkpoint once into the cache, verified, and return its directory.

    Raises DownloadFailed within about ``timeout`` seconds when the hub can't be reached.
    """
    if not timeout > 0:
        raise ValueError(f"the hub timeout must be a positive number of seconds, got {timeout!r}")
    out = (cache_dir or default_cache_dir()) / m.repo.replace("/", "--") / m.revision
    damaged = check_cached(out / "model.safetensors", m.sha256, m.size, progress)
    for name, sha256, size in (("model.safetensors", m.sha256, m.size), ("config.json", None, None)):
        dest = out / name
        if dest.exists():
            continue
        try:
            probe_hub(m, name, timeout)
            with _hub_progress(progress):
                fetch_verified(_hub_fetch(m, name, timeout), dest, sha256, size, progress)
        except DownloadFailed as e:
            if not damaged:
                raise
            raise DownloadFailed(f"{damaged}, so it was removed; {e}", f"{damaged}, so it was removed; {e.reason}") from None
        except Exception as e:  # network errors come in many types across huggingface_hub versions
            raise DownloadFailed(f"could not download {m.repo}@{m.revision[:12]} from the Hugging Face hub ({type(e).__name__}: {e}). {OFFLINE_HINT}",
                                 f"the download failed: {type(e).__name__}: {_one_line(e)}") from None
        if sha256 is not None:
            _stamp(dest).write_text(_mark(dest, sha256))
    return out


def check_cached(path: Path, sha256: str | None, size: int | None, progress: bool = True) -> str | None:
    """None when ``path`` is absent or the pinned file; otherwise remove it and say why.

    Hashing 548 MB at every start is slow, so a verified file gets a stamp of its sha256,
    size and mtime; a file changed since (truncated, rewritten) no longer matches its stamp
    and is hashed again.
    """
    if sha256 is None or not path.exists():
        return None  # unpinned files are only ever moved into place complete (fetch_verified)
    stamp, n = _stamp(path), path.stat().st_size
    if stamp.is_file() and stamp.read_text() == _mark(path, sha256):
        return None
    if size is not None and n != size:
        why = f"the cached {path.name} was damaged ({n:,} of {size:,} bytes)"
    elif sha256_file(path, progress=progress) != sha256:
        why = f"the cached {path.name} was damaged (its sha256 is not the pinned one)"
    else:
        stamp.write_text(_mark(path, sha256))
        return None
    path.unlink()
    stamp.unlink(missing_ok=True)
    return why


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _mark(path: Path, sha256: str) -> str:
    st = path.stat()
    return f"{sha256} {st.st_size} {st.st_mtime_ns}\n"


def probe_hub(m: HubModel, filename: str, timeout: float = HUB_TIMEOUT_S) -> None:
    """Ask the hub for a file's metadata, one request with no retries; raise DownloadFailed
    (with a reason) unless it answers within ``timeout`` seconds.

    The request runs in a thread so that the deadline also bounds a DNS lookup, which no
    socket timeout covers.
    """
    import huggingface_hub

    url = huggingface_hub.hf_hub_url(m.repo, filename, revision=m.revision)
    host = urlparse(url).netloc
    result: list[BaseException | None] = []

    def ask() -> None:
        try:
            huggingface_hub.get_hf_file_metadata(url, timeout=timeout)
            result.append(None)
        except Exception as e:  # noqa: BLE001 - every failure becomes a reason below
            result.append(e)

    t = threading.Thread(target=ask, name="puffergpt-hub-probe", daemon=True)
    t.start()
    t.join(timeout)
    if result and result[0] is None:
        return
    reason = _why_unreachable(result[0], host, timeout) if result else f"{host} did not answer within {timeout:g} s"
    raise DownloadFailed(f"could not download {m.repo}@{m.revision[:12]} from the Hugging Face hub: {reason}. {OFFLINE_HINT}", reason)


def _why_unreachable(e: BaseException, host: str, timeout: float) -> str:
    """A few words for why a request to the hub failed, from the exception and its causes."""
    chain: list[BaseException] = []
    while e is not None and len(chain) < 10:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for x in chain:
        if type(x).__name__ == "OfflineModeIsEnabled":
            return "HF_HUB_OFFLINE is set"
        if isinstance(x, socket.gaierror):
            return f"no network: {host} could not be resolved"
        if isinstance(x, ConnectionRefusedError):
            return f"{host} refused the connection"
        if isinstance(x, TimeoutError) or "Timeout" in type(x).__name__:
            return f"{host} did not answer within {timeout:g} s"
        if isinstance(x, OSError) and x.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN):
            return f"no network: no route to {host}"
        status = getattr(x.__dict__.get("response"), "status_code", None)
        if isinstance(status, int):
            return f"{host} answered HTTP {status}"
    return f"{host} could not be reached: {type(chain[0]).__name__}: {_one_line(chain[0])}"


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300].rstrip(".")


def _hub_fetch(m: HubModel, filename: str, timeout: float) -> Callable[[Path], Path]:
    def fetch(tmp: Path) -> Path:
        import huggingface_hub

        return Path(huggingface_hub.hf_hub_download(m.repo, filename, revision=m.revision, local_dir=tmp, etag_timeout=timeout))
    return fetch


@contextmanager
def _hub_progress(progress: bool):
    """huggingface_hub's download bars off while ``progress`` is False (they are global)."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if progress or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


# --- reading and writing ----------------------------------------------------------------

def load(model: str, cache_dir: Path | None = None) -> Checkpoint:
    """Load a checkpoint by name ("gpt2", "demo", ...) or directory, as float32."""
    path, source = resolve(model, cache_dir)
    return load_dir(path, name=model, source=source)


def load_dir(path: Path, name: str | None = None, source: dict | None = None) -> Checkpoint:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    path = Path(path)
    cfg_path, st_path = path / "config.json", path / "model.safetensors"
    for p in (cfg_path, st_path):
        if not p.exists():
            raise CheckpointError(f"{path} is not a checkpoint: {p.name} is missing (it needs config.json and model.safetensors)")
    try:
        config = GPT2Config.from_hf(json.loads(cfg_path.read_text()))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from None
    try:
        raw = _load_tensors(st_path, load_file)
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{st_path} could not be read as safetensors: {e}") from None
    params = {}
    for key, shape in expected_shapes(config).items():
        if key not in raw:
            raise CheckpointError(f"{st_path}: tensor {key} is missing")
        if tuple(raw[key].shape) != shape:
            raise CheckpointError(f"{st_path}: tensor {key} has shape {tuple(raw[key].shape)}, expected {shape} from config.json")
        params[key] = np.ascontiguousarray(raw[key], dtype=np.float32)
    return Checkpoint(name or str(path), config, params, source or {"path": str(path)})


def _load_tensors(st_path: Path, load_file) -> dict[str, np.ndarray]:
    """Tensors by GPT-2 name; bf16 (which numpy lacks) is widened by hand."""
    try:
        raw = load_file(str(st_path))
    except (TypeError, ValueError):  # bf16 has no numpy dtype: read the raw bits
        raw = _load_bf16(st_path)
    # GPT2LMHeadModel.save_pretrained prefixes "transformer."; the hub files don't.
    return {k.removeprefix("transformer."): v for k, v in raw.items()}


def _load_bf16(st_path: Path) -> dict[str, np.ndarray]:
    data = st_path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    out = {}
    for k, info in header.items():
        if k == "__metadata__":
            continue
        a, b = info["data_offsets"]
        buf = data[8 + n + a: 8 + n + b]
        if info["dtype"] == "BF16":
            bits = np.frombuffer(buf, dtype=np.uint16).astype(np.uint32) << 16
            out[k] = bits.view(np.float32).reshape(info["shape"])
        else:
            dt = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64,
                  "I32": np.int32, "U8": np.uint8, "I8": np.int8, "BOOL": np.bool_}.get(info["dtype"])
            if dt is not None:  # other dtypes are buffers GPT-2 does not need
                out[k] = np.frombuffer(buf, dtype=dt).reshape(info["shape"])
    return out


def save_dir(path: Path, config: GPT2Config, params: dict[str, np.ndarray], dtype=np.float32) -> Path:
    from safetensors.numpy import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v, dtype=dtype) for k, v in params.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config.to_hf(), indent=2) + "\n")
    return path


# --- seeded random checkpoints -----------------------------------------------------------

PRESETS = {
    # tiny: GPT-2's full vocabulary (so the real tokenizer works), everything else small.
    "tiny": GPT2Config(n_vocab=VOCAB_SIZE, n_ctx=128, n_embd=64, n_layer=2, n_head=4),
    "gpt2": GPT2Config(),
}


def random_params(c: GPT2Config, seed: int) -> dict[str, np.ndarray]:
    """GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 n_layer).
    Unlike GPT-2 (gains 1, biases 0), layer-norm gains are 1 + N(0, 0.1) with N(0, 0.05)
    biases, and matrix biases N(0, 0.02), so that tests exercise every parameter and the
    bias column of every document."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, shape in expected_shapes(c).items():
        if ".ln_" in k or k.startswith("ln_f"):
            out[k] = (1.0 + 0.1 * rng.standard_normal(shape)) if k.endswith("weight") else 0.05 * rng.standard_normal(shape)
        else:
            std = 0.02 / np.sqrt(2 * c.n_layer) if k.endswith("c_proj.weight") else 0.02
            out[k] = std * rng.standard_normal(shape)
        out[k] = out[k].astype(np.float32)
    return out


def make_model(out: Path, preset: str, seed: int) -> Path:
    if preset not in PRESETS:
        raise CheckpointError(f"unknown preset {preset!r}: use one of {', '.join(PRESETS)}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise CheckpointError(f"{out} exists and is not empty; choose a new directory")
    return save_dir(out, PRESETS[preset], random_params(PRESETS[preset], seed))
