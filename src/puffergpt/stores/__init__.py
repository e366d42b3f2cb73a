"""Vector database backends behind one protocol (``base.Store``), picked by name."""

from __future__ import annotations

from pathlib import Path

from puffergpt.stores.base import Hits, Query, Store, StoreError

BACKENDS = ("embedded",)


def open_store(backend: str, data_dir: Path | None = None, **options) -> Store:
    """The store named ``backend``; ``data_dir`` is where an embedded store keeps its files."""
    if backend == "embedded":
        from puffergpt.stores.embedded import EmbeddedStore

        return EmbeddedStore(data_dir, **options)
    raise StoreError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Hits", "Query", "Store", "StoreError", "open_store"]
