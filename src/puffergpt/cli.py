"""The command line: parse, call a checkpoint, text or engine, render. Environment
variables are read here and nowhere else."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from puffergpt import checkpoints, tokenizer
from puffergpt.sampling import Sampling

MODEL_HELP = "gpt2 (downloaded once), demo (ships with puffergpt), another GPT-2 family name, or a checkpoint directory"


def fail(msg: str) -> None:
    raise click.ClickException(msg)


@click.group()
@click.version_option(package_name="puffergpt")
def main() -> None:
    """puffergpt: GPT-2 where every matrix multiply is a vector search."""


def load_checkpoint(model: str) -> checkpoints.Checkpoint:
    try:
        return checkpoints.load(model)
    except checkpoints.CheckpointError as e:
        fail(str(e))


@main.command("make-model")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--preset", type=click.Choice(sorted(checkpoints.PRESETS)), default="tiny", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def make_model(out: Path, preset: str, seed: int) -> None:
    """Write a GPT-2-shaped checkpoint with seeded random weights to OUT."""
    try:
        path = checkpoints.make_model(out, preset, seed)
    except (checkpoints.CheckpointError, OSError) as e:
        fail(str(e))
    c = checkpoints.PRESETS[preset]
    click.echo(f"wrote {path} ({preset}: {c.n_layer} layers, width {c.n_embd}, {c.n_head} heads, vocab {c.n_vocab}, seed {seed})")


@main.command()
@click.argument("prompt")
@click.option("--model", default="demo", show_default=True, help=MODEL_HELP)
@click.option("--engine", type=click.Choice(["reference"]), default="reference", show_default=True,
              help="reference: the numpy GPT-2")
@click.option("--temperature", type=float, default=1.0, show_default=True, help="0 is greedy")
@click.option("--top-k", type=int, default=40, show_default=True)
@click.option("--seed", type=int, default=None, help="makes sampling reproducible")
@click.option("-n", "n_tokens", type=int, default=32, show_default=True, help="tokens to generate")
@click.option("--json", "as_json", is_flag=True, help="one JSON object a token, then a summary line")
def generate(prompt, model, engine, temperature, top_k, seed, n_tokens, as_json) -> None:
    """Continue PROMPT."""
    from puffergpt.reference import NumpyProducts
    from puffergpt.text import Text

    if not prompt:
        fail("the prompt is empty: give some text to continue")
    if n_tokens < 0:
        fail(f"-n must be >= 0, got {n_tokens}")
    ckpt = load_checkpoint(model)
    ids = tokenizer.encode(prompt)
    s = Sampling(temperature, top_k, seed)
    try:
        s.check(ckpt.config.n_vocab)
        text = Text(NumpyProducts(ckpt))
        text.check_tokens(ids, extra=n_tokens)
    except ValueError as e:
        fail(str(e))
    t0, steps = time.perf_counter(), []
    if not as_json:
        click.echo(prompt, nl=False)
    for step in text.generate(ids, n_tokens, s):
        steps.append(step)
        if as_json:
            click.echo(json.dumps(step.to_json()))
        else:
            click.echo(step.text, nl=False)
    summary = {"model": model, "engine": engine, "prompt_tokens": len(ids), "new_tokens": len(steps),
               "ms": round((time.perf_counter() - t0) * 1e3, 1)}
    if as_json:
        click.echo(json.dumps({"summary": summary}))
    else:
        click.echo()
        click.echo(f"[{summary['new_tokens']} tokens in {summary['ms']:.0f} ms]", err=True)


if __name__ == "__main__":
    main()
