"""The caption record: one image with its captions, as data2rec writes it and the loaders read it.

A caption record is a RecordIO image record (src/recordio.py) whose label is K >= 1 blocks of
`CONTEXT_LENGTH` CLIP token ids stored as float32, `flag` being the number of those values, and
whose payload is the encoded image (docs/formats.md, section 1).

`check_captions` is the one rule for what such a label may hold. The converter applies it to every
row before writing it, `data2rec --verify` to every record it re-reads, and both loader backends to
every record they read: a record either converts and loads, or is refused at conversion with the
reason that a loader would otherwise give later.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from src.open_alip.constants import CONTEXT_LENGTH, EOT_TOKEN, SOT_TOKEN, VOCAB_SIZE
from src.recordio import pack_label_head, unpack

__all__ = [
    "CONTEXT_LENGTH",
    "EOT_TOKEN",
    "SOT_TOKEN",
    "VOCAB_SIZE",
    "CaptionRecord",
    "InvalidCaptions",
    "caption_record_head",
    "check_captions",
    "pack_caption_record",
    "unpack_caption_record",
]


class InvalidCaptions(ValueError):
    """A label that is not a valid set of caption blocks; the message (one line) says why."""


class CaptionRecord(NamedTuple):
    tokens: np.ndarray  # float32 [K * CONTEXT_LENGTH], checked by `check_captions`
    id: int
    id2: int
    payload: bytes


def check_captions(label: Any) -> np.ndarray:
    """`label` as a fresh, writable float32 array [K * CONTEXT_LENGTH] if it is a valid set of
    caption blocks; InvalidCaptions naming the first problem otherwise.

    Valid is what the tokenizer writes (src/open_alip/tokenizer.py): every value an integer token
    id in 0..VOCAB_SIZE-1 (no NaN, whose comparisons are all false, nor infinity: either would
    reach the embedding lookup in training and crash it), whole blocks of CONTEXT_LENGTH, each
    either a caption that begins with the start token or an empty caption that is all zeros (the
    padding a row of fewer captions carries), and at least one caption. A label that is one number
    (`recordio.unpack` gives a float for flag 0) is im2rec's class label, not captions.
    """
    if np.ndim(label) == 0:
        raise InvalidCaptions(
            "the label is a single number (flag 0), as im2rec writes for classification, not caption tokens"
        )
    t = np.array(label, dtype=np.float32).reshape(-1)  # a copy: record buffers are read-only
    if t.size == 0 or t.size % CONTEXT_LENGTH:
        raise InvalidCaptions(
            f"{t.size} caption token values, not a positive multiple of {CONTEXT_LENGTH} "
            f"(one block of {CONTEXT_LENGTH} per caption)"
        )
    # The loaders check every record they read: the common case (every block a caption) in a few
    # whole-array operations, anything else through the checks below, which name the problem.
    lo, hi = t.min(), t.max()
    if (
        lo >= 0
        and hi < VOCAB_SIZE
        and (t.astype(np.int32) == t).all()
        and (t[::CONTEXT_LENGTH] == SOT_TOKEN).all()
    ):
        return t
    _raise_problem(t, lo, hi)
    return t


def _raise_problem(t: np.ndarray, lo: float, hi: float) -> None:
    """InvalidCaptions naming the first problem of `t`; nothing if it holds empty blocks beside captions."""
    if not (lo >= 0 and hi < VOCAB_SIZE):  # NaN fails both comparisons (and makes min and max NaN)
        if not np.isfinite(t).all():
            what = "NaN" if np.isnan(t).any() else "infinite"
            raise InvalidCaptions(f"the caption tokens hold {what} values, not token ids")
        raise InvalidCaptions(f"caption tokens fall outside 0..{VOCAB_SIZE - 1} (min {lo:.0f}, max {hi:.0f})")
    fraction = t != np.floor(t)
    if fraction.any():
        raise InvalidCaptions(
            f"the caption tokens hold non-integer values (such as {t[fraction][0]:g}), not token ids"
        )
    blocks = t.reshape(-1, CONTEXT_LENGTH)
    caption = blocks[:, 0] == SOT_TOKEN
    odd = ~caption & blocks.any(axis=1)
    if odd.any():
        i = int(np.argmax(odd))
        raise InvalidCaptions(
            f"caption block {i + 1} of {len(blocks)} begins with {blocks[i, 0]:.0f}, not the start token "
            f"{SOT_TOKEN}: a caption must begin with it and an empty one must be all zeros"
        )
    if not caption.any():
        raise InvalidCaptions(f"all {len(blocks)} caption blocks are empty (all zeros)")


def pack_caption_record(tokens: np.ndarray, sample_id: int, id2: int, payload: bytes) -> bytes:
    """The record of `payload` with caption `tokens` (already passed through `check_captions`)."""
    return caption_record_head(tokens, sample_id, id2) + payload


def caption_record_head(tokens: np.ndarray, sample_id: int, id2: int) -> bytes:
    """What the record of caption `tokens` holds before its payload (header and label), for
    writers that write the payload after it without a join (MXRecordIO.write_parts)."""
    return pack_label_head(tokens, sample_id, id2)  # the tokens are an array: no IRHeader, no number check


def unpack_caption_record(record: bytes) -> CaptionRecord:
    """The record's checked captions, ids and payload; RecordIOError if the record is cut short,
    InvalidCaptions if its label breaks the rule of `check_captions`."""
    header, payload = unpack(record)
    return CaptionRecord(check_captions(header.label), int(header.id), int(header.id2), payload)
