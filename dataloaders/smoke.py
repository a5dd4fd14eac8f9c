"""Checks a few loader batches the way a training run would rely on them (used by dali.py).

Catching a wrong layout, normalisation or caption encoding here costs seconds;
finding it in a loss curve costs GPU hours.
"""

from __future__ import annotations

import os
import textwrap
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from src.fsutil import atomic_open
from src.open_alip.constants import CLIP_MEAN, CLIP_STD, CONTEXT_LENGTH, EOT_TOKEN, SOT_TOKEN, VOCAB_SIZE

__all__ = ["SmokeReport", "check_batch", "denormalize", "run_smoke", "save_grid"]

_MEAN = torch.tensor(CLIP_MEAN).view(3, 1, 1)
_STD = torch.tensor(CLIP_STD).view(3, 1, 1)
# Pixels in [0, 1] map to these per-channel bounds after CLIP normalisation (+ rounding slack).
_LOW = (-_MEAN / _STD).flatten() - 1e-3
_HIGH = ((1 - _MEAN) / _STD).flatten() + 1e-3


def check_batch(images: torch.Tensor, tokens: torch.Tensor, batch_size: int, input_size: int) -> list[str]:
    """Problems with one batch (empty list: the batch is what the trainer expects)."""
    problems = []
    b = images.shape[0] if images.ndim else 0
    if images.ndim != 4 or images.shape[1:] != (3, input_size, input_size) or not 0 < b <= batch_size:
        problems.append(
            f"images have shape {tuple(images.shape)}, expected [<= {batch_size}, 3, "
            f"{input_size}, {input_size}]"
        )
    if images.dtype != torch.float32:
        problems.append(f"images are {images.dtype}, expected torch.float32")
    if not problems:
        img = images.detach().float().cpu()
        if not torch.isfinite(img).all():
            problems.append("images contain NaN or infinite values")
        else:
            lo = img.amin(dim=(0, 2, 3))
            hi = img.amax(dim=(0, 2, 3))
            if (lo < _LOW).any() or (hi > _HIGH).any():
                problems.append(
                    f"image values per channel span {lo.tolist()}..{hi.tolist()}, outside the "
                    f"CLIP-normalised range {_LOW.tolist()}..{_HIGH.tolist()} (wrong mean/std or pixel "
                    "scale?)"
                )
    if tokens.dtype != torch.int64:
        problems.append(f"tokens are {tokens.dtype}, expected torch.int64")
    if tokens.ndim != 2 or tokens.shape != (b, CONTEXT_LENGTH):
        problems.append(f"tokens have shape {tuple(tokens.shape)}, expected [{b}, {CONTEXT_LENGTH}]")
        return problems
    tok = tokens.detach().cpu()
    if (tok < 0).any() or (tok >= VOCAB_SIZE).any():
        problems.append(f"token ids outside 0..{VOCAB_SIZE - 1}: min {int(tok.min())}, max {int(tok.max())}")
    no_start = int((tok[:, 0] != SOT_TOKEN).sum())
    if no_start:
        problems.append(f"{no_start} caption(s) do not begin with the start token {SOT_TOKEN}")
    is_end = tok == EOT_TOKEN
    no_end = int((~is_end.any(dim=1)).sum())
    if no_end:
        problems.append(f"{no_end} caption(s) have no end token {EOT_TOKEN}")
    else:
        end = is_end.int().argmax(dim=1, keepdim=True)
        after = torch.arange(CONTEXT_LENGTH).unsqueeze(0) > end
        if (tok[after] != 0).any():
            problems.append("caption(s) have non-zero tokens after the end token")
    return problems


def denormalize(images: torch.Tensor) -> np.ndarray:
    """CLIP-normalised [B, 3, S, S] -> uint8 [B, S, S, 3] for looking at."""
    img = images.detach().float().cpu() * _STD + _MEAN
    return (img.clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()


def save_grid(
    path: str | os.PathLike[str], images: torch.Tensor, captions: list[str], columns: int = 4
) -> None:
    """Write a PNG grid of de-normalised images with their captions, atomically."""
    from PIL import Image, ImageDraw

    from src.figures import caption_font

    pixels = denormalize(images)
    n = len(pixels)
    cell = max(pixels.shape[1], 160)  # small test inputs are scaled up to be visible
    text_h = 64
    rows = -(-n // columns)
    cols = min(columns, n)
    grid = Image.new("RGB", (cols * cell, rows * (cell + text_h)), "white")
    draw = ImageDraw.Draw(grid)
    font = caption_font()
    for i, (px, caption) in enumerate(zip(pixels, captions)):
        x, y = (i % columns) * cell, (i // columns) * (cell + text_h)
        grid.paste(Image.fromarray(px).resize((cell, cell), Image.NEAREST), (x, y))
        lines = textwrap.wrap(caption, width=max(10, cell // 7))[:4]
        draw.multiline_text((x + 3, y + cell + 2), "\n".join(lines), fill="black", font=font)
    with atomic_open(path, "wb") as f:
        grid.save(f, format="PNG")


@dataclass
class SmokeReport:
    batches: int = 0  # checked
    images: int = 0  # checked
    seconds: float = 0.0  # the timed stretch
    timed_images: int = 0
    problems: list[str] = field(default_factory=list)
    first_batch: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def images_per_second(self) -> float:
        return self.timed_images / self.seconds if self.seconds > 0 else float("nan")


def _batches(loader):
    """Batches without end, crossing epochs as a training run does."""
    while True:
        yield from loader


def _sync(images: torch.Tensor) -> None:
    if images.is_cuda:
        torch.cuda.synchronize(images.device)


def run_smoke(loader, steps: int, progress=None, time_steps: int | None = None) -> SmokeReport:
    """The first batch (it pays for start-up), then `time_steps` batches timed back to back,
    then `steps` batches checked (the first batch too).

    Only the loader is timed, and the way benchmarks/loader.py times it: nothing else runs
    between the batches of the timed stretch. The checks come after it, untimed, so their
    cost cannot slow the loader down, and an asynchronous loader (DALI decodes batches ahead)
    cannot get ahead while they run.
    """
    time_steps = steps if time_steps is None else time_steps
    report = SmokeReport()
    batches = _batches(loader)

    def check(images: torch.Tensor, tokens: torch.Tensor, read_now: bool = True) -> None:
        report.problems += [
            f"batch {report.batches}: {p}"
            for p in check_batch(images, tokens, loader.batch_size, loader.input_size)
        ]
        report.batches += 1
        report.images += images.shape[0]
        if progress is not None and read_now:  # the bar counts batches read: time_steps + steps in all
            progress.update(1)

    images, tokens = next(batches)
    _sync(images)
    report.first_batch = (images, tokens)
    if progress is not None:
        progress.update(1)
    if time_steps:
        start = time.perf_counter()
        for _ in range(time_steps):
            images, _ = next(batches)
            report.timed_images += images.shape[0]
        _sync(images)
        report.seconds = time.perf_counter() - start
        if progress is not None:
            progress.update(time_steps)
    check(*report.first_batch, read_now=False)
    for _ in range(steps - 1):
        check(*next(batches))
    return report
