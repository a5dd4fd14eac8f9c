"""PNG figures drawn with PIL (no plotting library needed): a loss curve (train.py writes one beside
metrics.jsonl, the demo another), a grid of images captioned with predictions (the demo, dali.py
--save-grid) and a confusion matrix (zero_shot.py)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

from src.fsutil import atomic_open

GOOD = (20, 130, 40)
BAD = (200, 30, 30)
INK = (30, 30, 30)


def _font(size: int) -> ImageFont.ImageFont:
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has one fixed-size default font
        return ImageFont.load_default()


def caption_font() -> ImageFont.ImageFont:
    """The font of captions under pictures: at Pillow's default size (10 px) its spaces are about
    one pixel wide, and "a photo of a" reads "a photoofa"."""
    return _font(13)


def _save_png(img: Image.Image, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as f:
        img.save(f, format="PNG")
    return path


def read_loss_points(metrics_jsonl: Path, key: str = "loss") -> list[tuple[int, float]]:
    """(step, loss) from train.py's metrics.jsonl (rows of kind "train" that carry a loss): `key`
    "loss" is the loss of the logged step, "loss_avg" the mean since the line before (rows
    without one give their "loss")."""
    points = []
    for line in Path(metrics_jsonl).read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill; the rest of the file is still good
        if row.get("kind", "train") == "train" and "loss" in row and "step" in row:
            points.append((int(row["step"]), float(row.get(key, row["loss"]))))
    return sorted(points)


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = min((m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw), default=raw)
    start = math.ceil(lo / step) * step
    ticks = []
    value = start
    while value <= hi + 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def plot_loss_curve(
    points: Sequence[tuple[int, float]],
    path: Path | str,
    title: str = "training loss",
    reference: float | None = None,
    reference_label: str = "",
    size: tuple[int, int] = (720, 420),
) -> Path:
    """Line plot of loss against step; `reference` draws a dashed horizontal line (e.g. the loss
    of random guessing, ln(batch))."""
    if not points:
        raise ValueError("no loss values to plot")
    w, h = size
    left, right, top, bottom = 70, 20, 40, 50
    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    font, small = _font(16), _font(12)
    steps = [p[0] for p in points]
    losses = [p[1] for p in points]
    values = losses + ([reference] if reference is not None else [])
    y_lo, y_hi = min(0.0, min(values)), max(values) * 1.05
    x_lo, x_hi = min(steps), max(steps) if max(steps) > min(steps) else min(steps) + 1

    def to_xy(step: float, loss: float) -> tuple[float, float]:
        x = left + (step - x_lo) / (x_hi - x_lo) * (w - left - right)
        y = h - bottom - (loss - y_lo) / (y_hi - y_lo) * (h - top - bottom)
        return x, y

    for tick in _nice_ticks(y_lo, y_hi):
        _, y = to_xy(x_lo, tick)
        draw.line((left, y, w - right, y), fill=(225, 225, 225))
        draw.text((left - 8, y), f"{tick:g}", fill=INK, font=small, anchor="rm")
    for tick in _nice_ticks(x_lo, x_hi, 6):
        x, _ = to_xy(tick, y_lo)
        draw.line((x, h - bottom, x, h - bottom + 5), fill=INK)
        draw.text((x, h - bottom + 8), f"{tick:g}", fill=INK, font=small, anchor="mt")
    draw.rectangle((left, top, w - right, h - bottom), outline=INK)
    if reference is not None:
        _, y = to_xy(x_lo, reference)
        x = left
        while x < w - right:
            draw.line((x, y, min(x + 8, w - right), y), fill=BAD, width=1)
            x += 14
        draw.text((w - right - 4, y - 4), reference_label, fill=BAD, font=small, anchor="rb")
    draw.line([to_xy(s, v) for s, v in points], fill=(30, 80, 200), width=2)
    draw.text((w / 2, 12), title, fill=INK, font=font, anchor="mt")
    draw.text((w / 2, h - 18), "step", fill=INK, font=small, anchor="mt")
    return _save_png(img, Path(path))


def caption_grid(
    images: Sequence[Image.Image],
    captions: Sequence[Sequence[tuple[str, tuple[int, int, int]]]],
    path: Path | str,
    columns: int = 6,
    tile: int = 128,
    title: str = "",
) -> Path:
    """Images in a grid, each upscaled to `tile` px with coloured caption lines under it."""
    line_h = 15
    lines = max((len(c) for c in captions), default=0)
    cell_w, cell_h = tile + 80, tile + 8 + lines * line_h + 10
    rows = -(-len(images) // columns)
    head = 34 if title else 0
    img = Image.new("RGB", (columns * cell_w, head + rows * cell_h), "white")
    draw = ImageDraw.Draw(img)
    font = caption_font()
    if title:
        draw.text((img.width / 2, 10), title, fill=INK, font=_font(16), anchor="mt")
    for i, (picture, caption) in enumerate(zip(images, captions)):
        x = (i % columns) * cell_w
        y = head + (i // columns) * cell_h
        img.paste(
            picture.convert("RGB").resize((tile, tile), Image.NEAREST), (x + (cell_w - tile) // 2, y + 4)
        )
        for j, (text, colour) in enumerate(caption):
            draw.text((x + cell_w / 2, y + tile + 8 + j * line_h), text, fill=colour, font=font, anchor="mt")
    return _save_png(img, Path(path))


# The largest confusion matrix drawn: beyond it the class names cannot be read (the CSV holds any size).
CONFUSION_MAX_CLASSES = 60


def plot_confusion_matrix(
    matrix: Sequence[Sequence[int]],
    classnames: Sequence[str],
    path: Path | str,
    title: str = "confusion matrix",
) -> Path:
    """Rows: the true class, columns: the predicted one; each cell shaded by its share of its row
    (white 0, dark blue all), with its count written where the cells are large enough."""
    n = len(classnames)
    if not 0 < n <= CONFUSION_MAX_CLASSES or len(matrix) != n:
        raise ValueError(f"a confusion matrix of 1 to {CONFUSION_MAX_CLASSES} classes is drawn, not {n}")
    font, small = _font(16), caption_font()
    cell = max(14, min(48, 720 // n))
    names = [name if len(name) <= 24 else name[:23] + "…" for name in classnames]
    label_w = 12 + max(int(small.getlength(name)) for name in names)
    top, bottom = 40, label_w + 30
    width, height = label_w + n * cell + 20, top + n * cell + bottom
    img = Image.new("RGB", (max(width, 320), height), "white")
    draw = ImageDraw.Draw(img)
    for i, row in enumerate(matrix):
        total = max(1, sum(row))
        for j, count in enumerate(row):
            share = count / total
            shade = tuple(int(255 - share * (255 - c)) for c in (30, 80, 200))
            x, y = label_w + j * cell, top + i * cell
            draw.rectangle((x, y, x + cell, y + cell), fill=shade, outline=(225, 225, 225))
            if cell >= 24 and count:
                draw.text(
                    (x + cell / 2, y + cell / 2),
                    str(count),
                    fill="white" if share > 0.5 else INK,
                    font=small,
                    anchor="mm",
                )
        draw.text((label_w - 6, top + i * cell + cell / 2), names[i], fill=INK, font=small, anchor="rm")
    for j, name in enumerate(names):  # predicted classes, written downwards under their column
        label = Image.new("RGBA", (int(small.getlength(name)) + 4, 16), (255, 255, 255, 0))
        ImageDraw.Draw(label).text((0, 0), name, fill=INK, font=small)
        label = label.rotate(90, expand=True)
        img.paste(label, (int(label_w + j * cell + cell / 2 - label.width / 2), top + n * cell + 6), label)
    draw.text((img.width / 2, 12), title, fill=INK, font=font, anchor="mt")
    draw.text(
        (img.width / 2, height - 18), "predicted class (rows: true class)", fill=INK, font=small, anchor="mt"
    )
    return _save_png(img, Path(path))
