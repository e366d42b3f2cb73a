"""Train the tiny GPT-2-architecture "demo" model that ships with puffergpt.

The offline playground needs *some* GPT-2-shaped checkpoint that writes readable
English without a download. This trains one in ~20 minutes on 2 CPU cores, on
the only English corpus every Python ships: ``pydoc_data.topics``.

    python scripts/train_demo.py            # writes src/puffergpt/models/demo/

Output is in the layout of ``openai-community/gpt2`` on the hub
(``model.safetensors`` without the ``transformer.`` prefix, fp16, tied
``lm_head``; ``config.json``; ``README.md``), so the same loaders read both.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import sys
import time

import pydoc_data.topics
import torch
from safetensors.torch import save_file
from tqdm import tqdm
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
from puffergpt.tokenizer import EOT, decode, encode  # noqa: E402

BLOCK = 256  # context length = n_positions
PROMPTS = ["The list", "A function", "The class"]


def load_data(val_frac: float) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Token ids of train and validation text, split by whole documents.

    Documents are joined in sorted key order with <|endoftext|> between them; the
    last documents (about ``val_frac`` of all tokens) are held out, so validation
    text is never seen, not even in part.
    """
    docs = [encode(pydoc_data.topics.topics[k]) + [EOT] for k in sorted(pydoc_data.topics.topics)]
    total = sum(map(len, docs))
    n_val_docs, n_val = 0, 0
    while n_val < val_frac * total:
        n_val_docs += 1
        n_val += len(docs[-n_val_docs])
    flat = lambda ds: torch.tensor([t for d in ds for t in d], dtype=torch.long)  # noqa: E731
    return flat(docs[:-n_val_docs]), flat(docs[-n_val_docs:]), n_val_docs


def batch(data: torch.Tensor, batch_size: int, gen: torch.Generator) -> torch.Tensor:
    """(batch_size, BLOCK + 1) random windows: BLOCK inputs, each with its next token."""
    starts = torch.randint(0, len(data) - BLOCK - 1, (batch_size,), generator=gen)
    return torch.stack([data[s : s + BLOCK + 1] for s in starts])


def loss_fn(model: GPT2LMHeadModel, ids: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Summed next-token loss of (b, T) ids; over the ``keep`` rows of the vocab only, if given.

    The 50257-way softmax is ~80 % of a training step on 2 CPU cores, but the
    training text uses only ~5k distinct tokens, so training scores just those
    (targets outside ``keep`` are ignored). ``keep=None`` is the real, full model.
    """
    h = model.transformer(ids[:, :-1]).last_hidden_state  # (b, T-1, 128)
    wte = model.transformer.wte.weight  # (50257, 128), tied lm_head
    tgt = ids[:, 1:]  # (b, T-1)
    if keep is not None:
        wte, tgt = wte[keep], remap(keep)[tgt]  # (n_keep, 128); ids -> row in keep, -100 if absent
    logits = h @ wte.T  # (b, T-1, n_keep or 50257)
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten(), reduction="sum")


def remap(keep: torch.Tensor) -> torch.Tensor:
    m = torch.full((50257,), -100, dtype=torch.long)
    m[keep] = torch.arange(len(keep))
    return m


@torch.no_grad()
def val_loss(model: GPT2LMHeadModel, val: torch.Tensor, keep: torch.Tensor | None = None) -> float:
    """Mean next-token loss over the validation tokens, in disjoint BLOCK windows."""
    was_training = model.training
    model.eval()
    n = (len(val) - 1) // BLOCK * BLOCK + 1
    x = val[:n]  # whole windows only
    losses, counts = [], []
    for i in range(0, n - 1, BLOCK * 8):  # 8 windows per forward pass
        chunk = x[i : min(i + BLOCK * 8, n - 1) + 1]
        # (b, BLOCK + 1) windows overlapping by one token, so every token is a target once
        ids = chunk.unfold(0, BLOCK + 1, BLOCK)
        losses.append(loss_fn(model, ids, keep))
        counts.append(ids[:, 1:].numel() if keep is None else int((remap(keep)[ids[:, 1:]] >= 0).sum()))
    model.train(was_training)  # leave dropout as the caller had it
    return (sum(losses) / sum(counts)).item()


@torch.no_grad()
def greedy(model: GPT2LMHeadModel, prompt: str, n: int = 40) -> str:
    model.eval()  # no dropout
    ids = torch.tensor([encode(prompt)])
    for _ in range(n):  # plain loop: no generate() config warnings, exactly greedy
        nxt = model(ids[:, -BLOCK:]).logits[0, -1].argmax()
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return decode(ids[0].tolist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="src/puffergpt/models/demo")
    args = ap.parse_args()

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)

    train, val, n_val_docs = load_data(val_frac=0.05)
    n_docs = len(pydoc_data.topics.topics)
    print(f"train {len(train):,} tokens, val {len(val):,} tokens ({n_val_docs} of {n_docs} documents)")

    config = GPT2Config(
        vocab_size=50257, n_positions=BLOCK, n_embd=128, n_layer=4, n_head=4, n_inner=None,
        activation_function="gelu_new", layer_norm_epsilon=1e-5,
        resid_pdrop=args.dropout, embd_pdrop=args.dropout, attn_pdrop=args.dropout,
        bos_token_id=EOT, eos_token_id=EOT,
    )
    model = GPT2LMHeadModel(config)
    n_params = sum(p.numel() for p in model.parameters())  # tied: wte counted once
    print(f"{n_params:,} parameters")
    keep = torch.unique(torch.cat([train, torch.tensor([EOT])]))  # (n_keep,) token ids the training text uses
    print(f"softmax over the {len(keep):,} token ids in the training text")

    # Decay matrices only (not biases / LayerNorm gains), as GPT-2-style training does.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))

    def lr_at(step: int) -> float:  # linear warmup, then cosine down to 10 %
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = (step - args.warmup) / max(1, args.steps - args.warmup)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    model.train()
    t0 = time.time()
    v = float("nan")
    ema = None
    bar = tqdm(range(args.steps), desc="train", dynamic_ncols=True)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x = batch(train, args.batch_size, gen)  # (B, BLOCK + 1)
        loss = loss_fn(model, x, keep) / (x.shape[0] * (x.shape[1] - 1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            v = val_loss(model, val, keep)  # over kept tokens: the other rows are untrained yet
            tqdm.write(f"step {step + 1}: train {ema:.3f} val {v:.3f} ({time.time() - t0:.0f} s)")
        bar.set_postfix(loss=f"{ema:.3f}", val=f"{v:.3f}", lr=f"{lr_at(step):.1e}")
    wall = time.time() - t0

    # Rows of wte for tokens the training text never uses got no training. Make each
    # one the mean of the rarest trained tokens' rows (those seen once), so an unseen
    # token scores like a rare token: never chosen greedily, but not -inf either.
    counts = torch.bincount(train, minlength=50257)  # (50257,)
    with torch.no_grad():
        wte = model.transformer.wte.weight
        unseen = counts == 0
        unseen[EOT] = False
        wte[unseen] = wte[counts == 1].mean(0)
    model.eval()
    train_loss = val_loss(model, train[: len(val)])  # full vocab, same windows as val, fixed slice
    final_val = val_loss(model, val)
    final_val_kept = val_loss(model, val, keep)
    print(f"full-vocab loss: train {train_loss:.4f} val {final_val:.4f} (val over kept tokens {final_val_kept:.4f})")

    # --- save in openai-community/gpt2's layout ---------------------------------
    os.makedirs(args.out, exist_ok=True)
    # The transformer's own state dict has no "transformer." prefix and no lm_head
    # (tied to wte). Drop the causal-mask buffers older transformers keep there.
    tensors = {k: t.detach().to(torch.float16).contiguous().clone()
               for k, t in model.transformer.state_dict().items()
               if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    path = os.path.join(args.out, "model.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    cfg = config.to_dict()
    cfg.pop("dtype", None)
    cfg.update(architectures=["GPT2LMHeadModel"], torch_dtype="float16")
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    size = os.path.getsize(path)

    # --- verify: reload from disk as users will -----------------------------------
    loaded, info = GPT2LMHeadModel.from_pretrained(args.out, output_loading_info=True)
    loaded = loaded.float().eval()
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"loading problems: {bad}"
    reloaded_val = val_loss(loaded, val)
    print(f"val loss: trained {final_val:.4f}, reloaded fp16 {reloaded_val:.4f}")
    assert abs(reloaded_val - final_val) < 0.02, "reloaded model does not match"
    samples = {p: greedy(loaded, p) for p in PROMPTS}
    for p, s in samples.items():
        print(f"--- {p!r}\n{s}\n")

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")),
               platform.processor()) if os.path.exists("/proc/cpuinfo") else platform.processor()
    command = "python scripts/train_demo.py" + "".join(" " + shlex.quote(a) for a in sys.argv[1:])
    sample_md = "\n\n".join(f"Prompt `{p}`:\n\n```\n{s}\n```" for p, s in samples.items())
    card = f"""# puffergpt demo model

A **toy** model with GPT-2's architecture and GPT-2's tokenizer (vocabulary 50257),
trained from scratch so puffergpt's offline playground has something to run.
It is **not** GPT-2 and knows nothing beyond the Python docs it was trained on.
The files follow `openai-community/gpt2`'s layout (`model.safetensors` in fp16
without the `transformer.` prefix, `lm_head` tied to `wte`; `config.json`).

- **Architecture**: n_layer 4, n_head 4, n_embd 128, n_positions {BLOCK}, gelu_new
- **Size**: {n_params:,} parameters; `model.safetensors` {size:,} bytes ({size / 1e6:.1f} MB, float16)
- **Data**: `pydoc_data.topics.topics` of Python {platform.python_version()} ({n_docs} documents,
  joined in sorted key order with `<|endoftext|>` between them, GPT-2 BPE).
  The last {n_val_docs} documents ({len(val):,} tokens, ~5 %) are held out for validation;
  {len(train):,} tokens for training.
- **Training**: {args.steps} steps, batch {args.batch_size} x {BLOCK} tokens, AdamW
  (betas 0.9/0.95, weight decay 0.1 on matrices), peak lr {args.lr:g}, {args.warmup} warmup steps,
  cosine to 10 %, dropout {args.dropout}, grad clip 1.0, seed {args.seed}, float32;
  {wall / 60:.1f} minutes on {torch.get_num_threads()} threads of {cpu} (torch {torch.__version__}).
  To save time the softmax in training ran over only the {len(keep):,} token ids the
  training text uses; afterwards each never-seen token's row of `wte` was set to the
  mean row of the tokens seen exactly once, so those tokens score like rare ones.
- **Final loss** (nats/token, full 50257-way softmax): train {train_loss:.3f} (first
  {len(val):,} training tokens), validation {final_val:.3f} (reloaded fp16 checkpoint:
  {reloaded_val:.3f}; validation over the trained tokens only: {final_val_kept:.3f}).

Made with:

```
{command}
```

## Greedy samples (40 tokens)

{sample_md}
"""
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(card)
    print(f"wrote {args.out}: {size:,} bytes, train {train_loss:.3f}, val {final_val:.3f}, {wall:.0f} s")


if __name__ == "__main__":
    main()
