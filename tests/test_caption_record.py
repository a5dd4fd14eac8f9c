"""The caption record (src/caption_record.py): the one rule for valid caption tokens, and pack/unpack."""

import numpy as np
import pytest

from src import caption_record
from src.caption_record import (
    CONTEXT_LENGTH,
    EOT_TOKEN,
    SOT_TOKEN,
    VOCAB_SIZE,
    InvalidCaptions,
    check_captions,
    pack_caption_record,
    unpack_caption_record,
)
from src.open_alip import constants, tokenize_np
from src.recordio import IRHeader, RecordIOError, pack


def captions(*texts: str) -> np.ndarray:
    return tokenize_np(list(texts)).astype(np.float32).reshape(-1)


def with_value(at: int, value: float) -> np.ndarray:
    t = captions("a photo of a cat", "a dog")
    t[at] = value
    return t


def without_start_tokens(t: np.ndarray) -> np.ndarray:
    """Blocks as a tokenizer run without the start token writes them: ids, end token, zeros."""
    blocks = t.reshape(-1, CONTEXT_LENGTH)
    return np.concatenate([blocks[:, 1:], np.zeros((len(blocks), 1), np.float32)], axis=1).reshape(-1)


ZERO = np.zeros(CONTEXT_LENGTH, np.float32)
CAT = captions("a photo of a cat")

REFUSED = [
    (5.0, "single number (flag 0)"),
    (np.zeros(0, np.float32), "0 caption token values, not a positive multiple of 77"),
    (CAT[:76], "76 caption token values, not a positive multiple of 77"),
    (np.concatenate([CAT, CAT[:10]]), "87 caption token values"),
    (with_value(9, np.nan), "hold NaN values"),
    (with_value(0, np.nan), "hold NaN values"),  # in the start token's place
    (with_value(80, np.inf), "hold infinite values"),
    (with_value(3, -np.inf), "hold infinite values"),
    (with_value(2, 320.5), "non-integer values (such as 320.5)"),
    (with_value(4, VOCAB_SIZE), "outside 0..49407 (min 0, max 49408)"),
    (with_value(4, -1), "outside 0..49407 (min -1"),
    (without_start_tokens(CAT), "caption block 1 of 1 begins with 320, not the start token 49406"),
    (np.concatenate([CAT, without_start_tokens(CAT)]), "caption block 2 of 2 begins with 320"),
    (
        np.concatenate([CAT, np.where(np.arange(CONTEXT_LENGTH) == 5, 320, 0).astype(np.float32)]),
        "caption block 2 of 2 begins with 0, not the start token",
    ),  # padding must be all zeros
    (np.concatenate([ZERO, ZERO]), "all 2 caption blocks are empty"),
]


@pytest.mark.parametrize(
    "label, fragment",
    REFUSED,
    ids=[
        "scalar",
        "empty",
        "short",
        "not-whole-blocks",
        "nan",
        "nan-first",
        "inf",
        "minus-inf",
        "fraction",
        "vocab-size",
        "negative",
        "no-start-token",
        "second-without-start-token",
        "padding-not-zero",
        "all-zero",
    ],
)
def test_the_rule_refuses_with_a_one_line_reason(label, fragment):
    with pytest.raises(InvalidCaptions) as info:
        check_captions(label)
    text = str(info.value)
    assert fragment in text and "\n" not in text, text


def test_the_rule_accepts_what_the_tokenizer_writes_and_padding():
    texts = ["", "a photo of a cat", "word " * 200, "東京 🐱 naïve", "\x00\x01"]  # one truncated
    tokens = captions(*texts)
    got = check_captions(tokens)
    np.testing.assert_array_equal(got, tokens)
    assert got.dtype == np.float32 and got.flags.writeable and got is not tokens
    padded = np.concatenate([ZERO, CAT, ZERO])  # empty blocks anywhere, one caption present
    np.testing.assert_array_equal(check_captions(padded), padded)
    np.testing.assert_array_equal(check_captions(CAT.astype(np.float64).tolist()), CAT)  # any sequence
    read_only = np.frombuffer(CAT.tobytes(), np.float32)
    assert check_captions(read_only).flags.writeable  # record buffers are read-only; batches need a copy


def test_the_constants_are_the_models():
    assert (CONTEXT_LENGTH, SOT_TOKEN, EOT_TOKEN, VOCAB_SIZE) == (
        constants.CONTEXT_LENGTH,
        constants.SOT_TOKEN,
        constants.EOT_TOKEN,
        constants.VOCAB_SIZE,
    )
    assert caption_record.CONTEXT_LENGTH is constants.CONTEXT_LENGTH


def test_pack_is_recordio_pack_and_unpack_checks_the_captions():
    tokens = captions("a cat", "a dog")
    record = pack_caption_record(tokens, 2**40 + 5, 17, b"payload")
    assert record == pack(IRHeader(0, tokens, 2**40 + 5, 17), b"payload")
    got = unpack_caption_record(record)
    np.testing.assert_array_equal(got.tokens, tokens)
    assert (got.id, got.id2, got.payload) == (2**40 + 5, 17, b"payload")
    with pytest.raises(InvalidCaptions, match="hold NaN values"):
        unpack_caption_record(pack(IRHeader(0, with_value(7, np.nan), 1, 0), b"x"))
    with pytest.raises(InvalidCaptions, match="flag 0"):
        unpack_caption_record(pack(IRHeader(0, 3.0, 1, 0), b"x"))  # im2rec's class label
    with pytest.raises(RecordIOError, match="shorter than"):
        unpack_caption_record(b"\0" * 10)
