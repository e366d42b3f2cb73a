"""``puffergpt bench``: the engines timed side by side on one model (numpy, transformers, each
backend), each backend loaded into a store of its own; speed claims live here, not in tests."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import click

from puffergpt import checkpoints
from puffergpt.cli.options import MODEL_HELP, clear_errors, data_option, dsn_option, fail, open_store
from puffergpt.stores import BACKENDS


@click.command()
@click.option("--model", default="demo", show_default=True, help=MODEL_HELP)
@click.option("--backends", default="embedded", show_default=True, help="comma-separated backends to run")
@dsn_option
@data_option
@click.option("--quick", is_flag=True, help="fewer positions and tokens: a smoke run in about a minute")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="write the results as JSON")
@click.option("--chart", "chart_out", type=click.Path(path_type=Path), default=None,
              help="write a PNG chart (needs matplotlib)")
@click.option("--no-torch", is_flag=True, help="leave out transformers even if it is installed")
@click.option("--rounds", type=click.IntRange(1, 20), default=None,
              help="interleaved rounds over the engines [default: 2, quick: 1]")
def bench(model, backends, dsn, data_dir, quick, json_out, chart_out, no_torch, rounds) -> None:
    """Time the engines side by side on one model: numpy, transformers, each backend."""
    from puffergpt import bench as b

    names = [n.strip() for n in backends.split(",") if n.strip()]
    bad = [n for n in names if n not in BACKENDS]
    if bad or not names:
        fail(f"unknown backend {bad[0] if bad else backends!r}: use some of {', '.join(BACKENDS)}")
    plan = b.Plan.quick() if quick else b.Plan()
    if rounds:
        plan.rounds = rounds
    with clear_errors(), tempfile.TemporaryDirectory(prefix="puffergpt-bench-") as tmp:
        path, _ = checkpoints.resolve(model)
        ckpt = checkpoints.load(model)
        stores = []
        try:
            dirs = {n: data_dir or Path(tmp) / n for n in names}  # --data: every backend's files there
            engines, loads = loaded(ckpt, model, dirs, dsn, stores)
            report = b.bench(ckpt, str(path), engines, plan, with_torch=not no_torch)
        finally:
            for store in stores:  # before the temporary directory goes (pgvector's local server lives there)
                store.close()
        for r in report["results"]:
            r.update(loads.get(r["engine"], {}))
    click.echo(b.table(report))
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        click.echo(f"wrote {json_out}")
    if chart_out:
        b.chart(report, str(chart_out))
        click.echo(f"wrote {chart_out}")


def loaded(ckpt, model: str, dirs: dict[str, Path], dsn: str | None, stores: list) -> tuple[dict, dict]:
    """The model loaded into a store of each backend, in its directory (opened stores go on
    ``stores``, for the caller to close): each engine's ``open``, and each load's seconds and size."""
    from puffergpt import loading
    from puffergpt.engine import Engine

    engines, loads = {}, {}
    for name, data_dir in dirs.items():
        store = open_store(name, data_dir, dsn)
        stores.append(store)
        t0 = time.perf_counter()
        loading.load(store, ckpt, loading.model_key(model))
        loads[name] = {"load_s": round(time.perf_counter() - t0, 2), "disk_mb": store_size_mb(store)}
        engines[name] = Engine(store, model).open
    return engines, loads


def store_size_mb(store) -> float | None:
    size = store.disk_bytes()  # the embedded store's data directory; None: a server's store
    return round(size / 1e6, 1) if size is not None else None
