"""Streamed text pieces join to exactly tokenizer.decode(ids), and never hold half a character."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.request.detokenizer import REPLACEMENT, IncrementalDetokenizer
from engine.tokenizer.tokenizer import Tokenizer
from tests.examples import examples

SAMPLES = [
    "北京到上海有多少公里？大约1200公里。",
    "Emoji: 🙂👍🏽 and a family 👨‍👩‍👧‍👦, flags 🇫🇷🇯🇵.",
    "Mixed: naïve café, Ünïcödé, עברית, العربية, हिन्दी, 日本語のテキスト",
    "code:\n```python\nprint('hi')\n```\n",
    "  leading spaces and\ttabs\n\nnewlines  ",
]


def stream(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer.decode)
    pieces = [detok.push(i) for i in ids]
    pieces.append(detok.flush())
    return pieces


@pytest.fixture(scope="module")
def byte_tokenizer(tiny_model_dir):
    return Tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def smollm_tokenizer(default_engine):
    return default_engine.tokenizer


@pytest.mark.parametrize("text", SAMPLES)
def test_byte_level_pieces_join_to_decode_and_never_split_a_character(byte_tokenizer, text):
    ids = byte_tokenizer.encode(text)
    assert len(ids) == len(text.encode("utf-8"))  # one token per byte: characters are split
    pieces = stream(byte_tokenizer, ids)
    assert "".join(pieces) == byte_tokenizer.decode(ids) == text
    assert not any(REPLACEMENT in p for p in pieces)


@pytest.mark.real_model
@pytest.mark.parametrize("text", SAMPLES)
def test_real_tokenizer_pieces_join_to_decode(smollm_tokenizer, text):
    ids = smollm_tokenizer.encode(text)
    pieces = stream(smollm_tokenizer, ids)
    assert "".join(pieces) == smollm_tokenizer.decode(ids)
    assert not any(REPLACEMENT in p for p in pieces)


@settings(max_examples=examples(200), deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_any_text_streams_back_exactly(byte_tokenizer, text):
    ids = byte_tokenizer.encode(text)
    pieces = stream(byte_tokenizer, ids)
    assert "".join(pieces) == byte_tokenizer.decode(ids)
    if REPLACEMENT not in text:
        assert not any(REPLACEMENT in p for p in pieces)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=257), min_size=1, max_size=30))
def test_arbitrary_token_ids_stream_back_exactly(byte_tokenizer, ids):
    # Random bytes are often invalid UTF-8: the contract still holds.
    assert "".join(stream(byte_tokenizer, ids)) == byte_tokenizer.decode(ids)


def test_a_reply_cut_mid_character_is_flushed_as_decode_shows_it(byte_tokenizer):
    ids = byte_tokenizer.encode("ok 🙂")[:-2]  # the emoji's last two bytes never came
    detok = IncrementalDetokenizer(byte_tokenizer.decode)
    streamed = "".join(detok.push(i) for i in ids)
    assert streamed == "ok "
    assert streamed + detok.flush() == byte_tokenizer.decode(ids)


def test_special_tokens_add_no_text(byte_tokenizer):
    ids = byte_tokenizer.encode("hi") + [257]  # <|im_end|>
    assert stream(byte_tokenizer, ids)[-2:] == ["", ""]
