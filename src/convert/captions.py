"""Caption tokens for a record: tokenise raw captions, or check tokens a dataset already holds."""

from __future__ import annotations

import numpy as np

from ..caption_record import CONTEXT_LENGTH, InvalidCaptions, check_captions
from .items import BAD_TOKENS, EMPTY_CAPTION, EMPTY_TOKENS, UNDECODABLE_CAPTION


class CaptionRejected(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def decode_caption(data: bytes, name: str) -> str:
    """A caption file's text (UTF-8, a leading byte-order mark dropped); CaptionRejected naming
    `name` and the first bad byte if it is not UTF-8: decoding it with replacement characters
    would store a caption nobody wrote, unseen."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise CaptionRejected(UNDECODABLE_CAPTION, f"{name}: not UTF-8 text ({undecodable(exc)})") from None


def undecodable(exc: UnicodeDecodeError) -> str:
    return f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"


def non_empty(captions: list[str]) -> list[str]:
    """The captions that say something, stripped, in their order: an empty cell among several
    caption columns (or an empty caption file among several) costs that caption, not the row."""
    return [c.strip() for c in captions if c.strip()]


def tokenize_captions(captions: list[str]) -> np.ndarray:
    """float32 [K * CONTEXT_LENGTH] token ids of the captions that say something.

    Empty captions and captions that clean to no token at all (control characters,
    unprintable junk) are left out; the row is rejected only when none is left.
    """
    cleaned = non_empty(captions)
    if not cleaned:
        raise CaptionRejected(
            EMPTY_CAPTION, "no caption" if not captions else f"all {len(captions)} captions are empty"
        )
    from src.open_alip import tokenize_np  # lazily: the tokenizer loads its vocabulary on import

    tokens = np.asarray(tokenize_np(cleaned, context_length=CONTEXT_LENGTH))
    # start + end token only: nothing was left of the text
    kept = tokens[np.count_nonzero(tokens, axis=1) > 2]
    if not len(kept):
        raise CaptionRejected(EMPTY_TOKENS, f"caption {cleaned[0][:40]!r} has no tokens")
    # Through the rule the loaders apply, like a dataset's own tokens: nothing is written that
    # they would refuse.
    return check_tokens(kept)


def check_tokens(tokens: np.ndarray) -> np.ndarray:
    """Caption tokens as float32 [K * CONTEXT_LENGTH], kept exactly as they came (empty blocks
    included), if they pass src/caption_record.py's rule; CaptionRejected with its reason if not."""
    try:
        return check_captions(tokens)
    except InvalidCaptions as exc:
        raise CaptionRejected(BAD_TOKENS, str(exc)) from None
