"""GPT-2 checkpoints in Hugging Face layout: read, validate, write, make.

A checkpoint is a directory with ``config.json`` and ``model.safetensors``, with
GPT-2's tensor names (``wte.weight``, ``h.0.attn.c_attn.weight``, ...) and
Hugging Face's Conv1D orientation: a linear layer's weight is (in, out), so
``y = x @ W + b``. fp16 and bf16 tensors are upcast to float32 on load.
A model is named "demo" (ships with puffergpt), a hub name ("gpt2", fetched by
``hub.py``) or a directory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from puffergpt.model import hub
from puffergpt.model.errors import CheckpointError  # also callers' name for it: checkpoints.CheckpointError
from puffergpt.model.tokenizer import VOCAB_SIZE


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
    def from_hf(cls, cfg: dict) -> GPT2Config:
        """From a Hugging Face ``config.json`` (GPT-2's field names)."""
        if not isinstance(cfg, dict):
            raise CheckpointError("config.json must hold a JSON object")
        for k in ("vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head"):
            v = cfg.get(k, 1)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise CheckpointError(f"config.json: {k} must be a positive integer, got {v!r}")
        if cfg.get("model_type", "gpt2") != "gpt2":
            raise CheckpointError(f"config.json has model_type {cfg.get('model_type')!r}; "
                                  "puffergpt runs GPT-2 checkpoints only")
        act = cfg.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise CheckpointError(f"config.json has activation_function {act!r}; "
                                  "puffergpt implements GPT-2's tanh GELU (gelu_new) only")
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


# --- which directory a model name means --------------------------------------------------

NEEDS = "(it needs config.json and model.safetensors)"

def demo_dir() -> Path:
    return Path(str(resources.files("puffergpt") / "models" / "demo"))


def check_model(model: str) -> None:
    """Raise unless ``model`` is a known name or an existing directory (no download)."""
    p = Path(model).expanduser()
    if model == "demo" or model in hub.HUB_MODELS:
        return
    if p.is_dir():
        missing = [f for f in ("config.json", "model.safetensors") if not (p / f).exists()]
        if missing:
            raise CheckpointError(f"{model} is not a checkpoint: {' and '.join(missing)} missing {NEEDS}")
        return
    if Path(model).expanduser().exists():
        raise CheckpointError(f"{model} is a file, not a checkpoint directory {NEEDS}")
    known = ", ".join(["demo", *hub.HUB_MODELS])
    raise CheckpointError(f"unknown model {model!r}: use one of {known}, or the path of a checkpoint directory")


def resolve(model: str, cache_dir: Path | None = None) -> tuple[Path, dict]:
    """A model name or path -> (local checkpoint directory, source info)."""
    check_model(model)
    if model == "demo":
        return demo_dir(), {"name": "demo"}
    if model in hub.HUB_MODELS:
        return hub.download(hub.HUB_MODELS[model], cache_dir), {"name": model} | asdict(hub.HUB_MODELS[model])
    p = Path(model).expanduser()
    return p, {"name": model, "path": str(p.resolve())}


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
            raise CheckpointError(f"{path} is not a checkpoint: {p.name} is missing {NEEDS}")
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
            raise CheckpointError(f"{st_path}: tensor {key} has shape {tuple(raw[key].shape)}, "
                                  f"expected {shape} from config.json")
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
    tensors = {k: np.ascontiguousarray(v, dtype=dtype) for k, v in params.items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
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
            gain = k.endswith("weight")
            out[k] = (1.0 + 0.1 * rng.standard_normal(shape)) if gain else 0.05 * rng.standard_normal(shape)
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
