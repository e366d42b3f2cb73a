"""How often each token was seen in a model's training text, so that the embedding views
can say which rows barely moved from where training started.

A token seen a few times gets a few small gradient steps: its row of ``wte`` stays near its
random start, and it lies close to other such rows for no reason the text gives (on the
demo model " mole", seen 48 times, is 0.966 from " sounding"). The training script
(``scripts/train_demo.py``) writes the counts beside the model as ``token_counts.npz``:

    ids     (n,) uint16   the token ids seen, ascending
    counts  (n,) uint32   how many times each was seen
    meta    JSON text     {"version", "data": what was counted, "sources": {name: {"tokens",
                          "inputs": {path: sha256}}}, "tokens": the total}

A model without the file (GPT-2, a made model) has no counts: the views say they are
unknown, and never guess from the vectors.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

VERSION = 1
FILE = "token_counts.npz"
RARE_BELOW = 100  # a row seen fewer times is marked: its vector barely moved from its start
FREQUENCY_AXIS = 0.5  # |r| from which the map says its first axis is how often a word was seen
REWRITE = "python scripts/train_demo.py --counts-only --seed 3"  # the demo's counts again, from its data
UNKNOWN = ("how often each token was seen in training is unknown for this model (no token_counts.npz beside "
           "it, as for GPT-2): rare rows cannot be marked")


class CountsError(ValueError):
    """A counts file that can't be read as it is; the message says which command fixes it."""


@dataclass(frozen=True)
class TokenCounts:
    counts: np.ndarray  # (V,) int64: 0 for an id never seen
    meta: dict

    def of(self, token_id: int) -> int:
        return int(self.counts[token_id]) if 0 <= token_id < len(self.counts) else 0

    def rare(self, token_id: int) -> bool:
        return self.of(token_id) < RARE_BELOW


def write(path: Path, counts: np.ndarray, meta: dict) -> Path:
    """Counts (V,) as the sparse file above: only the ids seen."""
    counts = np.asarray(counts)
    if len(counts) > 1 << 16:
        raise ValueError("ids are stored as uint16: a vocabulary of at most 65,536")
    ids = np.flatnonzero(counts)
    meta = {**meta, "version": VERSION, "tokens": int(counts.sum())}
    np.savez_compressed(path, ids=ids.astype(np.uint16), counts=counts[ids].astype(np.uint32),
                        meta=np.array(json.dumps(meta, sort_keys=True)))
    return Path(path)


def read(path: Path, n_vocab: int) -> TokenCounts:
    """The file back as counts (n_vocab,); CountsError naming the fix when it doesn't read."""
    try:
        with np.load(path, allow_pickle=False) as z:
            ids, n, meta = z["ids"].astype(np.int64), z["counts"].astype(np.int64), json.loads(str(z["meta"]))
    except (OSError, KeyError, ValueError) as e:
        raise CountsError(f"{path}: not a token counts file ({e}): write it again with `{REWRITE}`") from None
    if meta.get("version") != VERSION:
        raise CountsError(f"{path}: token counts format {meta.get('version')!r}, this puffergpt reads {VERSION}: "
                          f"write it again with `{REWRITE}`")
    if len(ids) != len(n) or (len(ids) and (ids.min() < 0 or ids.max() >= n_vocab)):
        raise CountsError(f"{path}: ids outside the vocabulary of {n_vocab}: write it again with `{REWRITE}`")
    counts = np.zeros(n_vocab, np.int64)
    counts[ids] = n
    return TokenCounts(counts, meta)


@functools.lru_cache(maxsize=8)
def for_model(model: str, n_vocab: int) -> TokenCounts | None:
    """The counts beside a model ("demo", or a checkpoint directory); None when it has none
    (a hub model's counts are not published: unknown)."""
    from puffergpt.model.checkpoints import demo_dir

    where = demo_dir() if model == "demo" else Path(model)
    path = where / FILE
    return read(path, n_vocab) if path.is_file() else None


def log_counts(counts: TokenCounts, ids: list[int]) -> np.ndarray:
    """log(1 + count) of each id: the scale frequency is compared on (a never-seen id is 0)."""
    return np.log1p(np.array([counts.of(i) for i in ids], np.float64))


def frequency_axis(counts: TokenCounts | None, ids: list[int], x: np.ndarray) -> dict | None:
    """Pearson's r between a map's first axis and log(1 + count) over its words; None when
    the counts are unknown or either side has no spread."""
    if counts is None or len(ids) < 3:
        return None
    f, x = log_counts(counts, ids), np.asarray(x, np.float64)
    if np.ptp(f) == 0 or np.ptp(x) == 0:
        return None
    r = float(np.corrcoef(x, f)[0, 1])
    return {"pearson": r, "words": len(ids), "is_frequency": abs(r) >= FREQUENCY_AXIS}
