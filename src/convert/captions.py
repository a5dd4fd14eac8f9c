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


def tokenize_captions(captions: list[str], context_length: int = CONTEXT_LENGTH) -> np.ndarray:
    """float32 [K * context_length] token ids of K captions; every caption must say something."""
    if not captions:
        raise CaptionRejected(EMPTY_CAPTION, "no caption")
    cleaned = [c.strip() for c in captions]
    for i, c in enumerate(cleaned):
        if not c:
            raise CaptionRejected(EMPTY_CAPTION, f"caption {i} is empty")
    from src.open_alip import tokenize_np  # lazily: the tokenizer loads its vocabulary on import

    tokens = np.asarray(tokenize_np(cleaned, context_length=context_length))
    # A caption of only control characters or unprintable junk cleans to nothing: start + end token.
    content = np.count_nonzero(tokens, axis=1)
    for i, n in enumerate(content):
        if n <= 2:
            raise CaptionRejected(EMPTY_TOKENS, f"caption {i} {captions[i][:40]!r} has no tokens")
    return tokens.reshape(-1).astype(np.float32)


def check_tokens(tokens: np.ndarray, context_length: int = CONTEXT_LENGTH) -> np.ndarray:
    """The dataset's own token floats, as float32, if they form whole blocks of valid ids."""
    t = np.asarray(tokens, dtype=np.float32).reshape(-1)
    if t.size == 0 or t.size % context_length:
        raise CaptionRejected(BAD_TOKENS, f"{t.size} token values, not a positive multiple of {context_length}")
    lo, hi = t.min(), t.max()  # NaN makes both comparisons below false
    if not (lo >= 0 and hi < VOCAB_SIZE) or np.any(t != np.floor(t)):
        raise CaptionRejected(BAD_TOKENS, "token values are not integer ids below the vocabulary size")
    return t
