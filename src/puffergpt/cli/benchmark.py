"""``puffergpt bench``: the engines timed side by side on one model (numpy, transformers, each
backend), each backend loaded into a store of its own; with ``--clients N``, N simulated
learners against one server, together and one after another. Speed claims live here, not in
tests."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import click

from puffergpt import settings
from puffergpt.cli.options import (
    MODEL_HELP,
    BackendCommand,
    clear_errors,
    fail,
    open_store,
    option,
    store_settings,
)
from puffergpt.model import checkpoints
from puffergpt.stores import check_backend, settings_of


@click.command(cls=BackendCommand)
@click.option("--model", default="demo", show_default=True, help=MODEL_HELP)
@click.option("--backends", default=settings.default("backend"), show_default=True,
              help="comma-separated backends to run")
@option("data_dir")
@click.option("--quick", is_flag=True, help="fewer positions and tokens: a smoke run in about a minute")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="write the results as JSON")
@click.option("--chart", "chart_out", type=click.Path(path_type=Path), default=None,
              help="write a PNG chart (needs matplotlib)")
@click.option("--no-torch", is_flag=True, help="leave out transformers even if it is installed")
@click.option("--rounds", type=click.IntRange(1, 20), default=None,
              help="interleaved rounds over the engines [default: 2, quick: 1]")
@click.option("--clients", type=int, default=None,  # its bounds: bench_clients.Plan
              help="N (1..64) simulated learners against one server, together against one after another")
@click.option("--url", default=None,
              help="with --clients: the running server to measure [default: one started here on --model]")
@click.option("--tokens", type=click.IntRange(min=1), default=None,
              help="with --clients: new tokens a learner asks for [default: 24]")
@click.option("--temperature", type=click.FloatRange(min=0), default=None,
              help="with --clients: the sampling temperature [default: 0, greedy]")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="with --clients and a temperature above 0: learner i samples with seed + i")
@option("workers", default="auto")  # the bench measures a class: every core
@click.option("--output-search", "output_text", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, metavar="TEXT_FILE",
              help="instead: the next token's search, approximate (an HNSW index, built here) against exact, at "
                   "every position of TEXT_FILE (e.g. tests/data/english.txt): time, recall@40, greedy changes")
@click.pass_context
def bench(ctx, model, backends, backend_settings, data_dir, quick, json_out, chart_out, no_torch, rounds, clients, url,
          tokens, temperature, seed, workers, output_text) -> None:
    """Time the engines side by side on one model: numpy, transformers, each backend.
    With --clients N: N simulated learners against one server, together and one after another."""
    from puffergpt.bench import engines as b

    names = [n.strip() for n in backends.split(",") if n.strip()]
    with clear_errors():  # an unknown one: the installed ones listed
        for name in names or [backends]:
            check_backend(name)
    if output_text is not None:
        if clients is not None or url is not None:
            fail("--output-search measures the output search of each backend here: not with --clients or --url")
        return output_bench(model, names, backend_settings, data_dir, output_text, json_out)
    check_mode(ctx, clients, url, names)
    if clients is not None:
        return clients_bench(clients, url, tokens, temperature, seed, model, names[0], backend_settings, data_dir,
                             json_out, workers)
    plan = b.Plan.quick() if quick else b.Plan()
    if rounds:
        plan.rounds = rounds
    with clear_errors(), tempfile.TemporaryDirectory(prefix="puffergpt-bench-") as tmp:
        path, _ = checkpoints.resolve(model)
        ckpt = checkpoints.load(model)
        stores = []
        try:
            dirs = {n: data_dir or Path(tmp) / n for n in names}  # --data: every backend's files there
            engines, loads = loaded(ckpt, model, dirs, backend_settings, stores)
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


def loaded(ckpt, model: str, dirs: dict[str, Path], backend_settings: dict, stores: list) -> tuple[dict, dict]:
    """The model loaded into a store of each backend, in its directory (opened stores go on
    ``stores``, for the caller to close): each engine's ``open``, and each load's seconds and size."""
    from puffergpt.search import load, manifest
    from puffergpt.search.manifest import open_engine

    engines, loads = {}, {}
    for name, data_dir in dirs.items():
        store = open_store(name, data_dir, backend_settings)
        stores.append(store)
        t0 = time.perf_counter()
        load.load(store, ckpt, manifest.model_key(model))
        loads[name] = {"load_s": round(time.perf_counter() - t0, 2), "disk_mb": store_size_mb(store)}
        engines[name] = open_engine(store, model).open
    return engines, loads


def output_bench(model: str, names: list[str], backend_settings: dict, data_dir: Path | None, text: Path,
                 json_out: Path | None) -> None:
    """--output-search: each backend's output search, approximate against exact, over a text's
    positions (the hidden states numpy's, the same for both searches and every backend)."""
    from puffergpt.lens import output_search
    from puffergpt.model import tokenizer
    from puffergpt.search import load, manifest

    ids = tokenizer.encode(text.read_text())
    rows = []
    with clear_errors(), tempfile.TemporaryDirectory(prefix="puffergpt-bench-") as tmp:
        ckpt = checkpoints.load(model)
        xs = output_search.hidden_states(ckpt, ids)
        for name in names:
            store = open_store(name, data_dir or Path(tmp) / name, backend_settings)
            try:
                key = manifest.model_key(model)
                load.load(store, ckpt, key)
                t0 = time.perf_counter()
                load.build_output_index(store, key, model)
                index_s = time.perf_counter() - t0
                got = output_search.measure(manifest.open_engine(store, model).views().weights, xs)
                rows.append({"model": ckpt.name if len(ckpt.name) <= 10 else Path(ckpt.name).name[:10],
                             "backend": name, "index_s": index_s, "text": str(text), **got})
            finally:
                store.close()
    click.echo(output_search.table(rows))
    if json_out:
        json_out.write_text(json.dumps(rows, indent=2) + "\n")
        click.echo(f"wrote {json_out}")


def store_size_mb(store) -> float | None:
    size = store.disk_bytes()  # the embedded store's data directory; None: a server's store
    return round(size / 1e6, 1) if size is not None else None


# --- --clients: learners against one server ---------------------------------------------------

ENGINES_ONLY = ("quick", "chart_out", "no_torch", "rounds")  # the engines' bench, not --clients
CLIENTS_ONLY = ("url", "tokens", "temperature", "seed", "workers")
OWN_SERVER_ONLY = ("model", "backends", "data_dir", "workers")  # the bench's own server, not --url's (and the
# backends' settings)


def check_mode(ctx: click.Context, clients: int | None, url: str | None, backends: list[str]) -> None:
    """Options that mean nothing in the mode asked for are refused, not ignored."""
    def given(names: tuple[str, ...]) -> list[str]:
        opts = {p.name: p.opts[0] for p in ctx.command.params}
        return [opts[n] for n in names if ctx.get_parameter_source(n) == click.core.ParameterSource.COMMANDLINE]

    if clients is None and (extra := given(CLIENTS_ONLY)):
        fail(f"{', '.join(extra)} goes with --clients N (learners against a server)")
    if clients is not None and (extra := given(ENGINES_ONLY)):
        fail(f"{', '.join(extra)} is for the engines' bench, not --clients")
    if url is not None and (extra := given(OWN_SERVER_ONLY + tuple(s.name for s in ctx.command.store_params))):
        fail(f"{', '.join(extra)} sets up the server bench starts itself: with --url the server there is "
             "measured as it is")
    if clients is not None and len(backends) != 1:
        fail(f"--clients measures one server on one backend: give one in --backends, not {', '.join(backends)}")


def clients_bench(clients: int, url: str | None, tokens: int | None, temperature: float | None, seed: int | None,
                  model: str, backend: str, backend_settings: dict, data_dir: Path | None,
                  json_out: Path | None, workers: int = 1) -> None:
    """N learners against the server at --url, or against one started here on --model."""
    from puffergpt.bench import clients as bc

    with clear_errors():
        plan = bc.Plan(clients, tokens or 24, temperature or 0.0, seed=seed)
        if url is not None:
            report = bc.run(url, plan, progress=True)
        else:
            report = own_server(plan, model, backend, backend_settings, data_dir, workers)
    click.echo(bc.table(report))
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        click.echo(f"wrote {json_out}")


def own_server(plan, model: str, backend: str, backend_settings: dict, data_dir: Path | None,
               workers: int = 1) -> dict:
    """The bench against a server of its own, met as a learner's browser meets one: ``puffergpt
    serve`` in a process of its own (not this one's, where the learners' threads would take
    turns with it) on a free loopback port, with ``workers`` processes, the model in a temporary
    store unless --data, room for every learner's text; stopped as Ctrl-C stops it."""
    from puffergpt.bench import clients as bc

    with tempfile.TemporaryDirectory(prefix="puffergpt-bench-") as tmp:
        port = free_port()
        flags, env = handed_on(backend, backend_settings)
        cmd = [sys.executable, "-m", "puffergpt.cli", "serve", "--model", model, "--backend", backend,
               "--data", str(data_dir or Path(tmp) / backend), "--port", str(port), "--workers", str(workers),
               "--max-texts", str(max(32, plan.clients)), "--max-running", str(max(16, plan.clients)),
               "--notebook", str(Path(tmp) / "notebook"), *flags]
        with subprocess.Popen(cmd, env={**os.environ, **env}) as proc:
            try:
                url = ready(proc, f"http://127.0.0.1:{port}")
                where = f"`puffergpt serve` started by bench, {workers} worker process{'es' if workers > 1 else ''}"
                return bc.run(url, plan, progress=True, where=where)
            finally:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()


def handed_on(backend: str, given: dict) -> tuple[list[str], dict]:
    """(flags, variables): the backend's settings for a child `puffergpt serve`, each by its
    variable where it has one (a DSN's password, a key stay off its command line), else its flag."""
    flags, env, values = [], {}, store_settings(backend, given)
    for s in settings_of(backend):
        value = values[s.name]
        if value and s.env:
            env[s.env] = value
        elif value and s.flag:
            flags += [s.flag, value]
    return flags, env


def ready(proc: subprocess.Popen, url: str, start_s: float = 600.0) -> str:
    """``url`` once the server there answers (a first start loads the model), or a BenchError."""
    from puffergpt.bench import clients as bc

    deadline = time.monotonic() + start_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise bc.BenchError(f"the bench's own server ended (exit status {proc.returncode}): its error is above")
        try:
            with urllib.request.urlopen(f"{url}/api/status", timeout=5) as r:
                if r.status == 200:
                    return url
        except OSError:
            time.sleep(0.2)
    raise bc.BenchError(f"the bench's own server did not answer within {start_s:.0f} s: use --url with "
                        f"`puffergpt serve`")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
