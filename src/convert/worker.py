"""Turn one item into what its record stores (or a skip reason). Runs in the worker processes."""

from __future__ import annotations

import signal
from dataclasses import dataclass

from ..caption_record import CONTEXT_LENGTH
from .captions import CaptionRejected, check_tokens, non_empty, tokenize_captions
from .images import ImageOptions, ImageRejected, prepare_image
from .items import (
    EMPTY_CAPTION,
    MAX_CAPTIONS,
    MISSING_CAPTION,
    MISSING_IMAGE,
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


def _read_captions(candidates: list[str], numbered: bool, most: int) -> list[str] | None:
    """The captions of the first candidate `STEM.txt` that exists, with `STEM.1.txt`,
    `STEM.2.txt`, ... beside it (numbered from 1, until one is missing) when `numbered`;
    at most `most` + 1 of them, enough to tell that a row has too many."""
    for path in candidates:
        base = path[: -len(".txt")]
        names = [path, *(f"{base}.{n}.txt" for n in range(1, most + 1))] if numbered else [path]
        captions: list[str] = []
        for n, name in enumerate(names):
            try:
                with open(name, encoding="utf-8-sig", errors="replace") as f:
                    captions.append(" ".join(f.read().split()))
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                if n > 0:  # the numbered ones end at the first gap
                    break
        if captions:
            return captions
    return None


def _skip(item: Item, reason: str, detail: str) -> Result:
    return Result(item.pos, item.ref, item.slot, item.sample_id, reason=reason, detail=detail)


def process_item(item: Item, config: WorkerConfig) -> Result:
    if item.error:
        return _skip(item, item.error, item.detail)
    captions = item.captions
    if item.tokens is None and captions is None:
        captions = _read_captions(item.extra.get("caption_files", []), item.extra.get("numbered", False),
                                  config.max_captions)
        if captions is None:
            return _skip(item, MISSING_CAPTION, "no caption .txt found")
    try:
        tokens = None
        if item.tokens is not None:
            tokens = check_tokens(item.tokens)
        else:
            captions = non_empty(captions or [])
            if not captions:  # the cheap check first, before the image is read
                return _skip(item, EMPTY_CAPTION, "every caption is empty")
        k = tokens.size // CONTEXT_LENGTH if tokens is not None else len(captions or [])
        if k > config.max_captions:
            return _skip(item, TOO_MANY_CAPTIONS, f"{k} captions, more than --max-captions {config.max_captions}")
        data = item.image
        if data is None:
            try:
                with open(item.image_path or "", "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                return _skip(item, MISSING_IMAGE, f"{item.image_path}: no such file")
            except OSError as exc:
                return _skip(item, UNREADABLE, f"{item.image_path}: {exc.strerror or exc}")
        payload, converted = prepare_image(data, config.image)
        if tokens is None:
            tokens = tokenize_captions(captions or [])
    except (ImageRejected, CaptionRejected) as exc:
        return _skip(item, exc.reason, exc.detail)
    if payload is item.image:
        payload = None  # passed through: the writer takes the item's own bytes
    return Result(item.pos, item.ref, item.slot, item.sample_id, tokens=tokens, payload=payload,
                  captions=tokens.size // CONTEXT_LENGTH, converted=converted)


def is_light(items: list[Item], config: WorkerConfig) -> bool:
    """True when the chunk needs no decoding or tokenising: shipping it to a worker costs more
    than doing it (the hub's parquet with --validate off: bytes and tokens pass straight through)."""
    image = config.image
    if image.validate != "off" or image.resize_short or image.quality is not None:
        return False
    return all(item.error is not None or (item.tokens is not None and item.image is not None) for item in items)


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
    kept = [(i, r.payload if r.payload is not None else items[i].image) for i, r in enumerate(results)
            if r.reason is None]
    for j, message in _dali.failures([p or b"" for _, p in kept]).items():
        r = results[kept[j][0]]
        r.reason, r.detail, r.tokens, r.payload = UNDECODABLE, f"DALI's CPU decoder: {message}", None, None


def process_chunk(items: list[Item]) -> list[Result]:
    results = [_process_safely(item) for item in items]
    if _config.image.validate == "full":
        _dali_full_check(items, results)
    return results
