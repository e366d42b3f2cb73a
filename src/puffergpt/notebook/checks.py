"""Checking what comes from outside: a title, a body, tags, an id, and the evidence
(``check_evidence``), each refused with an InvalidInsight that names the problem."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Sequence

from puffergpt.lens.inside import MAX_VIEW_K
from puffergpt.model import tokenizer
from puffergpt.model.sampling import Sampling, bias_from_json, controls_json
from puffergpt.notebook.insight import (
    CONTROL_KEYS,
    EVIDENCE_KEYS,
    ID_RE,
    KINDS,
    MAX_BODY_CHARS,
    MAX_CANDIDATES,
    MAX_EVIDENCE_BYTES,
    MAX_MODEL_CHARS,
    MAX_TAG_CHARS,
    MAX_TAGS,
    MAX_TITLE_CHARS,
    OPTIONAL_KEYS,
    SLUG_CHARS,
    TAG_RE,
    InsightNotFound,
    InvalidInsight,
)
from puffergpt.texts.text import MAX_PROMPT_IDS

MAX_PARTS = 4096  # an attribution's parts: 1 + n_layer x (n_head + 2) + 1, GPT-2 small's 170


def _control_chars(s: str, allowed: str = "", categories: tuple[str, ...] = ("Cc",)) -> list[str]:
    return sorted({repr(c) for c in s if unicodedata.category(c) in categories and c not in allowed})


def check_title(title) -> str:
    if not isinstance(title, str):
        raise InvalidInsight(f"the title must be text, got {type(title).__name__}")
    title = title.strip()
    if not title:
        raise InvalidInsight("the title is empty: give the insight a short title")
    if len(title) > MAX_TITLE_CHARS:
        raise InvalidInsight(f"the title has {len(title)} characters, at most {MAX_TITLE_CHARS}: shorten it")
    if bad := _control_chars(title, categories=("Cc", "Zl", "Zp")):  # line and paragraph separators too
        raise InvalidInsight(f"the title has control characters ({', '.join(bad)}): a title is one line of text")
    return title


def check_body(body) -> str:
    if not isinstance(body, str):
        raise InvalidInsight(f"the body must be text, got {type(body).__name__}")
    body = body.replace("\r\n", "\n").replace("\r", "\n").strip("\n")
    if len(body) > MAX_BODY_CHARS:
        raise InvalidInsight(f"the body has {len(body)} characters, at most {MAX_BODY_CHARS}: shorten it")
    if bad := _control_chars(body, "\n\t"):
        raise InvalidInsight(f"the body has control characters ({', '.join(bad)}): only text, new lines and tabs")
    return body


def check_tags(tags) -> list[str]:
    if tags is None:
        return []
    if isinstance(tags, str) or not isinstance(tags, (list, tuple)):
        raise InvalidInsight(f"tags must be a list of words, got {type(tags).__name__}")
    if len(tags) > MAX_TAGS:
        raise InvalidInsight(f"{len(tags)} tags, at most {MAX_TAGS}")
    out: list[str] = []
    for t in tags:
        if not isinstance(t, str) or not TAG_RE.fullmatch(t.strip()) or len(t.strip()) > MAX_TAG_CHARS:
            raise InvalidInsight(f"tag {t!r}: a tag is one word of letters, digits, '.', '+', '-' or '_', "
                                 f"at most {MAX_TAG_CHARS} characters")
        if t.strip() not in out:
            out.append(t.strip())
    return out


def _int(v, what: str, lo: int, hi: int | None = None) -> int:
    # bool is an int in Python, never in the evidence
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v >= hi):
        rng = f"{lo}..{hi - 1}" if hi is not None else f">= {lo}"
        raise InvalidInsight(f"evidence {what} must be an integer in {rng}, got {v!r}")
    return v


def _number(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidInsight(f"evidence {what} must be a finite number, got {v!r}")
    return float(v)


def _keys(d, what: str, required: Sequence[str], optional: Sequence[str] = ()) -> dict:
    if not isinstance(d, dict):
        raise InvalidInsight(f"evidence {what} must be an object, got {type(d).__name__}")
    if missing := [k for k in required if k not in d]:
        raise InvalidInsight(f"evidence {what} lacks {', '.join(missing)} (it needs {', '.join(required)})")
    if extra := [k for k in d if k not in required and k not in optional]:
        raise InvalidInsight(f"evidence {what} has unknown keys {', '.join(map(str, extra))} "
                             f"(allowed: {', '.join([*required, *optional])})")
    return d


def check_evidence(ev, n_vocab: int = tokenizer.VOCAB_SIZE) -> dict:
    """The evidence, checked for replay and normalised (numbers as floats); raises
    InvalidInsight naming the first problem."""
    _keys(ev, "", EVIDENCE_KEYS, OPTIONAL_KEYS)
    if ev["kind"] not in KINDS:
        raise InvalidInsight(f"evidence kind must be one of {', '.join(KINDS)}, got {ev['kind']!r}")
    model = ev["model"]
    if not isinstance(model, str) or not model.strip() or len(model) > MAX_MODEL_CHARS or _control_chars(model):
        raise InvalidInsight(
            f"evidence model must be a model's name (one line, at most {MAX_MODEL_CHARS} characters), got {model!r}"
        )
    ids = ev["prompt_ids"]
    if not isinstance(ids, list) or not 1 <= len(ids) <= MAX_PROMPT_IDS:
        raise InvalidInsight(f"evidence prompt_ids must be a list of 1 to {MAX_PROMPT_IDS} token ids")
    ids = [_int(t, f"prompt_ids[{i}]", 0, n_vocab) for i, t in enumerate(ids)]
    p = _int(ev["position"], "position", 1, len(ids) + 1)
    token = _int(ev["token_id"], "token_id", 0, n_vocab)
    if p < len(ids) and ids[p] != token:
        raise InvalidInsight(f"evidence token_id {token} is not the token at position {p} of prompt_ids ({ids[p]})")
    sampling = _sampling(ev["sampling"], n_vocab)
    cands = ev["candidates"]
    if not isinstance(cands, list) or not 1 <= len(cands) <= MAX_CANDIDATES:
        raise InvalidInsight(f"evidence candidates must be a list of 1 to {MAX_CANDIDATES} {{token_id, logit}}")
    cands = [_keys(c, f"candidates[{i}]", ("token_id", "logit")) for i, c in enumerate(cands)]
    cands = [{"token_id": _int(c["token_id"], f"candidates[{i}].token_id", 0, n_vocab),
              "logit": _number(c["logit"], f"candidates[{i}].logit")} for i, c in enumerate(cands)]
    if len({c["token_id"] for c in cands}) != len(cands):
        raise InvalidInsight("evidence candidates repeat a token_id: each candidate is a different token")
    out = {"kind": ev["kind"], "model": model.strip(), "prompt_ids": ids, "position": p, "token_id": token,
           "sampling": sampling, "candidates": cands}
    if "generated" in ev or _counts_generated(sampling):
        out["generated"] = _generated(ev.get("generated"), p)
    if "requests" in ev:
        out["requests"] = _requests(ev["requests"])
    if "data" in ev:
        out["data"] = _data(ev["kind"], ev["data"])
    size = len(json.dumps(out, separators=(",", ":")))
    if size > MAX_EVIDENCE_BYTES:
        raise InvalidInsight(f"the evidence is {size:,} bytes as JSON, at most {MAX_EVIDENCE_BYTES:,}: "
                             "attach fewer candidates or less kind-specific data")
    return out


def _sampling(s, n_vocab: int) -> dict:
    """{"temperature", "top_k", "seed"} and the controls set (format 4), bounded as /v1 bounds them, each
    refused naming its field; -> the controls at their defaults left out, logit_bias's keys as strings."""
    s = _keys(s, "sampling", ("temperature", "top_k", "seed"), CONTROL_KEYS)
    out = {"temperature": _number(s["temperature"], "sampling.temperature"),
           "top_k": _int(s["top_k"], "sampling.top_k", 1, n_vocab + 1),
           "seed": None if s["seed"] is None else _int(s["seed"], "sampling.seed", 0, 2**63)}
    if out["temperature"] < 0:
        raise InvalidInsight(f"evidence sampling.temperature must be >= 0, got {out['temperature']}")
    given = {k: _number(s[k], f"sampling.{k}") for k in CONTROL_KEYS if k in s and k != "logit_bias"}
    if "logit_bias" in s:
        if not isinstance(s["logit_bias"], dict):
            raise InvalidInsight("evidence sampling.logit_bias must be an object of token ids (as strings) -> "
                                 f"a bias in -100..100, got {type(s['logit_bias']).__name__}")
        try:
            given["logit_bias"] = bias_from_json(s["logit_bias"])
        except ValueError as e:
            raise InvalidInsight(f"evidence sampling.logit_bias: {e}") from None
    try:  # the bounds /v1 and the page have: sampling.py's one check
        controls = Sampling(out["temperature"], out["top_k"], out["seed"], **given).check(n_vocab)
    except ValueError as e:
        raise InvalidInsight(f"evidence sampling.{e}") from None
    return out | controls_json(controls)


def _counts_generated(sampling: dict) -> bool:
    """Whether the controls count the tokens the model generated (OpenAI's penalties)."""
    return bool(sampling.get("presence_penalty") or sampling.get("frequency_penalty"))


def _generated(ps, position: int) -> list[int]:
    """The positions before ``position`` the model generated, increasing (a presence or frequency
    penalty counts their tokens, so replay needs them)."""
    if ps is None:
        raise InvalidInsight(f"evidence generated is needed with a presence or frequency penalty (they count the "
                             f"tokens the model generated): list the positions before {position} it generated, "
                             "[] for none")
    if not isinstance(ps, list):
        raise InvalidInsight(f"evidence generated must be a list of positions, got {type(ps).__name__}")
    out = [_int(q, f"generated[{i}]", 1, position) for i, q in enumerate(ps)]
    if any(b <= a for a, b in zip(out, out[1:], strict=False)):
        raise InvalidInsight("evidence generated must list each position once, in increasing order")
    return out


def _requests(reqs) -> list[dict]:
    if not isinstance(reqs, list):
        raise InvalidInsight("evidence requests must be a list of objects")
    for i, r in enumerate(reqs):
        if not isinstance(r, dict) or not all(isinstance(k, str) for k in r):
            raise InvalidInsight(f"evidence requests[{i}] must be an object")
        for k, v in r.items():
            if not (v is None or isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))):
                raise InvalidInsight(f"evidence requests[{i}].{k} must be text, a finite number or null")
    return reqs


def _data(kind: str, data) -> dict:
    if not isinstance(data, dict):
        raise InvalidInsight("evidence data must be an object")
    try:  # finite numbers only: the file's JSON must read back as it was
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidInsight(f"evidence data must be plain JSON with finite numbers ({e})") from None
    for key in {"attention": ("layer", "head"), "lens": ("layer",)}.get(kind, ()):
        if key in data:
            _int(data[key], f"data.{key}", 0)
    # What replay recomputes is checked in shape, so that a file edited by hand is refused by name.
    for key in ("weights", "logits", "scores"):
        if key in data:
            _numbers(data[key], f"data.{key}")
    if "ids" in data:
        _ids(data["ids"], "data.ids")
    if kind == "analogy" and "terms" in data and (
            not isinstance(data["terms"], list) or len(data["terms"]) != 3
            or not all(isinstance(t, str) and t for t in data["terms"])):
        raise InvalidInsight("evidence data.terms must be the analogy's three words")
    if kind == "attribution":
        _attribution(data, "data")
        if "versus" in data:
            _attribution(data["versus"], "data.versus")
    if kind == "ablation":
        if not isinstance(data.get("parts"), list) or not all(isinstance(x, str) for x in data["parts"]):
            raise InvalidInsight("evidence data.parts must be the parts switched off, as 'attn L.H' or 'mlp L'")
        if data.get("mode", "zero") not in ("zero", "mean"):
            raise InvalidInsight("evidence data.mode must be 'zero' or 'mean' (what a part switched off writes)")
        after = data.get("after")
        if not isinstance(after, list) or not 1 <= len(after) <= MAX_CANDIDATES:
            raise InvalidInsight(f"evidence data.after must be a list of 1 to {MAX_CANDIDATES} {{token_id, logit}}")
        for i, c in enumerate(after):
            _keys(c, f"data.after[{i}]", ("token_id", "logit"))
            _int(c["token_id"], f"data.after[{i}].token_id", 0)
            _number(c["logit"], f"data.after[{i}].logit")
    return data


def _numbers(v, what: str) -> None:  # its length is bounded by the evidence's size
    if not isinstance(v, list):
        raise InvalidInsight(f"evidence {what} must be a list of numbers")
    for i, x in enumerate(v):
        _number(x, f"{what}[{i}]")


def _ids(v, what: str) -> None:
    if not isinstance(v, list) or not 1 <= len(v) <= MAX_VIEW_K:
        raise InvalidInsight(f"evidence {what} must be a list of 1 to {MAX_VIEW_K} token ids")
    for i, x in enumerate(v):
        _int(x, f"{what}[{i}]", 0)


def _attribution(a, what: str) -> None:
    """{token_id, logit, parts: [{kind, layer?, head?, value}]} (a label the page adds is kept)."""
    # data also carries where a sampled token's generation began (the page's "generation")
    _keys(a, what, ("token_id", "logit", "parts"), ("versus", "token", "generation") if what == "data" else ("token",))
    _int(a["token_id"], f"{what}.token_id", 0)
    _number(a["logit"], f"{what}.logit")
    if not isinstance(a["parts"], list) or not 1 <= len(a["parts"]) <= MAX_PARTS:
        raise InvalidInsight(f"evidence {what}.parts must be a list of 1 to {MAX_PARTS} parts")
    for i, part in enumerate(a["parts"]):
        _keys(part, f"{what}.parts[{i}]", ("kind", "value"), ("layer", "head", "label"))
        _number(part["value"], f"{what}.parts[{i}].value")


def check_id(insight_id) -> str:
    # Ids name files: only what save() makes, so no path can leave the folder.
    if not isinstance(insight_id, str) or not ID_RE.fullmatch(insight_id):
        raise InsightNotFound(f"no insight {insight_id!r}: an insight id is lowercase letters, digits and '-'")
    return insight_id


def slug(title: str) -> str:
    """A safe file-name part from any title: ASCII letters and digits joined by '-'."""
    ascii_ = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    s = re.sub(r"[^a-z0-9]+", "-", ascii_.lower()).strip("-")
    return s[:SLUG_CHARS].rstrip("-") or "insight"
