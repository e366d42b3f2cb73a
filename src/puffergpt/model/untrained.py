"""Token vectors that were never trained, so the embedding views can say so.

A token the training text never contains keeps a row of wte that no gradient touched;
the demo model sets all of them to one shared vector, so they are exact duplicates of
each other: found at load time by hashing each row's bytes (a tenth of a second for
50,257 rows). The manifest keeps them as ranges of ids, ``[[first, last + 1], ...]``
(the demo's 45,000 ids are 3,900 ranges), which the engine reads back as a set.
A checkpoint with no duplicate rows (GPT-2) has none.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict

import numpy as np


def rows(wte: np.ndarray) -> list[int]:
    """Ids of the rows of wte (V, C) that are byte for byte the same as another row."""
    groups: dict[bytes, list[int]] = defaultdict(list)
    for i, r in enumerate(np.ascontiguousarray(wte, np.float32)):
        groups[hashlib.blake2b(r.tobytes(), digest_size=16).digest()].append(i)
    return sorted(i for g in groups.values() if len(g) > 1 for i in g)


def ranges(ids: list[int]) -> list[list[int]]:
    """Sorted ids -> runs of consecutive ids as [first, last + 1]."""
    out: list[list[int]] = []
    for i in ids:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([int(i), int(i) + 1])
    return out


def manifest_field(wte: np.ndarray) -> list[list[int]]:
    """What ``load.load`` writes to the manifest as ``untrained``."""
    return ranges(rows(wte))


def from_manifest(m: dict) -> frozenset[int] | None:
    """The untrained ids a manifest records; None when a store made by an older puffergpt
    did not record them (the views then say so, and that `puffergpt load` records them)."""
    r = m.get("untrained")
    if not isinstance(r, list):
        return None
    return frozenset(i for a, b in r for i in range(int(a), int(b)))
