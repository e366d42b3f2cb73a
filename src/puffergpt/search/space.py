"""Room on the disk before a store writes, so that a full disk is an error naming it, never a
signal: the embedded store writes a text's keys through memory maps (Qdrant Edge), and a page
of a map that finds no room on the disk kills the process with SIGBUS, which nothing can catch.

So what is about to be written is checked against the disk's free space first (``check``):
a load (``load.load``: its documents), the server's spare text namespaces (``Engine.ready_texts``)
and each text opened (``Engine.open``: its keys at a full context). What the estimates leave
out is kept spare (MARGIN). A store whose disk is not on this machine (a database server) has
no free space to ask (``Store.free_bytes``: None), and nothing is checked.
"""

from __future__ import annotations

from puffergpt.model.checkpoints import GPT2Config
from puffergpt.stores.base import NoSpace, Store

MB = 1 << 20
MARGIN = 64 * MB  # kept free beside every estimate: metadata, a store's own files, the notebook
NAMESPACE_BYTES = 8 * MB  # a text's namespace on the embedded store, empty (16 spares: ~120 MB on tmpfs)
OVERHEAD = 3  # bytes a store keeps per byte of vector (ids, attributes, its segments): ~2.1-2.6 measured


def check(store: Store, need: int, what: str) -> None:
    """NoSpace naming the disk, what needs the room and how much, where the store's disk has
    less than ``need`` and MARGIN free."""
    free = store.free_bytes()
    if free is not None and free < need + MARGIN:
        raise NoSpace(f"{what} needs about {mb(need + MARGIN)} MB on the disk holding {store.path}, which has "
                      f"{mb(free)} MB free: free some space there, or give --data a larger disk")


def load_bytes(rows_and_dims: list[tuple[int, int]]) -> int:
    """About what a load's documents take: (rows, dim) a matrix, float32 each, OVERHEAD times."""
    return OVERHEAD * sum(rows * dim * 4 for rows, dim in rows_and_dims)


def text_bytes(config: GPT2Config) -> int:
    """About what one text's keys take at a full context: an empty namespace, then a key and a
    value a layer and a position, n_embd floats each, OVERHEAD times."""
    return NAMESPACE_BYTES + OVERHEAD * config.n_layer * 2 * config.n_ctx * config.n_embd * 4


def mb(n: int) -> int:
    return -(-n // MB)
