"""Vector database backends behind one protocol (``base.Store``), picked by name."""

from __future__ import annotations

from pathlib import Path

from puffergpt.stores.base import Hits, Query, Store, StoreError

BACKENDS = ("embedded", "pgvector", "turbopuffer")


def open_store(backend: str, data_dir: Path | None = None, **options) -> Store:
    """The store named ``backend``; ``data_dir`` is where an embedded store keeps its files.

    ``pgvector`` takes ``dsn=`` (a PostgreSQL connection string); without one it starts a local
    PostgreSQL under ``data_dir``;
    ``turbopuffer`` takes ``api_key=``, ``region=`` and ``base_url=`` (another address than the
    region's, e.g. the tests' emulator). The CLI reads them from its options and the environment
    (PUFFERGPT_DSN, TURBOPUFFER_API_KEY, TURBOPUFFER_REGION, TURBOPUFFER_BASE_URL)."""
    dsn = options.pop("dsn", None)
    api_key, region, base_url = options.pop("api_key", None), options.pop("region", None), options.pop("base_url", None)
    if backend == "embedded":
        from puffergpt.stores.embedded import EmbeddedStore

        return EmbeddedStore(data_dir, **options)
    if backend == "pgvector":
        if not dsn:  # a local server under the data directory (pglocal), stopped on exit
            if data_dir is None:
                raise StoreError("the pgvector backend needs a PostgreSQL DSN (give --dsn or set PUFFERGPT_DSN), "
                                 "or a data directory (--data) for a local server")
            from puffergpt.stores.pglocal import open_local

            return open_local(Path(data_dir), **options)
        from puffergpt.stores.pgvector import PgvectorStore

        return PgvectorStore(dsn, **options)
    if backend == "turbopuffer":
        from puffergpt.stores.turbopuffer import TurbopufferStore

        return TurbopufferStore(api_key, region, base_url, **options)
    raise StoreError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Hits", "Query", "Store", "StoreError", "open_store"]
