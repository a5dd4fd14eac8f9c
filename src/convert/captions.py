"""Caption tokens for a record: tokenise raw captions, or check tokens a dataset already holds."""

from __future__ import annotations

import numpy as np

from .items import BAD_TOKENS, EMPTY_CAPTION, EMPTY_TOKENS

CONTEXT_LENGTH = 77
VOCAB_SIZE = 49408  # CLIP BPE: ids must stay below this (and below 2**24 to survive float32)


class CaptionRejected(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def non_empty(captions: list[str]) -> list[str]:
    """The captions that say something, stripped, in their order: an empty cell among several
    caption columns (or an empty caption file among several) costs that caption, not the row."""
    return [c.strip() for c in captions if c.strip()]


def tokenize_captions(captions: list[str], context_length: int = CONTEXT_LENGTH) -> np.ndarray:
    """float32 [K * context_length] token ids of the captions that say something.

    Empty captions and captions that clean to no token at all (control characters,
    unprintable junk) are left out; the row is rejected only when none is left.
    """
    cleaned = non_empty(captions)
    if not cleaned:
        raise CaptionRejected(EMPTY_CAPTION, "no caption" if not captions else f"all {len(captions)} captions are empty")
    from src.open_alip import tokenize_np  # lazily: the tokenizer loads its vocabulary on import

    tokens = np.asarray(tokenize_np(cleaned, context_length=context_length))
    # start + end token only: nothing was left of the text
    kept = tokens[np.count_nonzero(tokens, axis=1) > 2]
    if not len(kept):
        raise CaptionRejected(EMPTY_TOKENS, f"caption {cleaned[0][:40]!r} has no tokens")
    return kept.reshape(-1).astype(np.float32)


def check_tokens(tokens: np.ndarray, context_length: int = CONTEXT_LENGTH) -> np.ndarray:
    """The dataset's own token floats, as float32, if they form whole blocks of valid ids
    and at least one block holds a caption. Blocks are kept exactly as they came."""
    t = np.asarray(tokens, dtype=np.float32).reshape(-1)
    if t.size == 0 or t.size % context_length:
        raise CaptionRejected(BAD_TOKENS, f"{t.size} token values, not a positive multiple of {context_length}")
    lo, hi = t.min(), t.max()  # NaN makes both comparisons below false
    if not (lo >= 0 and hi < VOCAB_SIZE) or np.any(t != np.floor(t)):
        raise CaptionRejected(BAD_TOKENS, "token values are not integer ids below the vocabulary size")
    if not np.any(t[::context_length]):  # a caption block starts with the start token; padding is 0
        raise CaptionRejected(BAD_TOKENS, f"all {t.size // context_length} caption blocks are empty")
    return t
