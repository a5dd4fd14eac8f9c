"""Small `.rec/.idx` shards for loader tests, written with the project's RecordIO writer.

Each record's image is a flat colour derived from its id and its captions are real
CLIP tokens of "photo number <id> caption <j>", so a test can tell records (and
which caption was chosen) apart after decoding. Records are written with src.recordio
directly, as another tool would, without data2rec's checks: that is how damaged
images reach a loader.
"""

from collections.abc import Mapping
from pathlib import Path

import cv2
import numpy as np

from src.open_alip.tokenizer import tokenize_np
from src.recordio import IRHeader, MXIndexedRecordIO, pack


def record_colour(rid: int) -> tuple[int, int, int]:
    return (rid * 37) % 256, (rid * 91 + 40) % 256, (rid * 13 + 90) % 256


def caption_tokens(rid: int, k: int, empty: frozenset[int] = frozenset()) -> np.ndarray:
    """[k, 77] float32 token ids; captions whose number is in `empty` are all zeros."""
    toks = tokenize_np([f"photo number {rid} caption {j}" for j in range(k)]).astype(np.float32)
    for j in empty:
        toks[j] = 0
    return toks


def truncated(jpg: bytes) -> bytes:
    """The first third of a JPEG: every decoder fails on it."""
    return jpg[: len(jpg) // 3]


def bogus_marker(jpg: bytes) -> bytes:
    """A JPEG with an undefined marker (FF 99) in the middle of its scan: PIL refuses it,
    libjpeg-turbo (OpenCV, DALI's CPU decoder) warns and decodes it."""
    sos = jpg.index(b"\xff\xda")
    scan = sos + 2 + int.from_bytes(jpg[sos + 2 : sos + 4], "big")
    middle = scan + (len(jpg) - 2 - scan) // 2
    return jpg[:middle] + b"\xff\x99" + jpg[middle:]


CORRUPTIONS = {"truncated": truncated, "bogus_marker": bogus_marker}


def write_shard(
    prefix: Path,
    ids: range | list[int],
    k: int | Mapping[int, int] = 3,
    size: tuple[int, int] = (64, 48),
    empty: dict[int, frozenset[int]] | None = None,
    corrupt: set[int] | Mapping[int, str] = frozenset(),
    labels: Mapping[int, np.ndarray] | None = None,
) -> Path:
    """Write `prefix`.rec/.idx holding records `ids`.

    `k` is the number of captions (or id -> number); ids in `corrupt` get damaged JPEG
    bytes: truncated, or for a mapping, the named kind of CORRUPTIONS; ids in `labels`
    get that label instead of their captions.
    """
    prefix.parent.mkdir(parents=True, exist_ok=True)
    w, h = size
    kinds = corrupt if isinstance(corrupt, Mapping) else dict.fromkeys(corrupt, "truncated")
    with MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "w") as rec:
        for rid in ids:
            img = np.empty((h, w, 3), np.uint8)
            img[:] = record_colour(rid)[::-1]  # OpenCV writes BGR
            img[: h // 4, : w // 4] = 255  # a corner marker makes flips visible
            jpg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()
            if rid in kinds:
                jpg = CORRUPTIONS[kinds[rid]](jpg)
            count = k[rid] if isinstance(k, Mapping) else k
            label = caption_tokens(rid, count, (empty or {}).get(rid, frozenset())).ravel()
            label = (labels or {}).get(rid, label)
            rec.write_idx(rid, pack(IRHeader(0, label, rid, 0), jpg))
    return Path(f"{prefix}.rec")


def decode_words(tokens: np.ndarray) -> list[str]:
    from src.open_alip.tokenizer import decode

    return decode([int(t) for t in tokens if t]).split()


def record_id(tokens: np.ndarray) -> int:
    """The id written into a caption by `caption_tokens` (decoded back from its tokens)."""
    # The tokenizer splits numbers into single digits ("1 0 1"): join them back.
    words = decode_words(tokens)
    return int("".join(words[words.index("number") + 1 : words.index("caption")]))


def caption_index(tokens: np.ndarray) -> int:
    words = decode_words(tokens)
    return int("".join(words[words.index("caption") + 1 :]))
