"""Turn one item into what its record stores (or a skip reason). Runs in the worker processes."""

from __future__ import annotations

from dataclasses import dataclass

from .captions import CONTEXT_LENGTH, CaptionRejected, check_tokens, tokenize_captions
from .images import ImageOptions, ImageRejected, prepare_image
from .items import MISSING_CAPTION, MISSING_IMAGE, PROCESSING_ERROR, UNREADABLE, Item, Result


@dataclass(frozen=True)
class WorkerConfig:
    image: ImageOptions = ImageOptions()
    context_length: int = CONTEXT_LENGTH


_config = WorkerConfig()


def init_worker(config: WorkerConfig) -> None:
    """Process-pool initializer: one thread per process, the pool is the parallelism."""
    global _config
    _config = config
    import cv2

    cv2.setNumThreads(1)


def _read_caption_file(candidates: list[str]) -> list[str] | None:
    for path in candidates:
        try:
            with open(path, encoding="utf-8-sig", errors="replace") as f:
                return [" ".join(f.read().split())]
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            continue
    return None


def _skip(item: Item, reason: str, detail: str) -> Result:
    return Result(item.pos, item.ref, item.slot, item.sample_id, reason=reason, detail=detail)


def process_item(item: Item, config: WorkerConfig) -> Result:
    if item.error:
        return _skip(item, item.error, item.detail)
    ctx = config.context_length
    captions = item.captions
    if item.tokens is None and captions is None:
        captions = _read_caption_file(item.extra.get("caption_files", []))
        if captions is None:
            return _skip(item, MISSING_CAPTION, "no caption .txt found")
    try:
        if item.tokens is not None:
            tokens = check_tokens(item.tokens, ctx)
        elif not captions or not all(c.strip() for c in captions):
            tokens = tokenize_captions(captions or [], ctx)  # raises the empty-caption reason
        else:
            tokens = None  # tokenised after the image passed: the cheaper check goes first
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
            tokens = tokenize_captions(captions or [], ctx)
    except (ImageRejected, CaptionRejected) as exc:
        return _skip(item, exc.reason, exc.detail)
    return Result(
        item.pos, item.ref, item.slot, item.sample_id, tokens=tokens,
        payload=None if payload is item.image else payload, captions=tokens.size // ctx, converted=converted,
    )


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


def process_chunk(items: list[Item]) -> list[Result]:
    return [_process_safely(item) for item in items]
