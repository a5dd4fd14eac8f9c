"""Small `.rec/.idx` shards for loader tests, written with the project's RecordIO writer.

Each record's image is a flat colour derived from its id and its captions are real
CLIP tokens of "photo number <id> caption <j>", so a test can tell records (and
which caption was chosen) apart after decoding.
"""


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


def write_shard(
    prefix: Path,
    ids: range | list[int],
    k: int = 3,
    size: tuple[int, int] = (64, 48),
    empty: dict[int, frozenset[int]] | None = None,
    corrupt: set[int] = frozenset(),
) -> Path:
    """Write `prefix`.rec/.idx holding records `ids`; ids in `corrupt` get truncated JPEG bytes."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    w, h = size
    with MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "w") as rec:
        for rid in ids:
            img = np.empty((h, w, 3), np.uint8)
            img[:] = record_colour(rid)[::-1]  # OpenCV writes BGR
            img[: h // 4, : w // 4] = 255  # a corner marker makes flips visible
            jpg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 95])[1].tobytes()
            if rid in corrupt:
                jpg = jpg[: len(jpg) // 3]
            label = caption_tokens(rid, k, (empty or {}).get(rid, frozenset())).ravel()
            rec.write_idx(rid, pack(IRHeader(0, label, rid, 0), jpg))
    return Path(f"{prefix}.rec")


def record_id(tokens: np.ndarray) -> int:
    """The id written into a caption by `caption_tokens` (decoded back from its tokens)."""
    from src.open_alip.tokenizer import decode

    # The tokenizer splits numbers into single digits ("1 0 1"): join them back.
    words = decode([int(t) for t in tokens if t]).split()
    return int("".join(words[words.index("number") + 1 : words.index("caption")]))


def caption_index(tokens: np.ndarray) -> int:
    from src.open_alip.tokenizer import decode

    words = decode([int(t) for t in tokens if t]).split()
    return int("".join(words[words.index("caption") + 1 :]))
