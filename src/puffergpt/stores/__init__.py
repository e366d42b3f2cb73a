"""Vector database backends behind one seam (``base.Store``), found by name in ``BACKENDS``.

A backend is a ``Store`` subclass (docs/backends.md) and a factory that opens it: the class
itself, or a function. ``BACKENDS`` maps each name to its factory, or to where it lives as
``"module:attribute"`` (imported on first use, so a backend's client library is needed only
by those who pick it). ``register`` adds one; ``open_store`` opens one by name.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

from puffergpt.stores.base import Hits, Layout, Query, Store, StoreError, resolve

BACKENDS: dict[str, str | Callable[..., Store]] = {
    "embedded": "puffergpt.stores.embedded:EmbeddedStore",  # zvec (weights) + Qdrant Edge (keys) under --data
    "pgvector": "puffergpt.stores.pgvector:open_pgvector",  # PostgreSQL: --dsn, or a local server
    "turbopuffer": "puffergpt.stores.turbopuffer:TurbopufferStore",  # the hosted service
}


def register(name: str, factory: str | Callable[..., Store] | None = None):
    """Add a backend: ``register("mine", "pkg.module:MyStore")``, or ``@register("mine")`` on
    the class (or a function that returns the store). Its name then works in ``open_store``."""
    def add(f):
        if BACKENDS.get(name, f) is not f:
            raise StoreError(f"a backend named {name!r} exists already ({BACKENDS[name]!r}): choose another name")
        BACKENDS[name] = f
        return f

    return add if factory is None else add(factory)


def open_store(backend: str, data_dir: Path | None = None, **options) -> Store:
    """The store named ``backend``; ``data_dir`` is where a store keeps its files (if it has any).

    The factory gets ``data_dir`` and those ``options`` its signature names, so the CLI may pass
    every backend's settings, of which each takes its own:
    ``pgvector`` takes ``dsn=`` (a PostgreSQL connection string); without one it starts a local
    PostgreSQL under ``data_dir``;
    ``turbopuffer`` takes ``api_key=``, ``region=`` and ``base_url=`` (another address than the
    region's, e.g. the tests' emulator). The CLI reads them from its options and the environment
    (PUFFERGPT_DSN, TURBOPUFFER_API_KEY, TURBOPUFFER_REGION, TURBOPUFFER_BASE_URL)."""
    target = BACKENDS.get(backend)
    if target is None:
        raise StoreError(f"unknown backend {backend!r}: use one of {', '.join(BACKENDS)}")
    factory = resolve(target) if isinstance(target, str) else target
    return factory(**_taken(factory, {"data_dir": data_dir, **options}))


def _taken(factory: Callable, options: dict) -> dict:
    """The options the factory's signature names (all of them if it takes **kwargs)."""
    params = inspect.signature(factory).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return options
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in options.items() if k in names}


__all__ = ["BACKENDS", "Hits", "Layout", "Query", "Store", "StoreError", "open_store", "register"]
