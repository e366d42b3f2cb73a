"""Train the small GPT-2-architecture "demo" model that ships with puffergpt.

The offline playground (and every test) needs a GPT-2-shaped checkpoint that
writes English, copies what it has seen (an induction head the attention view can
show) and has token rows worth comparing, without a download. This trains one in
about an hour on 2 CPU cores from English text that Debian packages ship:

    apt-get install -y wordnet-base fortunes fortunes-min   # the corpora, read from /usr/share
    python scripts/train_demo.py                             # writes src/puffergpt/models/demo/

plus Python's own documentation (``pydoc_data``) and a small share of synthetic
sequences that repeat themselves (random token spans; lines like ``a = 7``), which
teach copying. Checkpoints go to ``--work`` every few minutes; a stopped run can be
finished from the last one with ``--finish``.

Output is in the layout of ``openai-community/gpt2`` on the hub
(``model.safetensors`` without the ``transformer.`` prefix, fp16, tied
``lm_head``; ``config.json``; ``README.md``), so the same loaders read both.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import platform
import pydoc_data.topics
import random
import sys
import tempfile
import time

import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from puffergpt.lens.views import CARD_ANALOGIES
from puffergpt.model import token_counts
from puffergpt.model.tokenizer import EOT, decode, encode

BLOCK = 256  # context length = n_positions
VOCAB = 50257
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
HELD_OUT = os.path.join(ROOT, "tests", "data", "english.txt")  # never trained on: the perplexity test's text

WORDNET = "/usr/share/wordnet"
FORTUNES = "/usr/share/games/fortunes"
# Fortune files left out: pictures rather than prose, non-English, or jokes at groups of people.
FORTUNES_SKIP = {"ascii-art", "translate-me", "ethnic", "men-women"}
SOURCES = {  # name -> (apt package, licence), recorded in the model card
    "wordnet": ("wordnet-base", ("WordNet 3.0 licence (Princeton; permissive, keep the notice): "
                "/usr/share/doc/wordnet-base/copyright")),
    "fortunes": ("fortunes fortunes-min", ("BSD (fortune-mod, from 4.4BSD; the quotations are short "
                 "excerpts from their named authors): /usr/share/doc/fortunes/copyright")),
    "pydoc": ("(ships with Python)", "PSF License: Python's documentation topics, pydoc_data.topics"),
}
POS = {"noun": "noun", "verb": "verb", "adj": "adjective", "adv": "adverb"}


def need(path: str, package: str) -> str:
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: install it with `apt-get install -y {package}` (Debian/Ubuntu)")
    return path


def sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def wordnet_docs(inputs: dict[str, str]) -> list[str]:
    """One short document per WordNet synset: its words, part of speech, gloss and examples.

    A line of data.noun reads ``offset lexfile n 02 king 0 male_monarch 0 ... | gloss; "example"``;
    it becomes ``king, male monarch (noun): gloss. "example"``. The licence header lines start
    with two spaces and are skipped.
    """
    docs = []
    for pos, name in POS.items():
        path = need(os.path.join(WORDNET, f"data.{pos}"), "wordnet-base")
        inputs[path] = sha256(path)
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith("  ") or "|" not in line:
                    continue
                head, gloss = line.split("|", 1)
                fields = head.split()
                n_words = int(fields[3], 16)
                words = [fields[4 + 2 * i].split("(")[0].replace("_", " ") for i in range(n_words)]
                docs.append(f"{', '.join(words)} ({name}): {gloss.strip()}")
    return docs


def fortune_docs(inputs: dict[str, str]) -> list[str]:
    """Every fortune (the files separate them with lines holding only ``%``)."""
    need(FORTUNES, "fortunes fortunes-min")
    docs = []
    for path in sorted(glob.glob(os.path.join(FORTUNES, "*"))):
        name = os.path.basename(path)
        if "." in name or name in FORTUNES_SKIP or not os.path.isfile(path):
            continue  # .dat indexes, .u8 links
        inputs[path] = sha256(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            docs += [d.strip("\n") for d in f.read().split("\n%\n") if d.strip()]
    return docs


def pydoc_docs(inputs: dict[str, str]) -> list[str]:
    inputs[pydoc_data.topics.__file__] = sha256(pydoc_data.topics.__file__)
    return [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)]


def load_data(val_frac: float, seed: int) -> tuple[dict, dict]:
    """Token ids per source, split into train and validation by whole documents.

    Each source's documents are shuffled with ``seed`` (so validation is spread over the
    source, not its last letters) and joined with <|endoftext|> between them; the last
    ``val_frac`` of documents are held out. Documents holding any line of the held-out
    English text are dropped, so the perplexity test's text is never seen.
    """
    inputs: dict[str, str] = {}
    with open(HELD_OUT, encoding="utf-8") as f:
        held_lines = {line.strip() for line in f if len(line.strip()) > 20}
    inputs[HELD_OUT] = sha256(HELD_OUT)
    data, stats = {}, {}
    for name, fn in (("wordnet", wordnet_docs), ("fortunes", fortune_docs), ("pydoc", pydoc_docs)):
        docs = [d for d in fn(inputs) if not any(h in d for h in held_lines)]
        random.Random(seed).shuffle(docs)
        n_val = max(1, int(len(docs) * val_frac))

        def flat(ds: list[str]) -> torch.Tensor:  # documents joined with <|endoftext|>
            return torch.tensor([t for d in ds for t in encode(d) + [EOT]], dtype=torch.long)

        data[name] = (flat(docs[:-n_val]), flat(docs[-n_val:]))
        stats[name] = {"docs": len(docs), "val_docs": n_val,
                       "train_tokens": len(data[name][0]), "val_tokens": len(data[name][1])}
    return data, {"sources": stats, "inputs": inputs}


# --- synthetic copying -----------------------------------------------------------
# A model learns to copy (an induction head: "find the earlier token like this one,
# predict what came after it") fastest from text that repeats itself. Only the
# repeats are scored; the first copy of a random span cannot be predicted.

def copy_spans(rng: random.Random, common: list[int]) -> tuple[list[int], list[int]]:
    """(ids, scored) for one window: a random span of common tokens, repeated until BLOCK + 1."""
    span = [rng.choice(common) for _ in range(rng.randint(8, 48))]
    ids = (span * (BLOCK // len(span) + 2))[: BLOCK + 1]
    return ids, [0] * len(span) + [1] * (BLOCK + 1 - len(span))


def copy_lines(rng: random.Random) -> tuple[list[int], list[int]]:
    """(ids, scored): blocks of ``name = value`` lines, each block written twice or three times."""
    ids, scored = [], []
    names = "abcdefghijkmnpqrstuvwxyz"
    while len(ids) < BLOCK + 1:
        k = rng.randint(2, 6)
        lines = [f"{v} = {rng.randint(0, 99) if rng.random() < 0.5 else rng.randint(0, 9)}"
                 for v in rng.sample(names if rng.random() < 0.7 else
                                     ["x", "y", "z", "n", "total", "count", "size", "age", "width", "height",
                                      "price", "score", "left", "right", "top", "speed"], k)]
        first = encode("\n".join(lines) + "\n")
        again = encode("\n".join(lines * rng.randint(1, 2)) + "\n\n")
        ids += first + again
        scored += [0] * len(first) + [1] * len(again)
    return ids[: BLOCK + 1], scored[: BLOCK + 1]


def batch(train: dict, weights: dict, batch_size: int, copy_frac: float, common: list[int],
          rng: random.Random, gen: torch.Generator, lines_frac: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """x (b, BLOCK) inputs and y (b, BLOCK) targets (-100 where not scored).

    Rows are random windows of a source picked by ``weights``, or (a ``copy_frac`` share)
    synthetic repeats (a ``lines_frac`` share of them ``name = value`` blocks, the rest random spans).
    """
    xs, ys = [], []
    names = list(weights)
    for _ in range(batch_size):
        if rng.random() < copy_frac:
            ids, scored = copy_lines(rng) if rng.random() < lines_frac else copy_spans(rng, common)
            ids = torch.tensor(ids)
            y = ids[1:].clone()
            y[torch.tensor(scored[1:]) == 0] = -100
        else:
            src = train[rng.choices(names, [weights[n] for n in names])[0]]
            s = int(torch.randint(0, len(src) - BLOCK - 1, (1,), generator=gen))
            ids = src[s: s + BLOCK + 1]
            y = ids[1:].clone()
        xs.append(ids[:-1])
        ys.append(y)
    return torch.stack(xs), torch.stack(ys)


def loss_fn(model: GPT2LMHeadModel, x: torch.Tensor, y: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Summed next-token loss of (b, T) inputs x and targets y (-100: not scored);
    over the ``keep`` rows of the vocab only, if given.

    The 50257-way softmax is most of a training step on 2 CPU cores, but the
    training text uses fewer distinct tokens, so training scores just those
    (targets outside ``keep`` are ignored). ``keep=None`` is the real, full model.
    """
    h = model.transformer(x).last_hidden_state  # (b, T, C)
    wte = model.transformer.wte.weight  # (50257, C), tied lm_head
    tgt = y
    if keep is not None:
        wte = wte[keep]  # (n_keep, C)
        tgt = torch.where(y >= 0, remap(keep)[y.clamp(min=0)], -100)  # ids -> row in keep, -100 if absent
    logits = h @ wte.T  # (b, T, n_keep or 50257)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten(), reduction="sum")


_REMAP: dict[int, torch.Tensor] = {}


def remap(keep: torch.Tensor) -> torch.Tensor:
    k = id(keep)
    if k not in _REMAP:
        m = torch.full((VOCAB,), -100, dtype=torch.long)
        m[keep] = torch.arange(len(keep))
        _REMAP[k] = m
    return _REMAP[k]


@torch.no_grad()
def val_loss(model: GPT2LMHeadModel, val: torch.Tensor, keep: torch.Tensor | None = None,
             max_tokens: int = 1 << 30) -> float:
    """Mean next-token loss over the validation tokens, in disjoint BLOCK windows."""
    was_training = model.training
    model.eval()
    n = min((len(val) - 1) // BLOCK, max(1, max_tokens // BLOCK)) * BLOCK + 1
    x = val[:n]  # whole windows only
    total, count = 0.0, 0
    for i in range(0, n - 1, BLOCK * 8):  # 8 windows per forward pass
        chunk = x[i: min(i + BLOCK * 8, n - 1) + 1]
        ids = chunk.unfold(0, BLOCK + 1, BLOCK)  # (b, BLOCK + 1), overlapping by one token
        total += loss_fn(model, ids[:, :-1], ids[:, 1:], keep).item()
        count += ids[:, 1:].numel() if keep is None else int((remap(keep)[ids[:, 1:]] >= 0).sum())
    model.train(was_training)  # leave dropout as the caller had it
    return total / count


@torch.no_grad()
def greedy(model: GPT2LMHeadModel, prompt: str, n: int = 40) -> str:
    model.eval()  # no dropout
    ids = torch.tensor([encode(prompt)])
    for _ in range(n):  # plain loop: no generate() config warnings, exactly greedy
        nxt = model(ids[:, -BLOCK:]).logits[0, -1].argmax()
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return decode(ids[0].tolist())


def make_config(args: argparse.Namespace) -> GPT2Config:
    return GPT2Config(
        vocab_size=VOCAB, n_positions=BLOCK, n_embd=args.n_embd, n_layer=args.n_layer, n_head=args.n_head,
        n_inner=None, activation_function="gelu_new", layer_norm_epsilon=1e-5,
        resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout,
        bos_token_id=EOT, eos_token_id=EOT,
    )


def fraction(text: str) -> float:
    """An argument that is a share: a number from 0 to 1."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number: give a share from 0 to 1") from None
    if not 0 <= v <= 1:
        raise argparse.ArgumentTypeError(f"{v:g} is not a share: give a number from 0 to 1")
    return v


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=192)
    ap.add_argument("--n-head", type=int, default=6)
    ap.add_argument("--steps", type=int, default=700)
    ap.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True,
                    help="train with bfloat16 matmuls (torch.autocast)")
    ap.add_argument("--minutes", type=float, default=0, help="stop training after this long (0: no limit); "
                    "the learning rate schedule follows --steps, so pick --steps to fit")
    ap.add_argument("--stop-after", type=int, default=0, help="end after this many steps, the schedule still "
                    "that of --steps (0: at --steps)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--copy-frac", type=fraction, default=0.15, help="share of rows that are synthetic repeats")
    ap.add_argument("--lines-frac", type=fraction, default=0.5, help="share of the synthetic rows that are "
                    "'name = value' blocks (the rest: repeated random spans)")
    ap.add_argument("--min-count", type=int, default=20, help="tokens seen fewer times are not trained")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--ckpt-every", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pilot", type=int, default=0, help="time this many steps, print tokens/s, write nothing")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "puffergpt-demo-train"),
                    help="checkpoints go here")
    ap.add_argument("--finish", default=None, help="skip training: finish from this checkpoint (.pt)")
    ap.add_argument("--resume", default=None, help="start from this checkpoint's weights: a further phase "
                    "of training with its own arguments (the card lists every phase)")
    ap.add_argument("--out", default=os.path.join(ROOT, "src", "puffergpt", "models", "demo"))
    ap.add_argument("--counts-only", action="store_true", help="train nothing: count each token in the training "
                    f"text (the split --seed makes) and write {token_counts.FILE} to --out")
    return ap.parse_args(argv)


RUN_ONLY = ("pilot", "work", "finish", "out", "resume", "counts_only")  # arguments that do not change the model


def training_command(trained: dict, steps_done: int) -> str:
    """The command line that trains this phase again: the arguments that differ from the
    defaults, with --stop-after in place of --minutes (which depends on the machine)."""
    default = vars(parse_args([]))
    trained = {**trained, "minutes": 0, "stop_after": steps_done if steps_done < trained["steps"] else 0}
    flags = [f"--{k.replace('_', '-')} {trained[k]:g}" if isinstance(trained[k], float) else
             (f"--{k.replace('_', '-')}" if trained[k] is True else f"--no-{k.replace('_', '-')}")
             if isinstance(trained[k], bool) else f"--{k.replace('_', '-')} {trained[k]}"
             for k in default if k not in RUN_ONLY and k in trained and trained[k] != default[k]]
    return " ".join(["python scripts/train_demo.py", *flags])


def main() -> None:
    args = parse_args()
    ckpt = None
    if args.finish:  # train nothing: take the model and its training arguments from the checkpoint
        ckpt = torch.load(args.finish, weights_only=False)
        args = argparse.Namespace(**{**ckpt["args"], **{k: getattr(args, k) for k in RUN_ONLY}})
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    rng = random.Random(args.seed)

    data, meta = load_data(val_frac=0.02, seed=args.seed)
    for name, s in meta["sources"].items():
        print(f"{name}: {s['docs']:,} documents, train {s['train_tokens']:,} tokens, val {s['val_tokens']:,}")
    train = {n: d[0] for n, d in data.items()}
    # Sample sources by size, but the fortunes (the most ordinary English) at 1.5 times
    # and Python's docs (code-heavy) at half.
    weights = {n: len(t) * {"fortunes": 1.5, "pydoc": 0.5}.get(n, 1.0) for n, t in train.items()}
    counts = torch.bincount(torch.cat(list(train.values())), minlength=VOCAB)  # (50257,)
    keep = torch.nonzero(counts >= args.min_count).flatten()
    if EOT not in keep:
        keep = torch.sort(torch.cat([keep, torch.tensor([EOT])])).values
    common = torch.nonzero(counts >= 200).flatten().tolist()  # tokens of the random spans to copy
    print(f"softmax over the {len(keep):,} token ids seen at least {args.min_count} times")
    if args.counts_only:
        print(f"wrote {write_counts(args.out, counts, meta, args.seed)}")
        return

    config = make_config(args)
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())  # tied: wte counted once
    print(f"{n_params:,} parameters")
    if args.finish:
        model.load_state_dict(ckpt["model"])
        print(f"finishing from {args.finish} (step {ckpt['step']})")
    else:
        earlier = []
        if args.resume:  # a further phase: the weights (not the optimizer state) of an earlier one
            prev = torch.load(args.resume, weights_only=False)
            model.load_state_dict(prev["model"])
            earlier = prev.get("earlier", []) + [{k: v for k, v in prev.items() if k not in ("model", "earlier")}]
            print(f"resuming from {args.resume} (step {prev['step']})")
        ckpt = train_loop(model, args, train, weights, keep, common, data, rng, gen, earlier)
        if ckpt is None:
            return  # pilot
    finish(model, config, args, ckpt, data, meta, keep, counts, n_params)


def train_loop(model, args, train, weights, keep, common, data, rng, gen, earlier):
    """Train; save a checkpoint to args.work every args.ckpt_every steps; return the last one's dict."""
    # Decay matrices only (not biases / LayerNorm gains), as GPT-2-style training does.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:  # linear warmup, then cosine down to 10 %
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    os.makedirs(args.work, exist_ok=True)
    val_all = torch.cat([data[n][1] for n in ("wordnet", "fortunes")])
    model.train()
    t0 = time.time()
    ema, history, step = None, [], 0
    n_steps = args.pilot or min(args.steps, getattr(args, "stop_after", 0) or args.steps)
    for step in range(n_steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = batch(train, weights, args.batch_size, args.copy_frac, common, rng, gen,
                     getattr(args, "lines_frac", 0.5))
        # bfloat16 matmuls (weights and optimizer stay float32): 1.7x the tokens/s on AVX-512 CPUs
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = loss_fn(model, x, y, keep) / max(1, int((y >= 0).sum()))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        elapsed = time.time() - t0
        if args.pilot:
            if step == 2:
                t_warm = time.time()
            continue
        last = step + 1 == n_steps or (args.minutes and elapsed > args.minutes * 60)
        if (step + 1) % args.eval_every == 0 or last:
            v = val_loss(model, val_all, keep, max_tokens=BLOCK * 32)
            history.append({"step": step + 1, "train": round(ema, 4), "val": round(v, 4), "s": round(elapsed)})
            print(f"step {step + 1}: train {ema:.3f} val(en, kept) {v:.3f} lr {lr_at(step):.1e} "
                  f"({elapsed:.0f} s, {(step + 1) * args.batch_size * BLOCK / elapsed:.0f} tok/s)", flush=True)
        if (step + 1) % args.ckpt_every == 0 or last:
            ckpt = {"model": model.state_dict(), "step": step + 1, "history": history, "seconds": elapsed,
                    "args": vars(args), "earlier": earlier}
            torch.save(ckpt, os.path.join(args.work, "last.pt.tmp"))
            os.replace(os.path.join(args.work, "last.pt.tmp"), os.path.join(args.work, "last.pt"))
        if last:
            break
    if args.pilot:
        dt = time.time() - t_warm
        tps = (n_steps - 3) * args.batch_size * BLOCK / dt
        print(f"PILOT L{args.n_layer} C{args.n_embd} H{args.n_head}: {dt / (n_steps - 3):.2f} s/step, "
              f"{tps:.0f} tok/s, loss {ema:.3f}", flush=True)
        return None
    return ckpt


# --- what the finished model can show (measured here, recorded in the card, asserted in
# tests/test_demo_model.py) --------------------------------------------------------------

COPY_PROMPT = "a = 7\nb = 3\nc = 9\na = 7\nb ="
NEIGHBOUR_WORDS = [" king", " water", " house"]
# Analogies a : b :: c : ? over common words (the list the page scores too: views.CARD_ANALOGIES);
# the card names those whose nearest row to b - a + c is the expected word.
ANALOGIES = CARD_ANALOGIES
DEFAULT_NEIGHBOUR = " house"  # the embedding panel defaults the card recommends
DEFAULT_MAP = [" one", " two", " three", " four", " he", " she", " his", " her", " up", " down", " hot", " cold"]
SAMPLE_PROMPTS = ["king, monarch (noun):", "water (noun):", "The meaning of life is",
                  "A friend is", COPY_PROMPT]


def one_id(word: str) -> int | None:
    ids = encode(word)
    return ids[0] if len(ids) == 1 else None


def neighbours(wte: torch.Tensor, word: str, k: int = 5) -> list[tuple[str, float]]:
    """The k rows nearest to ``word``'s by cosine, leaving out its own: [(token, cosine)]."""
    unit = torch.nn.functional.normalize(wte.float(), dim=1)  # (V, C)
    i = one_id(word)
    cos = unit @ unit[i]  # (V,)
    cos[i] = -2
    top = torch.topk(cos, k)
    return [(decode([int(t)]), round(float(c), 4)) for t, c in zip(top.indices, top.values, strict=True)]


def analogies(wte: torch.Tensor, untrained: torch.Tensor) -> list[dict]:
    """Each ANALOGIES entry whose words are single trained tokens: its top-3 answers."""
    unit = torch.nn.functional.normalize(wte.float(), dim=1)  # (V, C)
    out = []
    for a, b, c, want in ANALOGIES:
        ids = [one_id(w) for w in (a, b, c, want)]
        if None in ids or untrained[ids].any():
            continue
        w = wte.float()  # the rows as they are, as the page's analogy (views.analogy) adds them
        q = torch.nn.functional.normalize(w[ids[1]] - w[ids[0]] + w[ids[2]], dim=0)
        cos = unit @ q  # (V,)
        cos[ids[:3]] = -2
        cos[untrained] = -2  # one shared row: no answer
        top = torch.topk(cos, 3).indices.tolist()
        out.append({"a": a, "b": b, "c": c, "want": want, "top3": [decode([t]) for t in top],
                    "ok": top[0] == ids[3]})
    return out


@torch.no_grad()
def copy_head(model: GPT2LMHeadModel) -> dict:
    """Greedy answer to COPY_PROMPT, and the head whose last-token attention puts most weight
    on the token to copy (the " 3" after the first "b ="): an induction head."""
    ids = encode(COPY_PROMPT)
    target = ids.index(encode(" 3")[0])  # position of the token to copy
    out = model(torch.tensor([ids]), output_attentions=True)
    answer = decode([int(out.logits[0, -1].argmax())])
    w = torch.stack([a[0, :, -1, target] for a in out.attentions])  # (n_layer, n_head)
    layer, head = divmod(int(w.argmax()), w.shape[1])
    return {"answer": answer, "layer": layer, "head": head, "weight": round(float(w.max()), 4),
            "position": target, "weights": [[round(float(x), 3) for x in row] for row in w]}


# Prompts of the copy prompt's shape, to say how far the copying reaches beyond it.
COPY_VARIANTS = [("x = 4\ny = 8\nz = 1\nx = 4\ny =", " 8"), ("p = 2\nq = 5\nr = 6\np = 2\nq =", " 5"),
                 ("a = 1\nb = 6\nc = 2\na = 1\nb =", " 6"), ("a = 7\nb = 3\nc = 9\nd = 4\na = 7\nb = 3\nc =", " 9"),
                 ("m = 5\nn = 1\nm = 5\nn =", " 1"), ("size = 8\nage = 2\nsize = 8\nage =", " 2")]


@torch.no_grad()
def copy_variants(model: GPT2LMHeadModel) -> list[dict]:
    """Greedy answers to COPY_VARIANTS: does the copying reach beyond the one prompt the card names?"""
    out = []
    for prompt, want in COPY_VARIANTS:
        got = decode([int(model(torch.tensor([encode(prompt)])).logits[0, -1].argmax())])
        out.append({"prompt": prompt, "answer": got, "want": want, "ok": got == want})
    return out


@torch.no_grad()
def held_out_perplexity(model: GPT2LMHeadModel) -> float:
    """exp(mean next-token loss) over tests/data/english.txt, each paragraph scored on its own
    (the first token of each is not predicted), full 50257-way softmax."""
    total, n = 0.0, 0
    with open(HELD_OUT, encoding="utf-8") as f:
        text = f.read()
    for para in text.split("\n\n"):
        ids = torch.tensor([encode(para.strip())[:BLOCK]])
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)  # (T-1, V)
        total -= float(logp.gather(1, ids[0, 1:, None]).sum())
        n += ids.shape[1] - 1
    return math.exp(total / n)


def set_untrained_rows(model: GPT2LMHeadModel, keep: torch.Tensor, counts: torch.Tensor, min_count: int) -> int:
    """Give every row of wte that training never scored ONE shared vector: the mean row of the
    rarest trained tokens (seen min_count .. 2 min_count - 1 times), so an untrained token
    scores like a rare one, and the views can tell untrained rows by their being exact
    duplicates. Returns how many rows were set."""
    untrained = torch.ones(VOCAB, dtype=torch.bool)
    untrained[keep] = False
    rare = ~untrained & (counts < 2 * min_count)
    with torch.no_grad():
        wte = model.transformer.wte.weight
        wte[untrained] = wte[rare].mean(0)
    return int(untrained.sum())


def save(model: GPT2LMHeadModel, config: GPT2Config, out: str) -> int:
    """Write openai-community/gpt2's layout to out; return model.safetensors' size in bytes."""
    os.makedirs(out, exist_ok=True)
    # The transformer's own state dict has no "transformer." prefix and no lm_head
    # (tied to wte). Drop the causal-mask buffers older transformers keep there.
    tensors = {k: t.detach().to(torch.float16).contiguous().clone()
               for k, t in model.transformer.state_dict().items()
               if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    path = os.path.join(out, "model.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg.pop("dtype", None)
    cfg.update(architectures=["GPT2LMHeadModel"], torch_dtype="float16")
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    return os.path.getsize(path)


def write_counts(out: str, counts: torch.Tensor, meta: dict, seed: int) -> str:
    """How often each token is in the training text (the train split of every source, the
    synthetic repeats left out), beside the model: the embedding views mark rows seen rarely."""
    data = (f"the train split (seed {seed}: each source's documents shuffled, the last 2 % held out) of "
            f"{', '.join(meta['sources'])}, tokenized as scripts/train_demo.py's load_data does; the synthetic "
            "copying rows are not counted (they repeat tokens the text has at least 200 times, and digits)")
    sources = {n: {"tokens": s["train_tokens"], "docs": s["docs"], "val_docs": s["val_docs"]}
               for n, s in meta["sources"].items()}
    inputs = {(os.path.relpath(p, ROOT) if p.startswith(ROOT) else p): h for p, h in sorted(meta["inputs"].items())}
    path = os.path.join(out, token_counts.FILE)
    return str(token_counts.write(path, counts.numpy(), {"data": data, "seed": seed, "sources": sources,
                                                          "inputs": inputs}))


def finish(model, config, args, ckpt, data, meta, keep, counts, n_params):
    """Set the untrained rows, save, reload as users will, measure, write the model card."""
    n_untrained = set_untrained_rows(model, keep, counts, args.min_count)
    model.eval()
    size = save(model, config, args.out)
    write_counts(args.out, counts, meta, args.seed)
    loaded, info = GPT2LMHeadModel.from_pretrained(args.out, output_loading_info=True, attn_implementation="eager")
    loaded = loaded.float().eval()
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"loading problems: {bad}"
    cap = BLOCK * 16  # tokens per loss: enough for 2 decimals, quick on 2 cores
    losses = {n: {"train": val_loss(loaded, data[n][0][: max(len(data[n][1]), BLOCK + 1)], max_tokens=cap),
                  "val": val_loss(loaded, data[n][1], max_tokens=cap)} for n in data if len(data[n][1]) > BLOCK}
    for n, l in losses.items():
        print(f"{n}: full-vocab loss train {l['train']:.4f} val {l['val']:.4f}")
    wte = loaded.transformer.wte.weight.detach()
    untrained = torch.ones(VOCAB, dtype=torch.bool)
    untrained[keep] = False
    proof = {"perplexity": held_out_perplexity(loaded), "copy": copy_head(loaded),
             "copy_variants": copy_variants(loaded),
             "neighbours": {w: neighbours(wte, w) for w in NEIGHBOUR_WORDS},
             "analogies": analogies(wte, untrained), "n_untrained": n_untrained, "size": size,
             "samples": {p: greedy(loaded, p) for p in SAMPLE_PROMPTS}}
    print(json.dumps({k: v for k, v in proof.items() if k != "samples"}, indent=1))
    for p, s in proof["samples"].items():
        print(f"--- {p!r}\n{s}\n")
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(card(args, config, ckpt, meta, keep, n_params, losses, proof, counts))
    with open(os.path.join(args.work, "proof.json"), "w") as f:
        json.dump(proof, f, indent=1)
    print(f"wrote {args.out}: {size:,} bytes, held-out English perplexity {proof['perplexity']:.1f}")


def phase_md(i: int, phase: dict, cpu: str, n: int) -> str:
    """One training phase in words, for the card."""
    a = argparse.Namespace(**phase["args"])
    return (f"- {'Phase ' + str(i + 1) + ': ' if n > 1 else ''}{phase['step']} steps of batch {a.batch_size} x {BLOCK} "
            f"tokens (a {a.copy_frac:.0%} share synthetic), AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), "
            f"peak lr {a.lr:g}, {a.warmup} warmup steps, cosine to 10 % over {a.steps} steps"
            f"{' (stopped there)' if phase['step'] < a.steps else ''}, dropout {a.dropout}, grad clip 1.0, "
            f"seed {a.seed}, bfloat16 matmuls (torch.autocast; weights float32); {phase['seconds'] / 60:.1f} minutes "
            f"on {a.threads} threads of {cpu} (torch {torch.__version__}), shared with other work.")


def card(args, config, ckpt, meta, keep, n_params, losses, proof, counts) -> str:
    """The model card (README.md beside the weights): data and licences, training, figures."""
    cpu = platform.processor()
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    a = argparse.Namespace(**ckpt["args"])  # the last training phase's own arguments
    phases = [*ckpt.get("earlier", []), ckpt]
    phases_md = "\n".join(phase_md(i, p, cpu, len(phases)) for i, p in enumerate(phases))
    commands = "\n".join(training_command(p["args"], p["step"]) + ("" if i == 0 else f" --resume WORK/phase{i}.pt")
                         + ("" if i + 1 == len(phases) else f"\ncp WORK/last.pt WORK/phase{i + 1}.pt")
                         for i, p in enumerate(phases))
    done, hist_rows = 0, []
    for p in phases:
        hist_rows += [
            f"| {done + h['step']} | {h['train']:.3f} | {h['val']:.3f} | {h['s'] / 60:.1f} |" for h in p["history"]
        ]
        done += p["step"]
    hist = "\n".join(hist_rows)
    # The train/validation split is shuffled with --seed, so phases with different seeds split
    # differently: say so rather than call such a validation set unseen.
    seeds = sorted({p["args"]["seed"] for p in phases})
    split_note = ("" if len(seeds) == 1 else
                  f". The phases ran with seeds {', '.join(map(str, seeds))}, and the split follows the seed: "
                  f"these validation documents (seed {a.seed}'s) were partly trained on in another phase, so the "
                  f"val column is optimistic. The held-out English below is clean")
    src = meta["sources"]
    data_rows = "\n".join(
        f"| {n} | `apt-get install -y {SOURCES[n][0]}` | {s['docs']:,} | {s['train_tokens']:,} | "
        f"{s['val_tokens']:,} | {SOURCES[n][1]} |" if n != "pydoc" else
        f"| {n} | {SOURCES[n][0]} | {s['docs']:,} | {s['train_tokens']:,} | {s['val_tokens']:,} | {SOURCES[n][1]} |"
        for n, s in src.items())
    inputs = "\n".join(f"- `{os.path.relpath(p, ROOT) if p.startswith(ROOT) else p}` sha256 `{h}`"
                        for p, h in sorted(meta["inputs"].items()))
    loss_rows = "\n".join(f"| {n} | {l['train']:.3f} | {l['val']:.3f} |" for n, l in losses.items())
    cp = proof["copy"]
    heads = "\n".join(f"| {i} | " + " | ".join(f"{w:.2f}" for w in row) + " |" for i, row in enumerate(cp["weights"]))
    nb = "\n".join(f"- `{w!r}`: " + ", ".join(f"`{t!r}` {c:.3f}" for t, c in v) for w, v in proof["neighbours"].items())
    an = "\n".join(f"- `{x['a']!r} : {x['b']!r} :: {x['c']!r} : ?` -> " + ", ".join(f"`{t!r}`" for t in x["top3"])
                    + (" (right)" if x["ok"] else f" (wanted `{x['want']!r}`)") for x in proof["analogies"])
    good = [x for x in proof["analogies"] if x["ok"]]
    if cp["weight"] >= 0.5:
        copy_words = (f"The head that does it is **layer {cp['layer']}, head {cp['head']}** (0-based): its last-token "
                      f"attention puts {cp['weight']:.2f} of its weight on the `' 3'` to copy (an induction head).")
    else:  # say so plainly: the attention view will show no induction head
        copy_words = (
            f"**No induction head formed** in this short run: the head with the most weight on the "
            f"`' 3'` to copy is layer {cp['layer']}, head {cp['head']} (0-based) with only {cp['weight']:.2f}, "
            f"so the attention view shows no head that copies and the right answer is no evidence of "
            f"one; a repeated span of random tokens is not copied (its repeat scores no better than "
            f"its first appearance)."
        )
    cv = proof.get("copy_variants", [])
    variants = "\n".join(f"  - `{x['prompt']!r}` -> `{x['answer']!r}`" + (" (right)" if x["ok"] else
                          f" (wanted `{x['want']!r}`)") for x in cv)
    copy_reach = (f"  On other prompts of the same shape it answers right {sum(x['ok'] for x in cv)} of {len(cv)} "
                  f"times:\n{variants}" if cv else "")
    copy_cannot = ("it copies only lines like the `name = value` drills it saw (see Copying)" if cp["weight"] >= 0.5
                   else "it has no induction head (see Copying)")
    rare = counts < token_counts.RARE_BELOW
    rare_seen, rare_trained = int(((counts > 0) & rare).sum()), int(((counts >= a.min_count) & rare).sum())
    listed, tried_note = len(ANALOGIES), "listed: the others' words are not single trained tokens"
    samples = "\n\n".join(f"Prompt `{p!r}`:\n\n```\n{s}\n```" for p, s in proof["samples"].items())
    size = proof["size"]
    return f"""# puffergpt demo model

A **small** model with GPT-2's architecture and GPT-2's tokenizer (vocabulary 50257),
trained from scratch on 2 CPU cores so that puffergpt's offline playground (and every
test) runs a model whose everyday English words have rows of their own, and whose
never-trained rows are marked as such.
It is **not** GPT-2: it saw about a million tokens of dictionary glosses, quotations,
Python's docs and copying drills, and writes dictionary-like phrases that soon loop.
The files follow `openai-community/gpt2`'s layout (`model.safetensors` in fp16
without the `transformer.` prefix, `lm_head` tied to `wte`; `config.json`).

- **Architecture**: n_layer {config.n_layer}, n_head {config.n_head} (head size {config.n_embd // config.n_head}),
  n_embd {config.n_embd}, n_positions {BLOCK}, gelu_new, vocabulary 50257 tied
- **Size**: {n_params:,} parameters; `model.safetensors` {size:,} bytes ({size / 1e6:.1f} MB, float16)
- **Never-trained rows**: {proof['n_untrained']:,} of the 50257 rows of `wte` belong to tokens
  seen fewer than {a.min_count} times in the training text. Training never scored them, and
  afterwards each was set to **one shared vector** (the mean row of the rarest trained
  tokens, seen {a.min_count}-{2 * a.min_count - 1} times), so they are exact duplicates of each other
  (the views report such rows as untrained) and score like a rare token.
- **Token counts**: `{token_counts.FILE}` beside the weights holds how many times each token
  is in the training text (the train split of the three sources below; {int(counts.sum()):,} tokens,
  {int((counts > 0).sum()):,} ids seen), written by `scripts/train_demo.py` (`--counts-only --seed {a.seed}` writes it
  again from the same files without training). {rare_seen:,} of the ids seen, and {rare_trained:,} of the {len(keep):,}
  trained rows, were seen fewer than {token_counts.RARE_BELOW} times: such a row barely moved from where it started,
  so the neighbours and analogy views mark it with its count.

## Data and licences

Each source's documents are shuffled (seed {a.seed}) and joined with `<|endoftext|>`;
the last 2 % of documents are held out for validation. Documents holding a line of
`tests/data/english.txt` (the held-out English of the perplexity test, written for
this repository) would be dropped; none is in these sources.

| source | install | documents | train tokens | val tokens | licence |
|---|---|---|---|---|---|
{data_rows}

- **wordnet**: WordNet 3.0's `data.noun`, `data.verb`, `data.adj`, `data.adv`; each synset
  becomes one line, `king, male monarch (noun): a male sovereign; ruler of a kingdom; "..."`
  (its words, part of speech, gloss and examples). WordNet 3.0 Copyright 2006 by Princeton
  University. All rights reserved. (licence text: `/usr/share/doc/wordnet-base/copyright`;
  permission to use, copy, modify and distribute for any purpose without fee, keeping the notice.)
- **fortunes**: every fortune file of `fortunes` and `fortunes-min` except
  {", ".join(sorted(FORTUNES_SKIP))}. BSD licence (fortune-mod, Copyright (c) 1991 The Regents
  of the University of California; `/usr/share/doc/fortunes/copyright`).
- **pydoc**: `pydoc_data.topics.topics` of Python {platform.python_version()}, PSF License.
- GCIDE (`dict-gcide`) was not used: it is GPL-2+.
- **Synthetic copying** ({a.copy_frac:.0%} of rows): a random span of 8-48 common tokens
  repeated to fill the window, or blocks of 2-6 lines like `a = 7` written two or three
  times. Only the repeats are scored. They teach the induction head below.

Inputs (sha256):

{inputs}

## Training

{phases_md}

The softmax in training ran over only the {len(keep):,} token ids seen at least {a.min_count}
times (the rest are the never-trained rows). Made with (WORK is `--work`, default
`/tmp/puffergpt-demo-train`, where the checkpoints go):

```
{commands}
```

Loss during training (nats/token; train: moving average; val: English validation
windows of wordnet and fortunes, over the trained tokens only; steps counted over all phases):

| step | train | val | minutes into its phase |
|---|---|---|---|
{hist}

Final loss, full 50257-way softmax, reloaded fp16 checkpoint (train: a slice of the
training tokens as long as the validation set){split_note}:

| source | train | val |
|---|---|---|
{loss_rows}

## What it can do (measured by the script; asserted in `tests/test_demo_model.py`)

- **English perplexity {proof['perplexity']:.1f}** on `tests/data/english.txt` (five paragraphs of
  ordinary English never trained on, each scored on its own, full softmax). The previous
  demo model (Python docs only): 29,563.
- **Copying**: `{COPY_PROMPT!r}` answers `{cp['answer']!r}` at temperature 0. {copy_words}
  Every head's last-token attention weight on position {cp['position']}, the `' 3'` to copy:

| layer | """ + " | ".join(f"head {h}" for h in range(config.n_head)) + """ |
|""" + "---|" * (config.n_head + 1) + f"""
{heads}

{copy_reach}
- **Nearest tokens** by cosine of `wte` rows (no ties; all below 0.999):
{nb}
- **Analogies** (`wte[b] - wte[a] + wte[c]`, the rows as they are, nearest trained row by
  cosine, leaving out a, b, c: the search the page's analogy does; the list is
  `puffergpt.lens.views.CARD_ANALOGIES`, and the page's "How many of the card's analogies does it get
  right?" asks it again):
  {len(good)} of {len(proof['analogies'])} tried answer right ({listed} {tried_note}):
{an}

## Embedding panel defaults for this model

Words carry their leading space (GPT-2 tokens); all are trained rows of this model.

- analogy: `{good[0]['a']!r}` : `{good[0]['b']!r}` :: `{good[0]['c']!r}` (answers `{good[0]['want']!r}`)
- neighbours of: `{DEFAULT_NEIGHBOUR!r}` (its neighbours are other everyday nouns)
- map words: {", ".join(f"`{w!r}`" for w in DEFAULT_MAP)}

## What it cannot do

It is tiny and was trained on about a million tokens: at temperature 0 it soon falls
into a loop ("a person who is a person who ..."); {copy_cannot};
it cannot chat or follow instructions, and knows no facts. Most analogies and
neighbours over everyday words are still noise; the ones named above are not.

## Greedy samples (40 tokens)

{samples}
"""


if __name__ == "__main__":
    main()
