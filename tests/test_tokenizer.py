"""GPT-2's byte-level BPE, built offline: known ids, the special token, round trips,
and tokens that are only part of a UTF-8 character."""

from __future__ import annotations

import pytest

from puffergpt.model import tokenizer
from puffergpt.model.tokenizer import EOT, VOCAB_SIZE, decode, encode, token_text

REPLACEMENT = "\ufffd"


def test_known_ids():
    # The ids OpenAI's GPT-2 tokenizer gives (and every GPT-2 tutorial shows).
    assert encode("Hello world") == [15496, 995]
    assert decode([15496, 995]) == "Hello world"
    assert [token_text(t) for t in [15496, 995]] == ["Hello", " world"]


def test_endoftext_is_the_special_token():
    assert EOT == 50256
    assert encode("<|endoftext|>") == [EOT]
    assert encode("a<|endoftext|>b") == [encode("a")[0], EOT, encode("b")[0]]
    assert decode([EOT]) == "<|endoftext|>"
    assert token_text(EOT) == "<|endoftext|>"


def test_vocabulary_size():
    enc = tokenizer.get_encoding()
    assert enc.n_vocab == VOCAB_SIZE == 50257
    # Every id has some text, and none of them raises.
    assert all(isinstance(token_text(t), str) and token_text(t) for t in range(VOCAB_SIZE))


@pytest.mark.parametrize("s", [
    "", " ", "\n\n", "Hello world", "  leading and trailing spaces  ", "tabs\tand\r\nnewlines",
    "Ünïcödé and emoji 🎉 are bytes too", "世界", "🙂👍🏽", "\x00\x01\x7f", "it's we've they're",
    "<|endoftext|> in the middle <|endoftext|>",
])
def test_round_trip_examples(s):
    assert decode(encode(s)) == s


def test_round_trip_arbitrary_unicode():
    import hypothesis
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=200, deadline=None, database=None)
    @hypothesis.given(st.text())
    def round_trip(s):
        ids = encode(s)
        assert all(0 <= t < VOCAB_SIZE for t in ids)
        assert decode(ids) == s

    round_trip()


@pytest.mark.parametrize("s", ["世", "🙂"])
def test_partial_utf8_token_shows_replacement_character(s):
    ids = encode(s)
    assert len(ids) > 1, f"{s!r} is expected to take more than one byte-level token"
    first = tokenizer.get_encoding().decode_single_token_bytes(ids[0])
    with pytest.raises(UnicodeDecodeError):
        first.decode("utf-8")  # the first token alone really is a partial byte sequence
    # ... and neither token_text nor decode raises on it: they show U+FFFD.
    assert REPLACEMENT in token_text(ids[0])
    assert REPLACEMENT in decode(ids[:1])
    # The tokens together are the character again.
    assert decode(ids) == s
    assert REPLACEMENT not in decode(ids)
