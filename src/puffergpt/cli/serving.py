"""``puffergpt serve``: the playground and the HTTP API on one model, loaded first if needed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import click

from puffergpt import settings
from puffergpt.cli.options import (
    MODEL_HELP,
    SERVING,
    BackendCommand,
    clear_errors,
    default_data,
    notebook_dir,
    open_served,
    options,
    resolve_model,
    store_settings,
)
from puffergpt.model import checkpoints

SERVE = tuple(s.name for s in settings.SERVER if s.flag)  # serve takes every server setting that has a flag


@click.command(cls=BackendCommand)
@click.option("--model", default=None,
              help=MODEL_HELP + " [default: gpt2, or the demo model when GPT-2 small can't be downloaded]")
@options(*SERVE)
def serve(model, backend_settings, **given) -> None:
    """Serve the playground and the HTTP API; load the model first if needed."""
    from puffergpt.server.guards.auth import check_exposure
    from puffergpt.server.guards.hosts import trusted_hosts

    s = SimpleNamespace(**given)  # every serve setting, by its name in puffergpt.settings
    if s.api_key_file is not None:  # checked by its option already: keys out of the command line
        from puffergpt.server.guards.auth import read_key_file

        given["api_keys"] = s.api_keys = tuple(dict.fromkeys((*s.api_keys, *read_key_file(s.api_key_file))))
    try:  # before anything loads: a server open to anyone, a bad name
        check_exposure(s.host, s.api_keys, s.public_read_only, s.no_auth)
        trusted = trusted_hosts(s.host, s.allowed_hosts, s.public_url)  # no DNS rebinding onto a local server
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if s.no_auth:
        click.echo(f"puffergpt: --no-auth: anyone who reaches {s.host} may generate and write the notebook", err=True)
    model, fallback = resolve_model(model)
    with clear_errors(held=SHARED):
        opened, notebook = open_served(model, s.backend, s.data_dir, backend_settings, s.notebook_path, s.max_running,
                                       s.text_ttl_s, s.output_search)
    config = server_config(given, trusted_hosts=trusted, fallback=fallback)
    shown = f"[{s.host}]" if ":" in s.host else s.host  # an IPv6 address goes in brackets in a URL
    url = f"http://{shown}:{s.port}/"
    serving = default_data(s.data_dir) / SERVING if s.backend == "embedded" else None
    with opened, clear_errors(), announced(serving, {"url": url, "pid": os.getpid(), "model": model}):
        room_for_spares(opened.store, s.workers, s.max_running)  # before the address: a full disk is an error
        where = f"puffergpt: {model} on {s.backend}, {opened.engine.manifest['documents']:,} documents"
        if s.workers == 1:
            click.echo(f"{where}, one process. Open {url}")
            serve_here(opened, model, config, notebook, s.host, s.port, s.max_running)
        else:
            store_options = {**store_settings(s.backend, backend_settings), **opened.store.worker_options()}
            spec = worker_spec(model, given, store_options, config)
            serve_with_workers(spec, s.workers, s.host, s.port, f"{where}, {s.workers} worker processes. Open {url}")


def room_for_spares(store, workers: int, max_running: int) -> None:
    """NoSpace (search/space.py) where the disk can't hold every process's spare text namespaces
    and its reserve."""
    from puffergpt.search import space
    from puffergpt.server.processes.workers import share

    n = workers * min(share(max_running, workers), store.keeps_spares)
    if store.reserve_path() is None:
        space.check(store, n * space.NAMESPACE_BYTES, f"the server's {n} spare text namespaces")
        return
    space.check(store, n * space.NAMESPACE_BYTES + workers * space.RESERVE,
                f"the server's {n} spare text namespaces and {space.mb(workers * space.RESERVE)} MB held for "
                "the texts in flight")


def server_config(given: dict, **worked_out):
    """The ServerConfig of serve's options: each setting that goes to "config" as given (a
    worker's share of --max-texts), and what serve works out (trusted_hosts, fallback)."""
    from puffergpt.server.processes.workers import share
    from puffergpt.server.state import ServerConfig

    fields = {s.name: given[s.name] for s in settings.going("config") if s.name in given}
    fields["max_open_texts"] = share(fields["max_open_texts"], given["workers"])
    return ServerConfig(**fields, **worked_out)


def worker_spec(model: str, given: dict, store_options: dict, config):
    """What each worker of ``serve --workers`` serves with: the settings that go to "worker" as
    given (its share of --max-running), the store's options and the config."""
    from puffergpt.server.processes.workers import WorkerSpec, share

    worker = {s.name: given[s.name] for s in settings.going("worker")}
    worker["max_running"] = share(worker["max_running"], given["workers"])
    return WorkerSpec(model=model, data_dir=str(default_data(given["data_dir"])), store_options=store_options,
                      config=asdict(config), notebook=str(notebook_dir(given["notebook_path"], given["data_dir"])),
                      **worker)


def serve_here(opened, model: str, config, notebook, host: str, port: int, max_running: int) -> None:
    """One process: the app over the engine opened here."""
    from puffergpt.model.reference import NumpyWeights
    from puffergpt.model.session import Run
    from puffergpt.server import create_app
    from puffergpt.server.app import run, server

    def reference():  # Compare reads the checkpoint only while it compares
        return Run(NumpyWeights(checkpoints.load(model)))

    app = create_app(opened.engine, config, reference=reference, notebook=notebook)
    opened.engine.ready_texts(max_running)  # the first learners open their texts at once
    opened.engine.hold_reserve()  # room for the texts in flight should the disk fill (search/space.py)
    run(server(app, host, port))  # its shutdown stops running generations first


def serve_with_workers(spec, n: int, host: str, port: int, started: str) -> None:
    """N worker processes behind one front here (server/workers.py, server/front.py); this process
    holds the store while they run."""
    from puffergpt.server.app import run
    from puffergpt.server.processes.front import create_front, front_server
    from puffergpt.server.processes.workers import running, worker_config

    with running(spec, n) as pool:
        click.echo(started)
        front = create_front(pool, worker_config(spec.config))
        run(front_server(front, pool, host, port))


SHARED = (". Several servers can't share one data directory: give each `--backend pgvector --dsn postgresql://...` "
          "(one database) or `--backend turbopuffer` (docs/deploy.md)")


@contextmanager
def announced(path: Path | None, what: dict) -> Iterator[None]:
    """While the server runs, ``serving.json`` in its data directory says where it listens, so
    that a command that finds the directory held can say where to go (None: no file)."""
    if path is None:
        yield
        return
    path.write_text(json.dumps(what))
    try:
        yield
    finally:
        path.unlink(missing_ok=True)
