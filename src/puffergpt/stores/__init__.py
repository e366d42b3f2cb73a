"""Vector database backends behind one seam (``base.Store``), found by name.

A backend is a ``Store`` subclass (docs/backends.md) and a factory that opens it: the class
itself, or a function. Backends are plugins: each installed package names its own in the
entry-point group ``puffergpt.backends`` (``name = "module:attribute"``, imported on first use,
so a backend's client library is needed only by those who pick it), puffergpt's three
included. ``register`` adds one from code; ``backends`` lists them all; ``open_store`` opens
one by name. A factory's ``settings`` (``puffergpt.settings.Setting``s: a DSN, a key) say what
it is opened with; the CLI reads them from its flags and the environment.

May import: ``puffergpt.settings`` (the shape of a setting). Nothing of GPT-2.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from importlib.metadata import entry_points
from pathlib import Path

from puffergpt.settings import Setting
from puffergpt.stores.base import Hits, Layout, Query, Store, StoreError, resolve

GROUP = "puffergpt.backends"
# The entry points are the mechanism: pyproject.toml registers these three in GROUP as any plugin
# does. They are written here too only for an install whose metadata predates that table (an
# editable install made before it, until `make install` reinstalls); the same three, so nothing
# disagrees.
SHIPPED = {
    "embedded": "puffergpt.stores.embedded:EmbeddedStore",  # zvec (weights) + Qdrant Edge (keys) under --data
    "pgvector": "puffergpt.stores.pgvector:open_pgvector",  # PostgreSQL: --dsn, or a local server
    "turbopuffer": "puffergpt.stores.turbopuffer:TurbopufferStore",  # the hosted service
}
Factory = str | Callable[..., Store]  # a factory, or where it lives: "module:attribute"
_registered: dict[str, Factory] = {}


def backends() -> dict[str, Factory]:
    """Every backend installed, by name: the entry points of GROUP (puffergpt's own three among
    them), then those ``register`` added. A name claimed twice is refused, naming both."""
    found: dict[str, Factory] = {}
    for name, target in [*((ep.name, ep.value) for ep in entry_points(group=GROUP)), *SHIPPED.items()]:
        if found.setdefault(name, target) != target:
            raise StoreError(f"two installed packages name a backend {name!r} ({found[name]} and {target}): "
                             f"uninstall one")
    return {**SHIPPED, **found, **_registered}


def register(name: str, factory: Factory | None = None):
    """Add a backend: ``register("mine", "pkg.module:MyStore")``, or ``@register("mine")`` on
    the class (or a function that returns the store). Its name then works in ``open_store``.
    A package installs one for every program with an entry point instead (docs/backends.md)."""
    def add(f):
        known = backends()
        if known.get(name, f) is not f:
            raise StoreError(f"a backend named {name!r} exists already ({known[name]!r}): choose another name")
        _registered[name] = f
        return f

    return add if factory is None else add(factory)


def check_backend(name: str) -> str:
    """``name`` if a backend of that name is installed, else a StoreError listing those that are."""
    known = backends()
    if name not in known:
        raise StoreError(f"unknown backend {name!r}: the installed backends are {', '.join(known)} "
                         f"(another comes as a package of its own: docs/backends.md#a-backend-in-a-package-of-its-own)")
    return name


def factory(backend: str) -> Callable[..., Store]:
    """The factory of the backend named ``backend``, imported if needed."""
    target = backends()[check_backend(backend)]
    return resolve(target) if isinstance(target, str) else target


def settings_of(backend: str) -> tuple[Setting, ...]:
    """What the backend says it is opened with: its factory's ``settings`` (a Store's class
    attribute, or set on a function factory); none if it says nothing."""
    return tuple(getattr(factory(backend), "settings", ()))


def open_store(backend: str, data_dir: Path | None = None, **options) -> Store:
    """The store named ``backend``; ``data_dir`` is where a store keeps its files (if it has any).

    The factory gets ``data_dir`` and those ``options`` its signature names: its settings (for
    ``pgvector``, ``dsn=``; without one it starts a local PostgreSQL under ``data_dir``; for
    ``turbopuffer``, ``api_key=``, ``region=`` and ``base_url=``), and what a worker of ``serve
    --workers`` adds (``Store.worker_options``)."""
    f = factory(backend)
    return f(**_taken(f, {"data_dir": data_dir, **options}))


def _taken(factory: Callable, options: dict) -> dict:
    """The options the factory's signature names (all of them if it takes **kwargs)."""
    params = inspect.signature(factory).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return options
    names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return {k: v for k, v in options.items() if k in names}


__all__ = ["GROUP", "Hits", "Layout", "Query", "Store", "StoreError", "backends", "check_backend", "factory",
           "open_store", "register", "settings_of"]
