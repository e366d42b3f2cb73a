"""What every command shares: the options, the data directory, one way to open a store and one
to open a model on it, and clear errors. The project's environment is read here and nowhere
else: PUFFERGPT_DATA, PUFFERGPT_DSN and PUFFERGPT_API_KEY through the options, TURBOPUFFER_API_KEY,
TURBOPUFFER_REGION and TURBOPUFFER_BASE_URL in ``open_store``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from puffergpt.model import checkpoints, hub
from puffergpt.model.session import Run
from puffergpt.stores import BACKENDS

if TYPE_CHECKING:
    from puffergpt.search.engine import Engine
    from puffergpt.stores import Store

MODEL_HELP = "gpt2 (downloaded once), demo (ships with puffergpt), another GPT-2 family name, or a checkpoint directory"
SERVING = "serving.json"  # written by serve in its data directory: where it listens, for the other commands


def fail(msg: str) -> NoReturn:
    raise click.ClickException(msg)


# --- options ------------------------------------------------------------------------------

def data_option(f):
    return click.option("--data", "data_dir", type=click.Path(path_type=Path), envvar="PUFFERGPT_DATA", default=None,
                        help="where the embedded store keeps its files, pgvector's local server and the notebook "
                             "[env PUFFERGPT_DATA; default: the user data dir]")(f)


def dsn_option(f):
    return click.option("--dsn", envvar="PUFFERGPT_DSN", default=None,
                        help="PostgreSQL connection string for --backend pgvector; without one, a local server "
                             "under --data [env PUFFERGPT_DSN]")(f)


def backend_option(f):
    f = dsn_option(f)
    return click.option("--backend", type=click.Choice(list(BACKENDS)), default="embedded", show_default=True,
                        help="the vector database that holds the weights")(f)


def workers_option(f, default: str = "1"):
    def check(ctx, param, value):
        from puffergpt.server.processes.workers import count

        try:
            return count(value)
        except ValueError as e:
            raise click.BadParameter(str(e)) from None

    return click.option("--workers", default=default, show_default=True, callback=check, metavar="N|auto",
                        help="server processes, each on a core of its own, behind one address; auto: one a core. "
                             "Many learners at once need many (docs/how-it-works.md#every-core)")(f)


def _api_keys(ctx, param, values: tuple[str, ...]) -> tuple[str, ...]:
    """--api-key's values, else PUFFERGPT_API_KEY's keys (separated by commas), each checked."""
    from puffergpt.server.guards.auth import check_key

    got = values or tuple(k.strip() for k in os.environ.get("PUFFERGPT_API_KEY", "").split(",") if k.strip())
    try:
        return tuple(dict.fromkeys(check_key(k) for k in got))
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--api-key / PUFFERGPT_API_KEY") from None


def api_key_option(f):
    """serve --api-key KEY (repeatable), else PUFFERGPT_API_KEY's keys, separated by commas."""
    return click.option("--api-key", "api_keys", multiple=True, callback=_api_keys, metavar="KEY",
                        help="require this key (Authorization: Bearer KEY) on /v1 and on every request that changes "
                             "state or costs work; repeat for more [env PUFFERGPT_API_KEY, keys separated by "
                             "commas] (docs/deploy.md#keys)")(f)


def client_key_option(f):
    """mcp --server URL --api-key KEY: the key to send, else PUFFERGPT_API_KEY's first."""
    def first(ctx, param, values: tuple[str, ...]) -> str | None:
        keys = _api_keys(ctx, param, values)
        return keys[0] if keys else None

    return click.option("--api-key", "api_key", multiple=True, callback=first, metavar="KEY",
                        help="with --server: the key the server was started with, sent as Authorization: Bearer "
                             "[env PUFFERGPT_API_KEY: its first key]")(f)


def output_search_option(f):
    return click.option("--output-search", type=click.Choice(["exact", "approximate"]), default="exact",
                        show_default=True,
                        help="how the next token is found: exact scores every token vector; approximate searches "
                             "the store's HNSW index (built by `puffergpt load --output-index`), which may miss "
                             "some of the best (docs/benchmarks.md)")(f)


def notebook_option(f):
    return click.option("--notebook", "notebook_path", type=click.Path(path_type=Path), default=None,
                        help="the insight notebook, a git repository [default: DATA/notebook]")(f)


def default_data(data_dir: Path | None) -> Path:
    """--data, else the user data directory (~/.local/share/puffergpt on Linux)."""
    import platformdirs

    return data_dir or Path(platformdirs.user_data_dir("puffergpt"))


def notebook_dir(notebook_path: Path | None, data_dir: Path | None) -> Path:
    """--notebook, else <data dir>/notebook."""
    return notebook_path if notebook_path is not None else default_data(data_dir) / "notebook"


# --- errors -------------------------------------------------------------------------------

@contextmanager
def clear_errors(held: str = "") -> Iterator[None]:
    """Known failures become one clear line and a non-zero exit, not a traceback. ``held``: what
    to add when the data directory is another process's (serve: how several servers share)."""
    from puffergpt.notebook import NotebookError
    from puffergpt.stores.base import StoreError, StoreHeld

    try:
        yield
    except StoreHeld as e:
        fail(f"{e}{serving_hint(e)}{held}")
    except (checkpoints.CheckpointError, StoreError, NotebookError, ValueError, OSError) as e:
        fail(str(e))


def serving_hint(e) -> str:
    """When `puffergpt serve` holds the data directory: how to ask it instead."""
    try:
        s = json.loads((Path(e.data_dir) / SERVING).read_text())
    except (OSError, ValueError, TypeError):
        return ""
    if str(s.get("pid")) != str(e.holder):
        return ""
    return (f". It is `puffergpt serve` ({s.get('model')}) at {s['url']}: open that page, or ask it from here: "
            f"curl -sN {s['url']}v1/completions -H 'Content-Type: application/json' "
            f"-d '{{\"prompt\": \"Hello\", \"max_tokens\": 32, \"stream\": true}}'")


# --- a store, and a model on it -----------------------------------------------------------

def open_store(backend: str, data_dir: Path | None, dsn: str | None = None) -> Store:
    """The store, with its settings from the options and, for turbopuffer, the environment."""
    from puffergpt.stores import open_store as _open

    return _open(backend, default_data(data_dir), **store_settings(dsn))


def store_settings(dsn: str | None) -> dict:
    """What a store is opened with beside its data directory: --dsn, and turbopuffer's settings
    from the environment (read here, at the edge)."""
    return {"dsn": dsn, "api_key": os.environ.get("TURBOPUFFER_API_KEY"),
            "region": os.environ.get("TURBOPUFFER_REGION"), "base_url": os.environ.get("TURBOPUFFER_BASE_URL")}


def resolve_model(model: str | None) -> tuple[str, str | None]:
    """--model, or what serve, generate and analogy default to: GPT-2 small when it can be had,
    else the demo model, with a one-line note saying why."""
    if model is not None:
        return model, None
    model, note = hub.default_model()
    if note:
        click.echo(f"puffergpt: using the demo model. {note}", err=True)
    return model, note


@dataclass
class Opened:
    """A model ready to compute, and what holds it. ``open_run()`` opens the run of one text
    (``model.session.Run``): numpy's on the checkpoint (then ``engine`` and ``store`` are None) or
    the engine's searches on the store. Close it (or use it in ``with``) to close the store."""

    open_run: Callable[[], Run]
    config: checkpoints.GPT2Config
    engine: Engine | None = None
    store: Store | None = None

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_model(engine: str, model: str, backend: str, data_dir: Path | None, dsn: str | None,
               max_running: int | None = None, text_ttl_s: float | None = None,
               output_search: str = "exact") -> Opened:
    """The one way a command opens a model: ``engine`` "reference" is the numpy GPT-2 on the
    checkpoint; "search" the engine on the store, verified, the model loaded on first use, with
    at most ``max_running`` texts generating at once (a server's bound; default the scheduler's)
    and its texts' keys dropped by any server once unused for ``text_ttl_s`` (default 30 minutes);
    ``output_search``: how a text's next token is found unless it says (``Engine``)."""
    if engine == "reference":
        if output_search != "exact":
            fail("--output-search approximate searches a store's index: use it with --engine search")
        from puffergpt.model.reference import NumpyWeights

        ckpt = checkpoints.load(model)
        return Opened(lambda: Run(NumpyWeights(ckpt)), ckpt.config)
    checkpoints.check_model(model)  # a bad name or path says so before the store is opened
    store = open_store(backend, data_dir, dsn)
    try:
        e = search_engine(store, model, max_running, text_ttl_s, output_search)
    except BaseException:
        store.close()
        raise
    return Opened(e.open, e.config, e, store)


def open_served(model: str, backend: str, data_dir: Path | None, dsn: str | None, notebook_path: Path | None,
                max_running: int | None = None, text_ttl_s: float | None = None, output_search: str = "exact"):
    """(Opened, Notebook): what serve and mcp hold, the model on its store (loaded on first use)
    and the notebook; a notebook that can't be opened closes the store and says which option."""
    from puffergpt import notebook as nb

    opened = open_model("search", model, backend, data_dir, dsn, max_running, text_ttl_s, output_search)
    try:
        return opened, nb.Notebook(notebook_dir(notebook_path, data_dir))
    except nb.NotebookError as e:
        opened.close()
        fail(f"{e} (choose another with --notebook DIR)")


def search_engine(store, model: str, max_running: int | None = None, text_ttl_s: float | None = None,
                  output_search: str = "exact") -> Engine:
    """The model's engine on a store, loading it into the store on first use."""
    from puffergpt.search import loading
    from puffergpt.search.scheduler import Scheduler

    ttl = {} if text_ttl_s is None else {"text_ttl_s": text_ttl_s}

    def engine() -> Engine:  # verified: never serve a damaged store
        return loading.open_engine(store, model, verify=True, progress=True,
                                   scheduler=Scheduler(max_running) if max_running else None,
                                   output_search=output_search, **ttl)

    try:
        return engine()
    except loading.NotLoaded as e:
        click.echo(f"{e.args[0].split(':')[0]}; loading it now", err=True)
        try:
            ckpt = checkpoints.load(model)
        except checkpoints.CheckpointError as ce:
            hint = " Or serve the demo model: `puffergpt serve --model demo`." if model in hub.HUB_MODELS else ""
            fail(f"{ce}{hint}")
        loading.load(store, ckpt, loading.model_key(model))
        del ckpt  # the weights leave the server's memory once they are documents
        return engine()
