"""``puffergpt notebook list|show|replay|push``: the insight notebook from the command line.

The group is attached to the main command in cli.py (``main.add_command(notebook)``).
Parse, call the notebook, render; everything shown is text with control characters
written out, so a file edited by hand can't drive the terminal."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import click

from puffergpt import notebook as nb
from puffergpt.stores import BACKENDS


def notebook_dir(notebook_path: Path | None, data_dir: Path | None) -> Path:
    """--notebook, else <data dir>/notebook (the data dir as every command has it)."""
    if notebook_path is not None:
        return notebook_path
    import platformdirs

    return (data_dir or Path(platformdirs.user_data_dir("puffergpt"))) / "notebook"


def notebook_options(f):
    f = click.option("--data", "data_dir", type=click.Path(path_type=Path), envvar="PUFFERGPT_DATA", default=None,
                     help="the data directory [env PUFFERGPT_DATA; default: the user data dir]")(f)
    return click.option("--notebook", "notebook_path", type=click.Path(path_type=Path), default=None,
                        help="the notebook's git repository [default: DATA/notebook]")(f)


@contextmanager
def clear_errors():
    """Known failures become one clear line and a non-zero exit, not a traceback."""
    from puffergpt.checkpoints import CheckpointError
    from puffergpt.stores import StoreError

    try:
        yield
    except (nb.NotebookError, CheckpointError, StoreError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None


def open_notebook(notebook_path: Path | None, data_dir: Path | None) -> nb.Notebook:
    # Reading commands never create a notebook: an absent one says how to make one.
    return nb.Notebook(notebook_dir(notebook_path, data_dir), create=False)


@click.group()
def notebook() -> None:
    """Your notebook of insights: a git repository of Markdown files, one an insight."""


@notebook.command("list")
@click.argument("query", required=False)
@click.option("--tag", default=None, help="only insights with this tag")
@click.option("--json", "as_json", is_flag=True, help="one JSON object an insight")
@notebook_options
def list_(query, tag, as_json, notebook_path, data_dir) -> None:
    """List insights, newest first; QUERY searches titles, bodies and tags."""
    with clear_errors():
        found = open_notebook(notebook_path, data_dir).list(query=query, tag=tag)
    for ins in found:
        if as_json:
            click.echo(json.dumps(ins.summary(), ensure_ascii=False))
        else:
            tags = f"  [{', '.join(ins.tags)}]" if ins.tags else ""
            commit = ins.commit[:10] if ins.commit else "not committed"
            click.echo(nb._shown(f"{ins.id}  {ins.date[:10]}  {ins.title}{tags}  ({ins.model}, {commit})"))
    if not found and not as_json:
        click.echo("no insights" + (" match" if query or tag else " yet"), err=True)


@notebook.command()
@click.argument("insight_id")
@click.option("--json", "as_json", is_flag=True, help="the insight with its evidence as JSON")
@notebook_options
def show(insight_id, as_json, notebook_path, data_dir) -> None:
    """Show one insight: your words, then its evidence."""
    with clear_errors():
        ins = open_notebook(notebook_path, data_dir).get(insight_id)
    if as_json:
        click.echo(json.dumps(ins.to_json(), ensure_ascii=False))
        return
    head = [ins.title, f"{ins.date}  model {ins.model}  tags: {', '.join(ins.tags) or '-'}",
            f"{ins.path}  ({'commit ' + ins.commit if ins.commit else 'not committed yet'})", ""]
    click.echo(nb._shown("\n".join(head) + (ins.body + "\n\n" if ins.body else "") + nb.render_evidence(ins.evidence)))


def candidates_for(engine: str, model: str, backend: str, data_dir: Path | None, dsn: str | None) -> tuple[nb.CandidatesAt, Callable[[], None]]:
    """The candidates_at that replay runs, and how to release what it holds. ``reference``
    is the numpy GPT-2 from the checkpoint; ``search`` the engine on a loaded store."""
    from puffergpt import checkpoints

    if engine == "reference":
        from puffergpt.reference import NumpyProducts

        ckpt = checkpoints.load(model)
        return nb.candidates_from_products(lambda: NumpyProducts(ckpt)), lambda: None
    from puffergpt.cli import open_store  # the store's settings, as every command reads them
    from puffergpt.engine import Engine

    checkpoints.check_model(model)
    store = open_store(backend, data_dir, dsn)
    try:
        return nb.candidates_from_products(Engine(store, model, verify=True, progress=True).open), store.close  # never replay on a damaged store
    except BaseException:
        store.close()
        raise


@notebook.command()
@click.argument("insight_id")
@click.option("--model", default=None, help="the model to replay with [default: the insight's own]")
@click.option("--engine", type=click.Choice(["reference", "search"]), default="reference", show_default=True,
              help="reference: the numpy GPT-2 from the checkpoint; search: the engine on the loaded store")
@click.option("--backend", type=click.Choice(BACKENDS), default="embedded", show_default=True, help="for --engine search")
@click.option("--dsn", envvar="PUFFERGPT_DSN", default=None, help="PostgreSQL connection string for --backend pgvector [env PUFFERGPT_DSN]")
@click.option("--json", "as_json", is_flag=True, help="the comparison as JSON")
@notebook_options
def replay(insight_id, model, engine, backend, dsn, as_json, notebook_path, data_dir) -> None:
    """Recompute an insight's candidates and check they still match (exit 1 if not)."""
    with clear_errors():
        ins = open_notebook(notebook_path, data_dir).get(insight_id)
        at, release = candidates_for(engine, model or ins.model, backend, data_dir, dsn)
        try:
            r = nb.replay(ins, at)
        finally:
            release()
    if as_json:
        click.echo(json.dumps({"id": ins.id, "model": model or ins.model, "engine": engine, **r}))
    else:
        diff = "n/a" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.3g}"
        click.echo(f"{ins.id} at position {ins.evidence['position']} with {model or ins.model} ({engine}): "
                   f"{'matches' if r['matches'] else 'DIFFERS'}: same ids in the same order: {'yes' if r['same_ids'] else 'no'}, "
                   f"max |logit diff| {diff} (tolerance {r['tolerance']:g}) over {len(r['now'])} candidates")
        for d in r["first_differences"]:
            dd = "missing now" if d["diff"] is None else f"diff {d['diff']:.3g}"
            click.echo(f"  rank {d['rank']}: stored {d['stored']['token_id']} ({d['stored']['logit']:.6f}), "
                       f"now {d['now']['token_id']} ({d['now']['logit']:.6f}), {dd}")
    if not r["matches"]:
        raise SystemExit(1)


@notebook.command()
@notebook_options
def push(notebook_path, data_dir) -> None:
    """Push the notebook to its remote with your own git setup (no credentials are stored)."""
    with clear_errors():
        r = open_notebook(notebook_path, data_dir).push()
    click.echo(f"pushed {r['branch']} ({r['commit'][:10]}) to {r['remote']}")
