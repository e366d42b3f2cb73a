"""``puffergpt make-model``, ``load``, ``verify``: a checkpoint made, its weights written into a
store (one document a row), and read back against the manifest."""

from __future__ import annotations

import time
from pathlib import Path

import click

from puffergpt.cli.options import MODEL_HELP, BackendCommand, clear_errors, fail, open_store, option
from puffergpt.model import checkpoints
from puffergpt.search.documents import METRICS


@click.command("make-model")
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
    click.echo(f"wrote {path} ({preset}: {c.n_layer} layers, width {c.n_embd}, {c.n_head} heads, "
               f"vocab {c.n_vocab}, seed {seed})")


@click.command(cls=BackendCommand)
@click.option("--model", default="demo", show_default=True, help=MODEL_HELP)
@option("backend")
@option("data_dir")
@click.option("--metric", type=click.Choice(METRICS), default=None,
              help="the encoding of rows as documents [default: the store's most precise]")
@click.option("--repair", is_flag=True, help="read every document back and rewrite what does not match")
@click.option("--output-index", is_flag=True,
              help="also build the approximate (HNSW) index over the token vectors that --output-search "
                   "approximate searches (minutes at GPT-2's size); with --repair, build it again")
def load(model, backend, backend_settings, data_dir, metric, repair, output_index) -> None:
    """Write a model's weights into the store, one document a row."""
    from puffergpt.search import costs, load, manifest

    with clear_errors():
        ckpt = checkpoints.load(model)
        store = open_store(backend, data_dir, backend_settings)
        t0 = time.perf_counter()
        try:
            m = load.load(store, ckpt, manifest.model_key(model), metric=metric, repair=repair)
            if output_index:
                m = load.build_output_index(store, manifest.model_key(model), model, rebuild=repair)
                click.echo(f"{model}: the approximate index over its {m['indexes']['wte']['rows']:,} token vectors "
                           f"is built (HNSW); recall@40 against exact, token vectors as queries: "
                           f"{m['indexes']['wte']['recall_at_build']:.3f}", err=True)
        finally:
            store.close()
    nbytes = manifest.stored_bytes(m)
    click.echo(f"{model}: {m['documents']:,} documents ({nbytes / 1e6:,.0f} MB) in {len(m['namespaces'])} namespaces, "
               f"metric {m['metric']}, ready ({time.perf_counter() - t0:.1f} s). At turbopuffer's rates: "
               f"${costs.request_cost('write', nbytes, 0):.2f} to write, "
               f"${costs.storage_cost_per_month(nbytes):.2f} a month to keep.")


@click.command(cls=BackendCommand)
@click.option("--model", default="demo", show_default=True, help=MODEL_HELP)
@option("backend")
@option("data_dir")
def verify(model, backend, backend_settings, data_dir) -> None:
    """Read every document back and check it against the manifest."""
    from puffergpt.search import manifest, verify

    with clear_errors():
        store = open_store(backend, data_dir, backend_settings)
        try:
            key = manifest.model_key(model)
            m = manifest.read_manifest(store, key, model)
            verify.check_on_open(store, key, model, m, progress=True, force=True)  # StoreDamaged: what, and the fix
            if (why := verify.index_damage(store, m)) is not None:
                raise verify.StoreDamaged(verify.index_message(model, store, why))
        finally:
            store.close()
    index = " and its approximate index" if "wte" in m.get("indexes", {}) else ""
    click.echo(f"{model}: all {m['documents']:,} documents{index} match the manifest")
