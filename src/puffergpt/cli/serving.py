"""``puffergpt serve``: the playground and the HTTP API on one model, loaded first if needed."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import click

from puffergpt.cli.options import (
    MODEL_HELP,
    SERVING,
    api_key_option,
    backend_option,
    clear_errors,
    data_option,
    default_data,
    notebook_dir,
    notebook_option,
    open_served,
    output_search_option,
    resolve_model,
    store_settings,
    workers_option,
)
from puffergpt.model import checkpoints


@click.command()
@click.option("--model", default=None,
              help=MODEL_HELP + " [default: gpt2, or the demo model when GPT-2 small can't be downloaded]")
@backend_option
@data_option
@notebook_option
@output_search_option
@click.option("--host", default="127.0.0.1", show_default=True, help="the address to listen on")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--max-texts", type=click.IntRange(1, 1000), default=32, show_default=True, help="texts open at once")
@click.option("--max-running", type=click.IntRange(1, 1000), default=16, show_default=True,
              help="texts generating at once (their searches are merged); the others wait their turn")
@click.option("--idle-minutes", type=click.FloatRange(0.1, 10080), default=30.0, show_default=True,
              help="an idle text is closed after this long")
@click.option("--text-ttl", "text_ttl", type=click.FloatRange(1, 7 * 86400), default=1800.0, show_default=True,
              metavar="SECONDS", help="the keys of a text nobody used for this long are dropped by any server on "
                                      "the same store, a killed server's too (docs/deploy.md)")
@workers_option
@click.option("--cors-origin", "cors_origins", multiple=True, callback=lambda ctx, param, v: origins(v),
              metavar="ORIGIN", help="a page elsewhere allowed to drive the API, as scheme://host[:port] (repeat for "
                                     "more); none by default: only the server's own page and clients that send no "
                                     "Origin (curl, SDKs). Never the notebook's routes")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="HOST",
              help="another name clients may reach the server by (the Host header), beside 127.0.0.1 and "
                   "localhost: host.docker.internal for a container, a reverse proxy's name; repeat for more")
@api_key_option
@click.option("--public-read-only", is_flag=True,
              help="anyone may generate; the notebook's writes need the key (with none set: no one may write)")
@click.option("--no-auth", is_flag=True,
              help="on an address other machines reach, without a key: let anyone do anything, notebook included")
@click.option("--public-url", default=None, callback=lambda ctx, param, v: public_url(v), metavar="URL",
              help="the address clients reach this server at (https://puffer.example.org, behind a proxy or a "
                   "tunnel): the OpenAPI document's server, for a GPT action or a generated client. "
                   "[default: the address each request came to]")
@click.option("--max-request-seconds", type=click.FloatRange(1, 86400), default=600, show_default=True,
              help="a generation or completion running longer is ended with an error naming this limit")
@click.option("--max-request-tokens", type=click.IntRange(1, 10**7), default=8192, show_default=True,
              help="tokens a /v1 request may compute over its choices (prompt tokens read, scored, new); "
                   "more is refused up front")
def serve(model, backend, dsn, data_dir, notebook_path, output_search, host, port, max_texts, max_running,
          idle_minutes, text_ttl, workers, cors_origins, allowed_hosts, api_keys, public_read_only, no_auth, public_url,
          max_request_seconds, max_request_tokens) -> None:
    """Serve the playground and the HTTP API; load the model first if needed."""
    from puffergpt.server.guards.auth import check_exposure
    from puffergpt.server.guards.hosts import trusted_hosts
    from puffergpt.server.processes.workers import WorkerSpec, share
    from puffergpt.server.state import ServerConfig

    try:  # before anything loads: a server open to anyone, a bad name
        check_exposure(host, api_keys, public_read_only, no_auth)
        trusted = trusted_hosts(host, allowed_hosts)  # no DNS rebinding onto a local server
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if no_auth:
        click.echo(f"puffergpt: --no-auth: anyone who reaches {host} may generate and write the notebook", err=True)
    model, fallback = resolve_model(model)
    with clear_errors(held=SHARED):
        opened, notebook = open_served(model, backend, data_dir, dsn, notebook_path, max_running, text_ttl,
                                       output_search)
    config = ServerConfig(max_open_texts=share(max_texts, workers), idle_s=idle_minutes * 60,
                          trusted_hosts=trusted, fallback=fallback, cors_origins=cors_origins,
                          max_request_s=max_request_seconds, max_request_tokens=max_request_tokens,
                          api_keys=api_keys, public_read_only=public_read_only, public_url=public_url)
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address goes in brackets in a URL
    url = f"http://{shown}:{port}/"
    serving = default_data(data_dir) / SERVING if backend == "embedded" else None
    with opened, clear_errors(), announced(serving, {"url": url, "pid": os.getpid(), "model": model}):
        documents = f"{opened.engine.manifest['documents']:,} documents"
        if workers == 1:
            click.echo(f"puffergpt: {model} on {backend}, {documents}, one process. Open {url}")
            serve_here(opened, model, config, notebook, host, port, max_running)
        else:
            spec = WorkerSpec(model, backend, str(default_data(data_dir)), {**store_settings(dsn),
                              **opened.store.worker_options()}, asdict(config), share(max_running, workers), text_ttl,
                              str(notebook_dir(notebook_path, data_dir)), output_search)
            serve_with_workers(spec, workers, host, port, f"puffergpt: {model} on {backend}, {documents}, "
                                                           f"{workers} worker processes. Open {url}")


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
    run(server(app, host, port))  # its shutdown stops running generations first


def serve_with_workers(spec, n: int, host: str, port: int, started: str) -> None:
    """N worker processes behind one front here (server/workers.py, server/front.py); this process
    holds the store while they run."""
    from puffergpt.server.app import run
    from puffergpt.server.processes.front import create_front, front_server
    from puffergpt.server.processes.workers import running

    with running(spec, n) as pool:
        click.echo(started)
        run(front_server(create_front(pool), pool, host, port))


def origins(values: tuple[str, ...]) -> tuple[str, ...]:
    """--cors-origin's values, each checked and normalised (``cross_site.check_origin``)."""
    from puffergpt.server.guards.cross_site import check_origin

    try:
        return tuple(check_origin(v) for v in values)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--cors-origin") from None


def public_url(value: str | None) -> str | None:
    """--public-url, checked (``openapi_doc.check_public_url``)."""
    from puffergpt.server.openapi_doc import check_public_url

    try:
        return None if value is None else check_public_url(value)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--public-url") from None


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
