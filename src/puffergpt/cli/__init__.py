"""The command line, ``puffergpt COMMAND``: each command parses its options, calls the
application layer and renders what comes back.

    options.py    what every command shares: the options (built from puffergpt.settings and
                  the backends' own settings), the data directory, clear errors, open_store and
                  open_model (the one way a command opens a model); the only reader of the
                  environment
    weights.py    make-model, load, verify: a checkpoint made, written into a store, read back
    ask.py        generate, analogy, contexts and writes, and how a completion is rendered
    lessons.py    patch (activation patching) and lesson (a lesson's claims, with their verdicts)
    serving.py    serve: the playground and the HTTP API
    backends.py   backends: the installed backends (plugins too) and their settings
    benchmark.py  bench: the engines timed side by side; --clients N: learners against one server
    notebook.py   notebook list|show|replay|push
    mcp.py        mcp: the tools for an assistant, over the Model Context Protocol
"""

from __future__ import annotations

import click

from puffergpt.cli import ask, backends, benchmark, lessons, mcp, notebook, serving, weights
from puffergpt.cli.serving import serve

__all__ = ["main", "serve"]


@click.group()
@click.version_option(package_name="puffergpt")
def main() -> None:
    """puffergpt: GPT-2 where every matrix multiply is a vector search."""


for command in (weights.make_model, weights.load, weights.verify, ask.generate, ask.analogy, ask.contexts, ask.writes,
                lessons.patch, lessons.lesson, serving.serve, backends.backends,
                benchmark.bench, notebook.notebook, mcp.mcp):
    main.add_command(command)
