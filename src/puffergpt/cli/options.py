"""What every command shares: the options, the data directory, one way to open a store and one
to open a model on it, and clear errors. The options are built from the settings' one table
(``puffergpt.settings``) and from the settings each installed backend declares
(``Store.settings``). The project's environment is read here and nowhere else: each setting's
variable (PUFFERGPT_DATA, PUFFERGPT_API_KEY, a backend's PUFFERGPT_DSN or TURBOPUFFER_API_KEY)."""

from __future__ import annotations

import json
import os
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import click

from puffergpt import settings, stores
from puffergpt.model import checkpoints, hub
from puffergpt.model.session import Run
from puffergpt.settings import Setting
from puffergpt.stores.base import StoreError, resolve

if TYPE_CHECKING:
    from puffergpt.search.engine import Engine
    from puffergpt.stores import Store

MODEL_HELP = "gpt2 (downloaded once), demo (ships with puffergpt), another GPT-2 family name, or a checkpoint directory"
SERVING = "serving.json"  # written by serve in its data directory: where it listens, for the other commands
# The engine a command asks: the searches, or the numpy GPT-2 they are held to.
ENGINE = click.option("--engine", type=click.Choice(["search", "reference"]), default="search", show_default=True,
                      help="search: every product a vector search; reference: the numpy GPT-2")


def fail(msg: str) -> NoReturn:
    raise click.ClickException(msg)


# --- options, from the settings ---------------------------------------------------------------

def option(name: str, **override):
    """The option of the server setting ``name`` (puffergpt.settings), as a decorator;
    ``override``: what one command sets otherwise (bench's --workers defaults to auto)."""
    return setting_option(settings.named(name), **override)


def options(*names: str):
    """The options of these settings, shown in this order."""
    def add(f):
        for name in reversed(names):
            f = option(name)(f)
        return f

    return add


def setting_option(s: Setting, **override):
    return click.option(s.flag, s.name, **{**option_args(s), **override})


def option_args(s: Setting) -> dict:
    """A setting's click option: its type, default (in the flag's unit), variable and help."""
    one, repeats = value_type(s.type)
    args = {"help": s.help, "metavar": s.metavar, "callback": _callback(s)}
    if one is bool:
        return args | {"is_flag": True}
    if repeats:  # its variable's values are separated by commas: read by the callback
        return args | {"multiple": True}
    shown = s.default / s.scale if s.scale != 1 else s.default
    return args | {"type": _click_type(s, one), "default": shown, "show_default": s.default is not None,
                   "envvar": s.env}


def value_type(t) -> tuple[type, bool]:
    """(the type of one value, whether the setting repeats): float | None -> (float, False),
    tuple[str, ...] -> (str, True)."""
    if typing.get_origin(t) is tuple:
        return typing.get_args(t)[0], True
    inner = [a for a in typing.get_args(t) if a is not type(None)]
    return value_type(inner[0]) if inner else (t, False)


def _click_type(s: Setting, one: type):
    if s.choices:
        return click.Choice(list(s.choices))
    if s.range:
        return (click.IntRange if one is int else click.FloatRange)(*s.range)
    return click.Path(path_type=Path) if one is Path else one


def _callback(s: Setting) -> Callable:
    """Each value checked by the setting's ``check`` (a bad one: the option and its variable
    named), a repeated option's values from its variable when none is given, the unit scaled."""
    def call(ctx, param, value):
        if value_type(s.type)[1] and not value and s.env:
            value = tuple(v.strip() for v in os.environ.get(s.env, "").split(",") if v.strip())
        try:
            value = checked(s, value)
        except (ValueError, StoreError) as e:
            raise click.BadParameter(str(e), param_hint=" / ".join(filter(None, (s.flag, s.env)))) from None
        return value * s.scale if s.scale != 1 and value is not None else value

    return call


def checked(s: Setting, value):
    if s.check is None or value is None:
        return value
    check = resolve(s.check)
    return tuple(dict.fromkeys(check(v) for v in value)) if isinstance(value, tuple) else check(value)


def client_key_option(f):
    """mcp --server URL --api-key KEY: the key to send, else PUFFERGPT_API_KEY's first."""
    keys = _callback(settings.named("api_keys"))

    def first(ctx, param, values: tuple[str, ...]) -> str | None:
        got = keys(ctx, param, values)
        return got[0] if got else None

    return click.option("--api-key", "api_key", multiple=True, callback=first, metavar="KEY",
                        help="with --server: the key the server was started with, sent as Authorization: Bearer "
                             "[env PUFFERGPT_API_KEY: its first key]")(f)


# --- the backends' own settings ---------------------------------------------------------------

class BackendCommand(click.Command):
    """A command that opens a store. Beside its own options it takes the flags the installed
    backends declare (pgvector's --dsn, a plugin's own: ``Store.settings``), found when it runs
    or shows its help rather than when the CLI is imported (reading every backend costs ~0.1 s).
    Their values reach the command as one ``backend_settings`` dict, by setting name (``store_settings``)."""

    store_params: list[Setting] | None = None

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        if self.store_params is None:
            self.store_params = backend_flags(self)
            self.params.extend(click.Option([s.flag, s.name], **option_args(s)) for s in self.store_params)
        return super().get_params(ctx)

    def invoke(self, ctx: click.Context):
        ctx.params["backend_settings"] = {s.name: ctx.params.pop(s.name) for s in self.store_params or ()}
        return super().invoke(ctx)


def backend_flags(command: click.Command) -> list[Setting]:
    """The settings with a flag of every installed backend, each flag once. One that can't be
    read is left out, saying so (choosing it says why); one that takes a command's own option
    is refused, naming both."""
    own = {n for p in command.params for n in (p.name, *p.opts)}
    found: dict[str, Setting] = {}
    for backend in stores.backends():
        try:
            declared = stores.settings_of(backend)
        except Exception as e:  # a broken plugin must not stop every command
            click.echo(f"puffergpt: the backend {backend!r} can't be read ({e}): its options are left out", err=True)
            continue
        for s in (s for s in declared if s.flag):
            if s.flag in own or s.name in own:
                fail(f"the backend {backend!r} declares {s.flag} ({s.name}), which `{command.name}` has already: "
                     f"give the setting another name")
            found.setdefault(s.flag, s)
    return list(found.values())


def store_settings(backend: str, given: dict) -> dict:
    """What the backend is opened with beside its data directory: each setting it declares, from
    its flag (``given``), else from its environment variable (read here, at the edge)."""
    return {s.name: given.get(s.name) or (os.environ.get(s.env) if s.env else None)
            for s in stores.settings_of(backend)}


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

def open_store(backend: str, data_dir: Path | None, given: dict | None = None) -> Store:
    """The store, with its settings from its flags (``given``) and the environment."""
    return stores.open_store(backend, default_data(data_dir), **store_settings(backend, given or {}))


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


def open_model(engine: str, model: str, backend: str, data_dir: Path | None, backend_settings: dict | None,
               max_running: int | None = None, text_ttl_s: float | None = None,
               output_search: str = settings.default("output_search")) -> Opened:
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
    store = open_store(backend, data_dir, backend_settings)
    try:
        e = search_engine(store, model, max_running, text_ttl_s, output_search)
    except BaseException:
        store.close()
        raise
    return Opened(e.open, e.config, e, store)


def open_served(model: str, backend: str, data_dir: Path | None, backend_settings: dict | None,
                notebook_path: Path | None, max_running: int | None = None, text_ttl_s: float | None = None,
                output_search: str = settings.default("output_search")):
    """(Opened, Notebook): what serve and mcp hold, the model on its store (loaded on first use)
    and the notebook; a notebook that can't be opened closes the store and says which option."""
    from puffergpt import notebook as nb

    opened = open_model("search", model, backend, data_dir, backend_settings, max_running, text_ttl_s, output_search)
    try:
        return opened, nb.Notebook(notebook_dir(notebook_path, data_dir))
    except nb.NotebookError as e:
        opened.close()
        fail(f"{e} (choose another with --notebook DIR)")


def search_engine(store, model: str, max_running: int | None = None, text_ttl_s: float | None = None,
                  output_search: str = settings.default("output_search")) -> Engine:
    """The model's engine on a store, loading it into the store on first use."""
    from puffergpt.search import load, manifest
    from puffergpt.search.scheduler import Scheduler

    ttl = {} if text_ttl_s is None else {"text_ttl_s": text_ttl_s}

    def engine() -> Engine:  # verified: never serve a damaged store
        return manifest.open_engine(store, model, verify=True, progress=True,
                                   scheduler=Scheduler(max_running) if max_running else None,
                                   output_search=output_search, **ttl)

    try:
        return engine()
    except manifest.NotLoaded as e:
        click.echo(f"{e.args[0].split(':')[0]}; loading it now", err=True)
        try:
            ckpt = checkpoints.load(model)
        except checkpoints.CheckpointError as ce:
            hint = " Or serve the demo model: `puffergpt serve --model demo`." if model in hub.HUB_MODELS else ""
            fail(f"{ce}{hint}")
        load.load(store, ckpt, manifest.model_key(model))
        del ckpt  # the weights leave the server's memory once they are documents
        return engine()
