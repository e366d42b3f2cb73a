"""``puffergpt mcp``: the Model Context Protocol server over stdio, for an assistant
(Claude Desktop, Cursor, any MCP client) to generate, look inside, and save insights.

Either the model opened here (``--data``/``--model``/``--backend``, as ``serve``) with the
notebook at ``--notebook`` (default DATA/notebook), or ``--server URL``: a running
``puffergpt serve``, which holds the store and the notebook. Stdout carries the protocol
only; every message goes to stderr."""

from __future__ import annotations

import contextlib
import logging
import sys

import click

from puffergpt import settings
from puffergpt.cli.options import (
    MODEL_HELP,
    BackendCommand,
    clear_errors,
    client_key_option,
    fail,
    open_served,
    option,
    resolve_model,
)


@click.command("mcp", cls=BackendCommand)
@click.option("--server", "server_url", default=None, metavar="URL",
              help="a running `puffergpt serve` (http://127.0.0.1:8000), which holds the store and the notebook")
@click.option("--model", default=None, help=MODEL_HELP + " [default: as serve]")
@option("backend")
@option("data_dir")
@option("notebook_path")
@option("lessons_dir")
@client_key_option
def mcp(server_url, model, backend, backend_settings, data_dir, notebook_path, lessons_dir, api_key) -> None:
    """Serve the tools generate, inspect, save_insight, list_insights and replay_insight over MCP (stdio)."""
    import anyio

    from puffergpt.mcp import server as mcp_server
    from puffergpt.mcp import stdio as mcp_stdio

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="puffergpt mcp: %(message)s")
    if server_url is not None:
        # --data and a backend's settings may come from the environment: they are left unused, not refused
        given = [o for o, v in (("--model", model), ("--notebook", notebook_path), ("--lessons", lessons_dir))
                 if v is not None] + \
            (["--backend"] if backend != settings.default("backend") else [])
        if given:
            fail(f"--server talks to a running `puffergpt serve`, which holds the model, the store and the notebook: "
                 f"leave out {', '.join(given)} (give them to serve), or leave out --server")
        if not server_url.startswith(("http://", "https://")):
            fail(f"--server must be an http:// or https:// URL, got {server_url!r}")
        backend_ = mcp_server.Remote(server_url, api_key=api_key)
    else:
        backend_ = open_local(model, backend, backend_settings, data_dir, notebook_path, lessons_dir)
    try:  # the SDK's stdio transport, with a screen that answers every malformed line (mcp_stdio)
        anyio.run(mcp_stdio.serve, mcp_server.make_server(backend_))
    finally:
        backend_.close()


def open_local(model, backend, backend_settings, data_dir, notebook_path, lessons_dir=None):
    """The model on its store and the notebook, as ``serve`` opens them; anything printed
    while loading goes to stderr, never into the protocol."""
    from puffergpt.mcp import server as mcp_server

    with contextlib.redirect_stdout(sys.stderr), clear_errors():
        model, _ = resolve_model(model)
        opened, book = open_served(model, backend, data_dir, backend_settings, notebook_path)
    click.echo(f"puffergpt mcp: {model} on {backend}; notebook {book.path}; speaking MCP on stdio", err=True)
    return mcp_server.Local(opened, book, lessons_dir)
