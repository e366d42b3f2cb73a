"""``puffergpt notebook list|show|replay|push``: the insight notebook from the command line.

Parse, call the notebook, render; everything shown is text with control characters
written out, so a file edited by hand can't drive the terminal."""

from __future__ import annotations

import json
from pathlib import Path

import click

from puffergpt import notebook as nb
from puffergpt.cli.options import BackendCommand, clear_errors, notebook_dir, open_model, option


def notebook_options(f):
    return option("notebook_path")(option("data_dir")(f))


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
            source = ins.model or nb.NO_EVIDENCE
            click.echo(nb._shown(f"{ins.id}  {ins.date[:10]}  {ins.title}{tags}  ({source}, {commit})"))
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
    head = [ins.title, f"{ins.date}  model {ins.model or '-'}  tags: {', '.join(ins.tags) or '-'}",
            f"{ins.path}  ({'commit ' + ins.commit if ins.commit else 'not committed yet'})", ""]
    click.echo(nb._shown("\n".join(head) + (ins.body + "\n\n" if ins.body else "")
                       + (nb.render_evidence(ins.evidence) if ins.evidence else nb.NO_EVIDENCE + "\n")))


@notebook.command(cls=BackendCommand)
@click.argument("insight_id")
@click.option("--model", default=None, help="the model to replay with [default: the insight's own]")
@click.option("--engine", type=click.Choice(["reference", "search"]), default="reference", show_default=True,
              help="reference: the numpy GPT-2 from the checkpoint; search: the engine on the store (loaded if needed)")
@option("backend")
@click.option("--json", "as_json", is_flag=True, help="the comparison as JSON")
@notebook_options
def replay(insight_id, model, engine, backend, backend_settings, as_json, notebook_path, data_dir) -> None:
    """Recompute an insight's candidates and check they still match (exit 1 if not)."""
    with clear_errors():
        ins = open_notebook(notebook_path, data_dir).get(insight_id)
        if ins.evidence is None:  # a clear answer, not a failure: exit 0
            r = nb.replay(ins, None)
            click.echo(json.dumps({"id": ins.id, **r}) if as_json else f"{ins.id}: {r['reason']}")
            return
        with open_model(engine, model or ins.model, backend, data_dir, backend_settings) as opened:
            r = nb.replay(ins, nb.candidates_from_runs(opened.open_run),
                          data_at=nb.data_from_runs(opened.open_run))
    if as_json:
        click.echo(json.dumps({"id": ins.id, "model": model or ins.model, "engine": engine, **r}))
    else:
        diff = "n/a" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.3g}"
        verdict, same = "matches" if r["matches"] else "DIFFERS", "yes" if r["same_ids"] else "no"
        click.echo(f"{ins.id} at position {ins.evidence['position']} with {model or ins.model} ({engine}): "
                   f"{verdict}: same ids in the same order: {same}, "
                   f"max |logit diff| {diff} (tolerance {r['tolerance']:g}) over {len(r['now'])} candidates")
        if r["controls"]:
            click.echo(f"  replayed after the controls it records: {json.dumps(r['controls'])}")
        for d in r["first_differences"]:
            dd = "missing now" if d["diff"] is None else f"diff {d['diff']:.3g}"
            by = f", moved by {', '.join(d['moved'])}" if d["moved"] else ""
            click.echo(f"  rank {d['rank']}: stored {d['stored']['token_id']} ({d['stored']['logit']:.6f}), "
                       f"now {d['now']['token_id']} ({d['now']['logit']:.6f}), {dd}{by}")
        if d := r["data"]:
            diff = "n/a" if d["max_abs_diff"] is None else f"{d['max_abs_diff']:.3g}"
            tol = d["weight_tolerance"] or d["tolerance"]
            verdict = "matches" if d["matches"] else "DIFFERS"
            click.echo(f"its {d['kind']} data: {verdict}: {d['checked']} items checked, "
                       f"{d['differing']} differ, max |diff| {diff} (tolerance {tol:g})")
            for x in d["differences"]:
                dd = "missing now" if x["diff"] is None else f"diff {x['diff']:.3g}"
                click.echo(nb._shown(f"  {x['item']}: stored {x['stored']}, now {x['now']}, {dd}"))
    if not r["matches"]:
        raise SystemExit(1)


@notebook.command()
@notebook_options
def push(notebook_path, data_dir) -> None:
    """Push the notebook to its remote with your own git setup (no credentials are stored)."""
    with clear_errors():
        r = open_notebook(notebook_path, data_dir).push()
    click.echo(f"pushed {r['branch']} ({r['commit'][:10]}) to {r['remote']}")
