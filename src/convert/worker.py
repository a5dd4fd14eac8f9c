"""Turn one item into what its record stores (or a skip reason). Runs in the worker processes."""

from __future__ import annotations

import signal
from dataclasses import dataclass

import numpy as np

from src.fsutil import DEFAULT_MAX_FILE_BYTES, FileTooLarge, NotARegularFile, read_regular_file

from ..caption_record import CONTEXT_LENGTH, SOT_TOKEN
from .captions import CaptionRejected, check_tokens, decode_caption, non_empty, tokenize_captions
from .images import JPEG_SIGNATURE, ImageOptions, ImageRejected, prepare_image
from .items import (
    EMPTY_CAPTION,
    FILE_TOO_LARGE,
    MAX_CAPTIONS,
    MISSING_CAPTION,
    MISSING_IMAGE,
    NOT_REGULAR,
    PROCESSING_ERROR,
    TOO_MANY_CAPTIONS,
    UNDECODABLE,
    UNREADABLE,
    Item,
    Result,
)
from .processes import die_with_parent


@dataclass(frozen=True)
class WorkerConfig:
    image: ImageOptions = ImageOptions()
    max_captions: int = MAX_CAPTIONS
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # 0: no cap


_config = WorkerConfig()
_dali = None  # the DALI decode check of --validate full, built on first use in each process


def init_worker(config: WorkerConfig, subprocess: bool = False) -> None:
    """Process-pool initializer: one thread per process, the pool is the parallelism.

    In a worker process: die with the parent (a killed run leaves nothing behind), and
    leave Ctrl-C to the parent, which stops the pool itself (no traceback per worker).
    """
    global _config
    _config = config
    if subprocess:
        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    import cv2

    cv2.setNumThreads(1)


class FileSkip(Exception):
    """An input file that is no regular file, or is over the size cap: the item's skip reason."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def read_input_file(path: str, max_bytes: int) -> bytes:
    """An image or caption file's bytes: a regular file only (a FIFO would hang the worker, a
    device never end), at most `max_bytes` (0: no cap); FileSkip with the reason if not."""
    try:
        return read_regular_file(path, max_bytes)
    except NotARegularFile as exc:
        raise FileSkip(NOT_REGULAR, f"{path}: {exc.strerror}") from None
    except FileTooLarge as exc:
        raise FileSkip(FILE_TOO_LARGE, f"{path}: {exc.strerror} (--max-file-bytes)") from None


def _read_captions(candidates: list[str], numbered: bool, most: int, max_bytes: int) -> list[str] | None:
    """The captions of the first candidate `STEM.txt` that exists, with `STEM.1.txt`,
    `STEM.2.txt`, ... beside it (numbered from 1, until one is missing) when `numbered`;
    at most `most` + 1 of them, enough to tell that a row has too many. A caption file that is
    not UTF-8, not a regular file or too large raises CaptionRejected / FileSkip."""
    for path in candidates:
        base = path[: -len(".txt")]
        names = [path, *(f"{base}.{n}.txt" for n in range(1, most + 1))] if numbered else [path]
        captions: list[str] = []
        for n, name in enumerate(names):
            try:
                data = read_input_file(name, max_bytes)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                if n > 0:  # the numbered ones end at the first gap
                    break
                continue
            captions.append(" ".join(decode_caption(data, name).split()))
        if captions:
            return captions
    return None


def _skip(item: Item, reason: str, detail: str) -> Result:
    return Result(item.pos, item.ref, item.slot, item.sample_id, reason=reason, detail=detail)


def process_item(item: Item, config: WorkerConfig) -> Result:
    """The item's record or skip reason."""
    if item.error:
        return _skip(item, item.error, item.detail)
    captions = item.captions
    try:
        if item.tokens is None and captions is None:
            captions = _read_captions(
                item.extra.get("caption_files", []),
                item.extra.get("numbered", False),
                config.max_captions,
                config.max_file_bytes,
            )
            if captions is None:
                return _skip(item, MISSING_CAPTION, "no caption .txt found")
        tokens = None
        if item.tokens is not None:
            tokens = item.tokens if item.tokens_checked else check_tokens(item.tokens)
        else:
            captions = non_empty(captions or [])
            if not captions:  # the cheap check first, before the image is read
                return _skip(item, EMPTY_CAPTION, "every caption is empty")
        k = tokens.size // CONTEXT_LENGTH if tokens is not None else len(captions or [])
        if k > config.max_captions:
            return _skip(
                item, TOO_MANY_CAPTIONS, f"{k} captions, more than --max-captions {config.max_captions}"
            )
        data = item.image
        if data is None:
            try:
                data = read_input_file(item.image_path or "", config.max_file_bytes)
            except FileNotFoundError:
                return _skip(item, MISSING_IMAGE, f"{item.image_path}: no such file")
            except OSError as exc:
                return _skip(item, UNREADABLE, f"{item.image_path}: {exc.strerror or exc}")
        payload, converted = prepare_image(data, config.image)
        if tokens is None:
            tokens = tokenize_captions(captions or [])
    except (ImageRejected, CaptionRejected, FileSkip) as exc:
        return _skip(item, exc.reason, exc.detail)
    except OSError as exc:  # a caption file that exists but cannot be read
        return _skip(item, UNREADABLE, f"{exc.filename}: {exc.strerror or exc}")
    if payload is item.image:
        payload = None  # passed through: the writer takes the item's own bytes
    return Result(
        item.pos,
        item.ref,
        item.slot,
        item.sample_id,
        tokens=tokens,
        payload=payload,
        captions=tokens.size // CONTEXT_LENGTH,
        converted=converted,
    )


def is_light(items: list[Item], config: WorkerConfig) -> bool:
    """True when the chunk needs no decoding or tokenising: shipping it to a worker costs more
    than doing it. The hub's parquet with --validate off or structure: tokens pass straight
    through, and JPEGs are checked from their headers and last bytes (a few microseconds, where
    sending 64 KB to a worker process costs tens); other image formats are re-encoded there."""
    image = config.image
    if image.validate.decodes or image.resize_short or image.quality is not None:
        return False
    return all(
        item.error is not None
        or (
            item.tokens is not None
            and item.image is not None
            and item.image[: len(JPEG_SIGNATURE)] == JPEG_SIGNATURE
        )
        for item in items
    )


def check_chunk_tokens(items: list[Item]) -> list[Item]:
    """`items`, each row whose tokens pass the rule given them as check_tokens returns them, and
    `tokens_checked`; checked in one pass for the whole chunk (see _chunk_tokens). The pipeline
    runs it on its reading thread: the passes over a whole chunk release the GIL, and on the
    thread that makes and writes the records each release meant waiting to get it back (there it
    took 10-15 us a row, against 2.6 alone)."""
    for item, tokens in zip(items, _chunk_tokens(items)):
        if tokens is not None:
            item.tokens, item.tokens_checked = tokens, True
    return items


def _chunk_tokens(items: list[Item]) -> list[np.ndarray | None]:
    """Each item's tokens as check_tokens returns them, checked in one pass for the whole chunk
    (per row, the rule's half-dozen numpy reductions cost more than the row's copy); None for
    an item left to the per-row check: all of them when any row breaks the rule, so that
    check_tokens itself names each row's problem."""
    rows = [i for i, item in enumerate(items) if item.error is None and item.tokens is not None]
    out: list[np.ndarray | None] = [None] * len(items)
    arrays = [items[i].tokens for i in rows]
    if len(rows) < 2 or any(np.ndim(a) != 1 or not a.size or a.size % CONTEXT_LENGTH for a in arrays):
        return out
    try:
        joined = check_tokens(np.concatenate(arrays))  # whole blocks: the chunk's blocks are the rows'
    except CaptionRejected:
        return out
    starts = np.cumsum([0] + [a.size // CONTEXT_LENGTH for a in arrays[:-1]])
    captioned = np.logical_or.reduceat(joined.reshape(-1, CONTEXT_LENGTH)[:, 0] == SOT_TOKEN, starts)
    if not captioned.all():  # a row of empty blocks only: check_tokens says so
        return out
    offset = 0
    for i, a in zip(rows, arrays):
        out[i] = joined[offset : offset + a.size]
        offset += a.size
    return out


def _process_safely(item: Item) -> Result:
    try:
        return process_item(item, _config)
    except Exception as exc:  # one hostile file must not end a 15M-sample run
        return _skip(item, PROCESSING_ERROR, f"{type(exc).__name__}: {exc}")


def _dali_full_check(items: list[Item], results: list[Result]) -> None:
    """--validate full: what PIL passed must also pass DALI's CPU decoder."""
    global _dali
    from .dali_check import DaliDecodeCheck, dali_available

    if not dali_available():
        return
    if _dali is None:
        _dali = DaliDecodeCheck()
    kept = [
        (i, r.payload if r.payload is not None else items[i].image)
        for i, r in enumerate(results)
        if r.reason is None
    ]
    for j, message in _dali.failures([p or b"" for _, p in kept]).items():
        r = results[kept[j][0]]
        r.reason, r.detail, r.tokens, r.payload = UNDECODABLE, f"DALI's CPU decoder: {message}", None, None


def process_chunk(items: list[Item]) -> list[Result]:
    if not any(item.tokens_checked for item in items):  # the pipeline checks them as it reads
        check_chunk_tokens(items)
    results = [_process_safely(item) for item in items]
    if _config.image.validate.decodes_in_dali:
        _dali_full_check(items, results)
    return results
