"""``puffergpt patch`` and ``puffergpt lesson``: activation patching and the lessons from the
terminal (``lens/patching.py``, ``lens/lessons.py``), each claim printed with its verdict."""

from __future__ import annotations

import json

import click

from puffergpt.cli.options import (
    ENGINE,
    MODEL_HELP,
    BackendCommand,
    clear_errors,
    fail,
    open_model,
    option,
    resolve_model,
)


@click.command(cls=BackendCommand)
@click.argument("clean")
@click.argument("corrupt")
@click.argument("answer")
@click.argument("wrong")
@click.option("--model", default=None, help=MODEL_HELP + " [default: as serve]")
@ENGINE
@option("backend")
@option("data_dir")
@click.option("--heads", is_flag=True, help="patch each head's output at the last position (a layer x head grid)")
@click.option("--json", "as_json", is_flag=True,
              help='{"clean_diff", "corrupt_diff", "layers": [{"layer", "restored": [r_0 .. r_T-1]}]}')
def patch(clean, corrupt, answer, wrong, model, engine, backend, backend_settings, data_dir, heads, as_json) -> None:
    """Where the answer is: the residual entering each block (and ln_f) at each position, copied
    from the CLEAN prompt's run into the CORRUPT one's, and how much of logit(ANSWER) -
    logit(WRONG) at the last position comes back: r = (d_patched - d_corrupt) / (d_clean -
    d_corrupt). The prompts have the same number of tokens; ANSWER and WRONG are one token each
    (" 3", with its leading space). Each patch is a forward pass of its own."""
    from puffergpt.lens import patching
    from puffergpt.texts.text import TextError

    try:
        asked = patching.check(clean, corrupt, answer, wrong, "heads" if heads else "positions")
    except TextError as e:
        fail(str(e))
    model, _ = resolve_model(model)
    with clear_errors(), open_model(engine, model, backend, data_dir, backend_settings) as opened:
        click.echo(f"{asked.runs(opened.config)} forward passes", err=True)
        try:
            got = patching.patch(opened.open_run, opened.config, asked)
        except TextError as e:
            fail(str(e))
    if as_json:
        click.echo(json.dumps(patching.contract(got)))
        return
    render_patch(got, asked)


def render_patch(got: dict, asked) -> None:
    from puffergpt.model import tokenizer

    dc, dx = got["clean_diff"], got["corrupt_diff"]
    click.echo(f"d = logit(answer) - logit(wrong): clean {dc:+.4f}, corrupted {dx:+.4f}")
    rows = got.get("layers") or got["heads"]
    cols = ([repr(tokenizer.token_text(t))[:7] for t in asked.clean] if "layers" in got
            else [f"H{h}" for h in range(len(rows[0]["restored"]))])
    click.echo("layer " + " ".join(f"{c:>7}" for c in cols))
    for row in rows:
        name = "ln_f" if "layers" in got and row["layer"] == len(rows) - 1 else str(row["layer"])
        click.echo(f"{name:>5} " + " ".join(f"{r:7.2f}" for r in row["restored"]))
    reqs = got["requests"]
    cost = f"{len(reqs)} requests" if reqs else "the numpy reference: no searches"
    click.echo(f"[{got['runs']} forward passes | {cost}]", err=True)


@click.command(cls=BackendCommand)
@click.argument("lesson_id", required=False)
@click.argument("prompt", required=False)
@click.option("--model", default=None, help=MODEL_HELP + " [default: as serve]")
@ENGINE
@option("backend")
@option("data_dir")
@option("lessons_dir")
@click.option("--json", "as_json", is_flag=True,
              help='{"id", "prompt", "steps": [{"title", "claim", "holds", "evidence"}]}')
def lesson(lesson_id, prompt, model, engine, backend, backend_settings, data_dir, lessons_dir, as_json) -> None:
    """Run a lesson on PROMPT (default: the lesson's starter): each step's claim, computed from
    the model, and whether it holds. Without LESSON_ID, the lessons there are."""
    from puffergpt.lens import lessons
    from puffergpt.texts.text import TextError

    try:
        if lesson_id is None:
            for x in lessons.load(lessons_dir).values():
                click.echo(json.dumps(x.brief()) if as_json else f"{x.id:<16} {x.title} ({len(x.steps)} steps)")
            return
        chosen = lessons.get(lesson_id, lessons_dir)
        if prompt is not None:
            lessons.check_prompt(prompt)
    except (lessons.LessonError, TextError) as e:
        fail(str(e))
    model, _ = resolve_model(model)
    with clear_errors(), open_model(engine, model, backend, data_dir, backend_settings) as opened:
        got = lessons.run(chosen, opened.open_run, opened.config, prompt)
    if as_json:
        click.echo(json.dumps(lessons.contract(got)))
        return
    click.echo(f"{got['title']}, on {got['prompt']!r}")
    for i, s in enumerate(got["steps"], 1):
        click.echo(f"{i}. {s['title']} [{s['view']}]: {'holds' if s['holds'] else 'does not hold'}")
        click.echo(f"   {s['claim']}")
    held = sum(s["holds"] for s in got["steps"])
    click.echo(f"[{held} of {len(got['steps'])} claims hold | {len(got['requests'])} requests]", err=True)
