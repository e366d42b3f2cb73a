"""The command line: parse, call a checkpoint, text or engine, render. The project's
environment variables (PUFFERGPT_DATA, PUFFERGPT_DSN, TURBOPUFFER_API_KEY,
TURBOPUFFER_REGION, TURBOPUFFER_BASE_URL) are read here and nowhere else."""

from __future__ import annotations

import codecs
import json
import os
import time
from pathlib import Path

from contextlib import contextmanager

import click

from puffergpt import checkpoints, hub, tokenizer
from puffergpt.documents import METRICS
from puffergpt.sampling import Sampling
from puffergpt.stores import BACKENDS

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


def data_option(f):
    return click.option("--data", "data_dir", type=click.Path(path_type=Path), envvar="PUFFERGPT_DATA",
                        default=None, help="where the embedded store keeps its files, and pgvector's local server [env PUFFERGPT_DATA; default: the user data dir]")(f)


def backend_option(f):
    f = click.option("--dsn", envvar="PUFFERGPT_DSN", default=None,
                     help="PostgreSQL connection string for --backend pgvector; without one, a local server under --data [env PUFFERGPT_DSN]")(f)
    return click.option("--backend", type=click.Choice(BACKENDS), default="embedded", show_default=True,
                        help="the vector database that holds the weights")(f)


SERVING = "serving.json"  # written by serve in its data directory: where it listens, for the other commands


def default_data(data_dir: Path | None) -> Path:
    import platformdirs

    return data_dir or Path(platformdirs.user_data_dir("puffergpt"))


def open_store(backend: str, data_dir: Path | None, dsn: str | None = None):
    """The store, with its settings from the options and, for turbopuffer, the environment."""
    from puffergpt.stores import open_store as _open

    return _open(backend, default_data(data_dir), dsn=dsn,
                 api_key=os.environ.get("TURBOPUFFER_API_KEY"), region=os.environ.get("TURBOPUFFER_REGION"),
                 base_url=os.environ.get("TURBOPUFFER_BASE_URL"))


@contextmanager
def clear_errors():
    """Known failures become one clear line and a non-zero exit, not a traceback."""
    from puffergpt.stores.base import StoreError, StoreHeld

    try:
        yield
    except StoreHeld as e:
        fail(f"{e}{serving_hint(e)}")
    except (checkpoints.CheckpointError, StoreError, ValueError, OSError) as e:
        fail(str(e))


def serving_hint(e) -> str:
    """When `puffergpt serve` holds the data directory: how to ask it instead."""
    try:
        s = json.loads((Path(e.data_dir) / SERVING).read_text())
    except (OSError, ValueError, TypeError):
        return ""
    if str(s.get("pid")) != str(e.holder):
        return ""
    return (f". It is `puffergpt serve` ({s.get('model')}) at {s['url']}: open that page, or ask it from here: "
            f"curl -sN {s['url']}v1/completions -H 'Content-Type: application/json' "
            f"-d '{{\"prompt\": \"Hello\", \"max_tokens\": 32, \"stream\": true}}'")


@main.command()
@click.option("--model", default="demo", show_default=True, help=MODEL_HELP)
@backend_option
@data_option
@click.option("--metric", type=click.Choice(METRICS), default=None,
              help="the encoding of rows as documents [default: the store's most precise]")
@click.option("--repair", is_flag=True, help="read every document back and rewrite what does not match")
def load(model, backend, dsn, data_dir, metric, repair) -> None:
    """Write a model's weights into the store, one document a row."""
    from puffergpt import loading

    with clear_errors():
        ckpt = checkpoints.load(model)
        store = open_store(backend, data_dir, dsn)
        t0 = time.perf_counter()
        try:
            m = loading.load(store, ckpt, loading.model_key(model), metric=metric, repair=repair)
        finally:
            store.close()
    from puffergpt import costs

    nbytes = loading.stored_bytes(m)
    click.echo(f"{model}: {m['documents']:,} documents ({nbytes / 1e6:,.0f} MB) in {len(m['namespaces'])} namespaces, "
               f"metric {m['metric']}, ready ({time.perf_counter() - t0:.1f} s). At turbopuffer's rates: "
               f"${costs.request_cost('write', nbytes, 0):.2f} to write, ${costs.storage_cost_per_month(nbytes):.2f} a month to keep.")


@main.command()
@click.option("--model", default="demo", show_default=True, help=MODEL_HELP)
@backend_option
@data_option
def verify(model, backend, dsn, data_dir) -> None:
    """Read every document back and check it against the manifest."""
    from puffergpt import loading

    with clear_errors():
        store = open_store(backend, data_dir, dsn)
        try:
            key = loading.model_key(model)
            m = loading.read_manifest(store, key, model)
            loading.check_on_open(store, key, model, m, progress=True, force=True)  # StoreDamaged: what, and the fix
        finally:
            store.close()
    click.echo(f"{model}: all {m['documents']:,} documents match the manifest")


def resolve_model(model: str | None) -> tuple[str, str | None]:
    """--model, or what serve and generate both default to: GPT-2 small when it can be had,
    else the demo model, with a one-line note saying why."""
    if model is not None:
        return model, None
    model, note = hub.default_model()
    if note:
        click.echo(f"puffergpt: using the demo model. {note}", err=True)
    return model, note


def search_engine(store, model: str):
    """The model's engine on a store, loading it into the store on first use."""
    from puffergpt import loading
    from puffergpt.engine import Engine

    try:
        return Engine(store, model, verify=True, progress=True)  # never serve a damaged store
    except loading.NotLoaded as e:
        click.echo(f"{e.args[0].split(':')[0]}; loading it now", err=True)
        try:
            ckpt = checkpoints.load(model)
        except checkpoints.CheckpointError as ce:
            hint = " Or serve the demo model: `puffergpt serve --model demo`." if model in hub.HUB_MODELS else ""
            fail(f"{ce}{hint}")
        loading.load(store, ckpt, loading.model_key(model))
        del ckpt  # the weights leave the server's memory once they are documents
        return Engine(store, model, verify=True, progress=True)


@main.command()
@click.argument("prompt")
@click.option("--model", default=None, help=MODEL_HELP + " [default: gpt2, or the demo model when GPT-2 small can't be had]")
@click.option("--engine", type=click.Choice(["search", "reference"]), default="search", show_default=True,
              help="search: every product a vector search; reference: the numpy GPT-2")
@backend_option
@data_option
@click.option("--temperature", type=float, default=1.0, show_default=True, help="0 is greedy")
@click.option("--top-k", type=int, default=40, show_default=True)
@click.option("--seed", type=int, default=None, help="makes sampling reproducible")
@click.option("-n", "n_tokens", type=int, default=32, show_default=True, help="tokens to generate")
@click.option("--json", "as_json", is_flag=True, help="one JSON object a token, then a summary line")
@click.option("--inspect", is_flag=True, help="with --json: each token's attention per layer and head, the logit lens, what each part "
              "adds to its logit (attribution) and each layer's most active MLP neurons")
@click.option("--lens-k", type=click.IntRange(5, 100), default=10, show_default=True, help="tokens per layer in the lens")
def generate(prompt, model, engine, backend, dsn, data_dir, temperature, top_k, seed, n_tokens, as_json, inspect, lens_k) -> None:
    """Continue PROMPT."""
    from puffergpt.text import TextError, check_generation
    from puffergpt.completion import complete

    if not prompt:
        fail("the prompt is empty: give some text to continue")
    if n_tokens < 0:
        fail(f"-n must be >= 0, got {n_tokens}")
    if inspect and not as_json:
        fail("--inspect adds attention and the lens to the --json output: give --json too")
    model, _ = resolve_model(model)
    ids = tokenizer.encode(prompt)
    s = Sampling(temperature, top_k, seed)
    with clear_errors():
        open_products, store = make_products(engine, model, backend, data_dir, dsn)
        try:
            config = open_products.config
            try:
                check_generation(config, s, len(ids), n_tokens)
            except TextError as e:
                fail(str(e))
            steps = complete(open_products, ids, n_tokens, s, inspect=lens_k if inspect else 0, explain=inspect)
            run_generate(steps, prompt, ids, as_json,
                         {"model": model, "engine": engine, "backend": backend if engine == "search" else None})
        finally:
            if store is not None:
                store.close()


@main.command()
@click.option("--model", default=None, help=MODEL_HELP + " [default: gpt2, or the demo model when GPT-2 small can't be downloaded]")
@backend_option
@data_option
@click.option("--notebook", "notebook_path", type=click.Path(path_type=Path), default=None,
              help="the insight notebook, a git repository [default: DATA/notebook]")
@click.option("--host", default="127.0.0.1", show_default=True, help="the address to listen on")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--max-texts", type=click.IntRange(1, 1000), default=32, show_default=True, help="texts open at once")
@click.option("--idle-minutes", type=click.FloatRange(0.1, 10080), default=30.0, show_default=True,
              help="an idle text is closed after this long")
def serve(model, backend, dsn, data_dir, notebook_path, host, port, max_texts, idle_minutes) -> None:
    """Serve the playground and the HTTP API; load the model first if needed."""
    from puffergpt import notebook as nb
    from puffergpt.notebook_cli import notebook_dir
    from puffergpt.reference import NumpyProducts
    from puffergpt.server import create_app
    from puffergpt.server.app import run as run_server

    model, fallback = resolve_model(model)
    with clear_errors():
        store = open_store(backend, data_dir, dsn)
        engine = search_engine(store, model)
        try:
            notebook = nb.Notebook(notebook_dir(notebook_path, data_dir))
        except nb.NotebookError as e:
            fail(f"{e} (choose another with --notebook DIR)")

    def reference():  # Compare reads the checkpoint only while it compares
        return NumpyProducts(checkpoints.load(model))

    from puffergpt.server import ServerConfig

    loopback = host in ("127.0.0.1", "localhost", "::1")
    trusted = ("127.0.0.1", "localhost", "[::1]") if loopback else None  # no DNS rebinding onto a local server
    app = create_app(engine, ServerConfig(max_open_texts=max_texts, idle_s=idle_minutes * 60, trusted_hosts=trusted,
                                          fallback=fallback), reference=reference, notebook=notebook)
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address goes in brackets in a URL
    url = f"http://{shown}:{port}/"
    click.echo(f"puffergpt: {model} on {backend}, {engine.manifest['documents']:,} documents. Open {url}")
    serving = default_data(data_dir) / SERVING if backend == "embedded" else None
    if serving is not None:  # so that a command that finds the directory held can say where to go
        serving.write_text(json.dumps({"url": url, "pid": os.getpid(), "model": model}))
    try:
        run_server(app, host, port)  # its shutdown stops running generations first
    finally:
        if serving is not None:
            serving.unlink(missing_ok=True)


@main.command()
@click.option("--model", default="demo", show_default=True, help=MODEL_HELP)
@click.option("--backends", default="embedded", show_default=True, help="comma-separated backends to run")
@click.option("--dsn", envvar="PUFFERGPT_DSN", default=None, help="PostgreSQL connection string for pgvector [env PUFFERGPT_DSN]")
@data_option
@click.option("--quick", is_flag=True, help="fewer positions and tokens: a smoke run in about a minute")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None, help="write the results as JSON")
@click.option("--chart", "chart_out", type=click.Path(path_type=Path), default=None, help="write a PNG chart (needs matplotlib)")
@click.option("--no-torch", is_flag=True, help="leave out transformers even if it is installed")
@click.option("--rounds", type=click.IntRange(1, 20), default=None, help="interleaved rounds over the engines [default: 2, quick: 1]")
def bench(model, backends, dsn, data_dir, quick, json_out, chart_out, no_torch, rounds) -> None:
    """Time the engines side by side on one model: numpy, transformers, each backend."""
    import tempfile

    from puffergpt import bench as b
    from puffergpt import loading
    from puffergpt.engine import Engine

    names = [n.strip() for n in backends.split(",") if n.strip()]
    bad = [n for n in names if n not in BACKENDS]
    if bad or not names:
        fail(f"unknown backend {bad[0] if bad else backends!r}: use some of {', '.join(BACKENDS)}")
    with clear_errors(), tempfile.TemporaryDirectory(prefix="puffergpt-bench-") as tmp:
        path, _ = checkpoints.resolve(model)
        ckpt = checkpoints.load(model)
        engines, loads = {}, {}
        stores = []
        for name in names:
            store = open_store(name, data_dir or Path(tmp) / name, dsn)
            stores.append(store)
            t0 = time.perf_counter()
            loading.load(store, ckpt, loading.model_key(model))
            loads[name] = {"load_s": round(time.perf_counter() - t0, 2), "disk_mb": store_size_mb(store)}
            engines[name] = Engine(store, model).open
        plan = b.Plan.quick() if quick else b.Plan()
        if rounds:
            plan.rounds = rounds
        report = b.bench(ckpt, str(path), engines, plan, with_torch=not no_torch)
        for r in report["results"]:
            r.update(loads.get(r["engine"], {}))
        for store in stores:  # before the temporary directory goes (pgvector's local server lives there)
            store.close()
    click.echo(b.table(report))
    if json_out:
        json_out.write_text(json.dumps(report, indent=2) + "\n")
        click.echo(f"wrote {json_out}")
    if chart_out:
        b.chart(report, str(chart_out))
        click.echo(f"wrote {chart_out}")


def store_size_mb(store) -> float | None:
    disk_bytes = getattr(store, "disk_bytes", None)  # the embedded store: its data directory's files
    return round(disk_bytes() / 1e6, 1) if disk_bytes else None


def make_products(engine: str, model: str, backend: str, data_dir: Path | None, dsn: str | None = None):
    """A function that opens the products for one text, and the store behind them (None
    for numpy). The callable carries the model's ``config``."""
    if engine == "reference":
        from puffergpt.reference import NumpyProducts

        ckpt = checkpoints.load(model)
        opener = lambda: NumpyProducts(ckpt)  # noqa: E731
        opener.config = ckpt.config
        return opener, None
    checkpoints.check_model(model)  # a bad name or path says so before the store is opened
    store = open_store(backend, data_dir, dsn)
    try:
        e = search_engine(store, model)
        opener = e.open
        return _with_config(opener, e.config), store
    except BaseException:
        store.close()
        raise


def _with_config(f, config):
    def opener():
        return f()

    opener.config = config
    return opener


def run_generate(steps, prompt, ids, as_json, summary) -> None:
    """Render a completion: the text as it streams (or one JSON line a token), then the
    usage of the prefill and the decode."""
    from puffergpt.completion import Usage

    t0, done = time.perf_counter(), []
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span tokens
    if not as_json:
        click.echo(prompt, nl=False)
    for step in steps:
        done.append(step)
        if as_json:
            click.echo(json.dumps(step_line(step)))
        else:
            click.echo(utf8.decode(tokenizer.token_bytes(step.token_id)), nl=False)
    if not as_json:
        click.echo(utf8.decode(b"", final=True), nl=False)
    phases = {k: u.to_json() for k, u in Usage.phases(done, len(ids)).items()}
    summary |= {"prompt_tokens": len(ids), "new_tokens": len(done), "ms": round((time.perf_counter() - t0) * 1e3, 1), **phases}
    if as_json:
        click.echo(json.dumps({"summary": summary}))
    else:
        click.echo()
        p, d = summary["prefill"], summary["decode"]
        click.echo(f"[prefill: {p['tokens']} tokens, {p['requests']} requests, {p['round_trips']} round trips, {p['ms']:.0f} ms | "
                   f"decode: {d['tokens']} tokens, {d['requests']} requests, {d['round_trips']} round trips, {d['ms']:.0f} ms | "
                   f"${p['cost_usd'] + d['cost_usd']:.6f} at turbopuffer's rates]", err=True)


def step_line(step) -> dict:
    """The --json line of a token; with --inspect, its attention, lens, attribution and
    neurons (see the README)."""
    from puffergpt import inside, views

    d = step.to_json()
    if step.inspect is not None:
        got = step.inspect
        d["attention"] = [[[round(float(w), 6) for w in head[: step.position]] for head in layer] for layer in got["weights"]]
        d["lens"] = [[{"token_id": int(i), "logit": float(v)} for i, v in zip(e["ids"], e["logits"])] for e in got["lens"]]
        d["decided_layer"] = inside.decided_layer(got["lens"])
        d["final_top1"] = views.token_dict(inside.final_top1(got["lens"]))
        if "attribution" in got:
            d["attribution"], d["neurons"] = got["attribution"], got["neurons"]
    return d


@main.command()
@click.argument("a")
@click.argument("b")
@click.argument("c")
@click.option("--model", default=None, help=MODEL_HELP + " [default: as serve]")
@backend_option
@data_option
@click.option("-k", "k", type=click.IntRange(1, 100), default=10, show_default=True, help="answers to show")
@click.option("--json", "as_json", is_flag=True, help='{"results": [{"token_id", "text", "score"}, ...]}')
def analogy(a, b, c, model, backend, dsn, data_dir, k, as_json) -> None:
    """A is to B as C is to ?: the tokens nearest by cosine to wte[B] - wte[A] + wte[C], as one search.

    Words are GPT-2 tokens: a word inside a sentence carries its leading space (" man")."""
    from puffergpt import views
    from puffergpt.text import TextError

    model, _ = resolve_model(model)
    with clear_errors():
        checkpoints.check_model(model)
        store = open_store(backend, data_dir, dsn)
        try:
            products = search_engine(store, model).views()
            try:
                got = views.analogy(products, a, b, c, k)
            except TextError as e:
                fail(str(e))
            finally:
                products.close()
        finally:
            store.close()
    if as_json:
        click.echo(json.dumps({"results": got["results"]}))
        return
    click.echo(f"{a!r} is to {b!r} as {c!r} is to:")
    for r in got["results"]:
        click.echo(f"  {r['score']:.4f}  {r['text']!r}  (token {r['token_id']})")


def _attach_notebook() -> None:
    from puffergpt.notebook_cli import notebook

    main.add_command(notebook)


_attach_notebook()


if __name__ == "__main__":
    main()
