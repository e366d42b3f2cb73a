"""``puffergpt generate``, ``analogy``, ``contexts`` and ``writes``: ask the model from the terminal,
and render what it says (the text as it streams, or one JSON line a token: ``protocol.step_line``,
then the usage)."""

from __future__ import annotations

import codecs
import json
import time

import click

from puffergpt.app.protocol import MAX_CONTEXT_CHARS, step_line
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
from puffergpt.lens.inside import MAX_VIEW_K
from puffergpt.model import tokenizer
from puffergpt.model.sampling import Sampling


@click.command(cls=BackendCommand)
@click.argument("prompt")
@click.option("--model", default=None,
              help=MODEL_HELP + " [default: gpt2, or the demo model when GPT-2 small can't be had]")
@ENGINE
@option("backend")
@option("data_dir")
@option("output_search")
@click.option("--temperature", type=float, default=1.0, show_default=True, help="0 is greedy")
@click.option("--top-k", type=int, default=40, show_default=True)
@click.option("--seed", type=int, default=None, help="makes sampling reproducible")
@click.option("-n", "n_tokens", type=int, default=32, show_default=True, help="tokens to generate")
@click.option("--presence-penalty", type=float, default=0.0, show_default=True,
              help="OpenAI's, -2..2: subtracted once from the logit of each token already generated")
@click.option("--frequency-penalty", type=float, default=0.0, show_default=True,
              help="OpenAI's, -2..2: subtracted from a token's logit once for each time it was generated")
@click.option("--repetition-penalty", type=float, default=1.0, show_default=True,
              help="transformers' and vLLM's, > 0: each token in the text so far, its logit divided by it "
                   "where positive and multiplied by it where negative")
@click.option("--logit-bias", "logit_bias", multiple=True, metavar="ID=BIAS",
              help="add BIAS (-100..100) to token ID's logit, repeatable (the candidates are the best after it)")
@click.option("--min-p", type=float, default=0.0, show_default=True,
              help="0..1: keep only the tokens at least this times as likely as the best")
@click.option("--json", "as_json", is_flag=True,
              help='one JSON object a token, then a summary line; each candidate\'s "prob" is the sampler\'s (over '
                   'the top k), its "p_all" the model\'s own over the whole vocabulary (one search more a token)')
@click.option("--inspect", is_flag=True,
              help="with --json: each token's attention per layer and head, the logit lens, what each part "
                   "adds to its logit (attribution) and each layer's most active MLP neurons")
@click.option("--lens-k", type=click.IntRange(5, MAX_VIEW_K), default=10, show_default=True,
              help="tokens per layer in the lens")
@click.option("--versus", type=int, default=None, metavar="ID",
              help="with --inspect: the attribution's versus explains logit(chosen) - logit(ID) "
                   "[default: each token's runner-up]")
@click.option("--ablate", "ablate", multiple=True, metavar="PART",
              help="switch a part of the model off at every position, repeatable: 'attn L.H' (layer L's head H, "
                   "its mixed values zeroed before c_proj) or 'mlp L' (layer L's MLP output, bias included)")
def generate(prompt, model, engine, backend, backend_settings, data_dir, output_search, temperature, top_k, seed,
             n_tokens, presence_penalty, frequency_penalty, repetition_penalty, logit_bias, min_p, as_json, inspect,
             lens_k, versus, ablate) -> None:
    """Continue PROMPT."""
    from puffergpt.app.completion import complete

    if not prompt:
        fail("the prompt is empty: give some text to continue")
    if n_tokens < 0:
        fail(f"-n must be >= 0, got {n_tokens}")
    if inspect and not as_json:
        fail("--inspect adds attention and the lens to the --json output: give --json too")
    if versus is not None and not inspect:
        fail("--versus sets what the attribution is compared with: give --json --inspect too")
    model, _ = resolve_model(model)
    ids = tokenizer.encode(prompt)
    s = Sampling(temperature, top_k, seed, 1.0, min_p, presence_penalty, frequency_penalty, repetition_penalty,
                 parse_bias(logit_bias))
    with clear_errors(), open_model(engine, model, backend, data_dir, backend_settings,
                                    output_search=output_search) as opened:
        off = checked(opened.config, s, len(ids), n_tokens, ablate, versus)
        steps = complete(opened.open_run, ids, n_tokens, s, inspect=lens_k if inspect else 0, explain=inspect,
                         versus=versus, ablation=off, over_all=as_json)
        run_generate(steps, prompt, ids, as_json,
                     {"model": model, "engine": engine, "backend": backend if engine == "search" else None}
                     | ({"ablate": off.parts} if off.parts else {})
                     | ({"output_search": output_search} if output_search != "exact" else {}))


def parse_bias(pairs: tuple[str, ...]) -> dict[int, float]:
    """--logit-bias ID=BIAS, repeated -> {id: bias} (each bound checked with the sampling)."""
    from puffergpt.model.sampling import bias_from_json

    raw = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        try:
            raw[key.strip()] = float(value)
        except ValueError:
            fail(f"--logit-bias {pair!r}: write ID=BIAS, e.g. --logit-bias 50256=-100")
        if not eq:
            fail(f"--logit-bias {pair!r}: write ID=BIAS, e.g. --logit-bias 50256=-100")
    try:
        return bias_from_json(raw)
    except ValueError as e:
        fail(f"--logit-bias: {e}")


def checked(config, s, n_prompt: int, n: int, ablate: tuple[str, ...], versus: int | None):
    """The generation's options checked against the model, each refusal naming its option.
    -> the parts switched off (``reference.Ablation``)"""
    from puffergpt.model.reference import Ablation
    from puffergpt.texts.text import TextError, check_generation, check_token_ids

    try:
        check_generation(config, s, n_prompt, n)
    except TextError as e:
        fail(str(e))
    try:
        off = Ablation.of(ablate, config)
    except ValueError as e:
        fail(f"--ablate: {e}")
    try:
        check_token_ids([] if versus is None else [versus], config.n_vocab)
    except TextError as e:
        fail(f"--versus: {e}")
    return off


def run_generate(steps, prompt, ids, as_json, summary) -> None:
    """Render a completion: the text as it streams (or one JSON line a token), then the
    usage of the prefill and the decode."""
    from puffergpt.app.completion import Usage

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
    summary |= {"prompt_tokens": len(ids), "new_tokens": len(done),
                "ms": round((time.perf_counter() - t0) * 1e3, 1), **phases}
    if as_json:
        click.echo(json.dumps({"summary": summary}))
        return
    click.echo()
    p, d = summary["prefill"], summary["decode"]
    click.echo(f"[prefill: {p['tokens']} tokens, {p['requests']} requests, {p['round_trips']} round trips, "
               f"{p['ms']:.0f} ms | decode: {d['tokens']} tokens, {d['requests']} requests, "
               f"{d['round_trips']} round trips, {d['ms']:.0f} ms | "
               f"${p['cost_usd'] + d['cost_usd']:.6f} at turbopuffer's rates]", err=True)
    if summary.get("ablate"):
        click.echo(f"[switched off at every position: {', '.join(summary['ablate'])}]", err=True)


@click.command(cls=BackendCommand)
@click.argument("a")
@click.argument("b")
@click.argument("c")
@click.option("--model", default=None, help=MODEL_HELP + " [default: as serve]")
@option("backend")
@option("data_dir")
@click.option("-k", "k", type=click.IntRange(1, MAX_VIEW_K), default=10, show_default=True, help="answers to show")
@click.option("--json", "as_json", is_flag=True,
              help='{"results": [{"token_id", "text", "score", "count", "rare"}, ...], "rare_below", "rare_note", ...}')
def analogy(a, b, c, model, backend, backend_settings, data_dir, k, as_json) -> None:
    """A is to B as C is to ?: the tokens nearest by cosine to wte[B] - wte[A] + wte[C], as one search.

    Words are GPT-2 tokens: a word inside a sentence carries its leading space (" man"). An answer
    seen rarely in training is marked with its count, where the model's counts are known."""
    from puffergpt.lens import views
    from puffergpt.texts.text import TextError

    model, _ = resolve_model(model)
    with clear_errors(), open_model("search", model, backend, data_dir, backend_settings) as opened:
        run = opened.engine.views()
        try:
            got = views.analogy(run.weights, a, b, c, k, opened.engine.token_counts)
        except TextError as e:
            fail(str(e))
        finally:
            run.session.close()
    if as_json:
        keys = ("results", "rare_below", "counts_known", "rare_inputs", "rare_results", "rare_note", "note")
        click.echo(json.dumps({key: got[key] for key in keys}))
        return
    click.echo(f"{a!r} is to {b!r} as {c!r} is to:")
    for r in got["results"]:
        seen = "" if r["count"] is None else f", seen {r['count']:,} times" + (" (rare)" if r["rare"] else "")
        click.echo(f"  {r['score']:.4f}  {r['text']!r}  (token {r['token_id']}{seen})")
    for note in (got["note"], got["rare_note"]):
        if note:
            click.echo(f"note: {note}")


@click.command(cls=BackendCommand)
@click.argument("word")
@click.argument("prompts", nargs=-1)
@click.option("--model", default=None, help=MODEL_HELP + " [default: as serve]")
@ENGINE
@option("backend")
@option("data_dir")
@click.option("--control", default=None, metavar="PROMPT",
              help="a control: WORD in the sense it has in the first PROMPT; its cosine with the first prompt, "
                   "layer by layer, is the baseline the other pairs are read against")
@click.option("--json", "as_json", is_flag=True,
              help='{"word_id", "positions", "layers": [{"layer", "cosine", "lens"}]}; with --control, '
                   '"control_position" and each layer\'s "control"')
def contexts(word, prompts, model, engine, backend, backend_settings, data_dir, control, as_json) -> None:
    """How WORD's vector changes with its context: WORD in 2 or 3 PROMPTs, layer by layer.

    For each layer, the cosine between the contexts' residual vectors at WORD's first
    occurrence, and what each context's logit lens says there; with --control, the control
    pair's cosine beside them, and what each line did, in words, read against it. WORD is one
    GPT-2 token: inside a sentence it carries its leading space (" mole")."""
    from puffergpt.lens import contexts as ctx
    from puffergpt.model import token_counts
    from puffergpt.texts.text import TextError

    try:
        ctx.check(word, list(prompts), MAX_CONTEXT_CHARS, control)  # a bad word or prompt says so before a model opens
    except TextError as e:
        fail(str(e))
    model, _ = resolve_model(model)
    with clear_errors(), open_model(engine, model, backend, data_dir, backend_settings) as opened:
        counts = token_counts.for_model(model, opened.config.n_vocab)
        try:
            got = ctx.contexts(opened.open_run, opened.config, word, list(prompts), 1, control, counts)  # lens top-1
        except TextError as e:
            fail(str(e))
    if as_json:
        click.echo(json.dumps(ctx.contract(got)))
        return
    render_contexts(got)


def render_contexts(got: dict) -> None:
    """The text output: where the word is, then a line a layer: the cosine of each pair of
    contexts (and the control's) and each context's lens top-1; then the reading and the notes."""
    n, word = len(got["contexts"]), got["word"]["text"]
    r = got["rarity"]
    seen = "" if r["count"] is None else f", seen {r['count']:,} times in training" + (" (rare)" if r["rare"] else "")
    click.echo(f"{word!r}: token {got['word_id']}{seen}")
    for i, c in enumerate(got["contexts"], 1):
        click.echo(f"{i}: {c['prompt']!r}: {word!r} at position {c['position']}")
    control = got["control"]
    if control:
        click.echo(f"control: {control['prompt']!r}: {word!r} at position {control['position']}, read against 1")
    pairs = [(a, b) for a in range(n) for b in range(a + 1, n)]
    click.echo("layer   " + "  ".join(f"cos {a + 1}-{b + 1}" for a, b in pairs) + ("  cos 1-C" if control else "")
               + "   lens top-1 of each")
    last = len(got["layers"]) - 1
    for e in got["layers"]:
        name = "ln_f" if e["layer"] == last else str(e["layer"])
        cos = "  ".join(f"{e['cosine'][a][b]:7.4f}" for a, b in pairs) + (f"  {e['control']:7.4f}" if control else "")
        tops = " | ".join(repr(tokenizer.token_text(t)) for t in e["lens"])
        click.echo(f"{name:>5}   {cos}   {tops}")
    for line in got["reading"]:
        click.echo(line)
    for note in (r["note"], got["lens_note"]):
        if note:
            click.echo(f"note: {note}")
    reqs = got["requests"]
    cost = (f"{len(reqs)} requests, {sum(q.round_trips for q in reqs)} round trips" if reqs
            else "the numpy reference: no searches")
    click.echo(f"[layer l < {last}: the residual entering block l; ln_f: entering ln_f | {cost}]", err=True)


@click.command(cls=BackendCommand)
@click.argument("head", metavar="L.H")
@click.argument("prompt")
@click.option("--model", default=None, help=MODEL_HELP + " [default: as serve]")
@ENGINE
@option("backend")
@option("data_dir")
@click.option("--json", "as_json", is_flag=True,
              help='{"token_id", "position", "sources": [{"position", "weight", "effect", "top"}], "total"}')
def writes(head, prompt, model, engine, backend, backend_settings, data_dir, as_json) -> None:
    """What head L.H (layer L's head H) writes at PROMPT's last position, from each position it attends to.

    Each source position j gives a piece a_j * v_j @ W_O (its attention weight, its value vector, the head's rows
    of c_proj); its effect is its share of the logit of the model's next token (greedy), read through ln_f as the
    attribution reads a part, so the effects sum to the head's part; its top are the 5 tokens it pushes most."""
    from puffergpt.lens import inspector
    from puffergpt.texts.text import TextError, opened

    if not prompt:
        fail("the prompt is empty: give some text for the head to read")
    model, _ = resolve_model(model)
    ids = tokenizer.encode(prompt)
    with clear_errors(), open_model(engine, model, backend, data_dir, backend_settings) as om:
        try:
            with opened(om.open_run, ids) as text:
                text.read()
                got, requests = inspector.head_writes(text, len(ids), head)
        except TextError as e:
            fail(str(e))
    if as_json:
        click.echo(json.dumps({k: got[k] for k in ("token_id", "position", "sources", "total")}))
        return
    render_writes(got, ids, requests)


def render_writes(got: dict, ids: list[int], requests: list) -> None:
    """The text output: a line a source position, the strongest effect first."""
    word = tokenizer.token_text(got["token_id"])
    click.echo(f"L{got['layer']} H{got['head']} at position {got['position']}, read against the next token {word!r}:")
    click.echo("  pos  token              weight    effect   pushes most")
    for s in sorted(got["sources"], key=lambda s: -abs(s["effect"])):
        tops = " ".join(repr(tokenizer.token_text(t)) for t, _ in s["top"])
        click.echo(f"{s['position']:5d}  {tokenizer.token_text(ids[s['position']])!r:16.16} {s['weight']:8.4f} "
                   f"{s['effect']:+9.4f}   {tops}")
    cost = f"{len(requests)} requests" if requests else "the numpy reference: no searches"
    click.echo(f"total {got['total']:+.4f}: the head's part of the logit of {word!r} [{cost}]", err=True)
