"""The training crop and flip of an image, drawn from the sample's own seed, one or a batch at once.

A random resized crop: area share uniform in TRAIN_AREA and log-aspect uniform in
TRAIN_ASPECT, up to TRAIN_CROP_ATTEMPTS tries, then the largest centred crop within the
aspect range; then a flip with probability 1/2. Every user takes the box and the flip from
here: the DALI loader receives them as pipeline inputs (nothing random runs inside DALI),
the PyTorch loader and `transform.augment_pil` (the model's `preprocess_train`) apply them
with PIL. A sample's augmentation is thus a pure function of (its seed, its image size):
the same on both loader backends and in `preprocess_train`, on any number of threads or
worker processes, after a resume, and after a skipped record moves the samples behind it
into other batches.

The uniforms come from a counter-based hash of (seed, draw number), so a sample's draws do
not depend on the rest of its batch, and a batch is drawn with numpy in one go: a
`numpy.random.Generator` per sample cost about 33 us, more than reading the record, at
4,000+ records/s per GPU. `crop_and_flip` draws one sample with Python numbers, bit for bit
the same. This module imports numpy only (the loader's reader processes import it).
"""

from __future__ import annotations

import math

import numpy as np

from .constants import TRAIN_AREA, TRAIN_ASPECT, TRAIN_CROP_ATTEMPTS

__all__ = ["crop_and_flip", "crops_and_flips", "uniforms"]

# Attempts drawn together: nearly every sample's first attempt fits (a 0.7-1.0 area share at
# aspect 0.8-1.25 fits most photos), so later rounds only run for the few left.
_ROUND = 4
_FLIP_DRAW = 4 * TRAIN_CROP_ATTEMPTS  # draw number of the flip, after every attempt's four
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def uniforms(seeds: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) float64 of shape broadcast(seeds, draws): SplitMix64 of seed + (draw+1)*golden."""
    with np.errstate(over="ignore"):
        z = seeds.astype(np.uint64) + (draws.astype(np.uint64) + np.uint64(1)) * _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def crops_and_flips(
    widths: np.ndarray, heights: np.ndarray, seeds: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(boxes int64 [n, 4] as (left, top, right, bottom), mirror bool [n]) of n images."""
    widths = np.asarray(widths, np.int64)
    heights = np.asarray(heights, np.int64)
    seeds = np.asarray(seeds, np.int64)
    n = len(seeds)
    boxes = np.zeros((n, 4), np.int64)
    todo = np.arange(n)
    log_lo, log_hi = math.log(TRAIN_ASPECT[0]), math.log(TRAIN_ASPECT[1])
    for first in range(0, TRAIN_CROP_ATTEMPTS, _ROUND):
        if not len(todo):
            break
        attempts = np.arange(first, min(first + _ROUND, TRAIN_CROP_ATTEMPTS))
        draw = 4 * attempts[None, :]  # [1, a]
        s = seeds[todo, None]
        width, height = widths[todo, None], heights[todo, None]
        target = width * height * (TRAIN_AREA[0] + (TRAIN_AREA[1] - TRAIN_AREA[0]) * uniforms(s, draw))
        # math.exp, element by element: the scalar path below must give the same bits, and
        # numpy's vectorised exp may differ from the C library's in the last place.
        exponent = log_lo + (log_hi - log_lo) * uniforms(s, draw + 1)
        aspect = np.array([math.exp(e) for e in exponent.ravel().tolist()]).reshape(exponent.shape)
        w = np.round(np.sqrt(target * aspect)).astype(np.int64)
        h = np.round(np.sqrt(target / aspect)).astype(np.int64)
        fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
        found = fits.any(axis=1)
        pick = fits.argmax(axis=1)[found]  # the first attempt that fits
        rows = np.flatnonzero(found)
        w, h = w[rows, pick], h[rows, pick]
        x = np.floor(uniforms(s[rows, 0], draw[0, pick] + 2) * (width[rows, 0] - w + 1)).astype(np.int64)
        y = np.floor(uniforms(s[rows, 0], draw[0, pick] + 3) * (height[rows, 0] - h + 1)).astype(np.int64)
        boxes[todo[rows]] = np.stack([x, y, x + w, y + h], axis=1)
        todo = todo[~found]
    if len(todo):  # no attempt fitted (a very elongated image): the largest centred crop in range
        width, height = widths[todo], heights[todo]
        aspect = np.clip(width / height, *TRAIN_ASPECT)
        w = np.minimum(width, np.round(height * aspect).astype(np.int64))
        h = np.minimum(height, np.round(width / aspect).astype(np.int64))
        x, y = (width - w) // 2, (height - h) // 2
        boxes[todo] = np.stack([x, y, x + w, y + h], axis=1)
    mirror = uniforms(seeds, np.full(n, _FLIP_DRAW)) < 0.5
    return boxes, mirror


_MASK = (1 << 64) - 1


def _uniform(seed: int, draw: int) -> float:
    """`uniforms` for one (seed, draw), in Python integers (a numpy call per draw costs more)."""
    z = (seed + (draw + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return (z >> 11) * 2.0**-53


def crop_and_flip(width: int, height: int, seed: int) -> tuple[int, int, int, int, bool]:
    """(left, top, right, bottom, mirror) of one image, as `crops_and_flips` draws it in a batch."""
    seed &= _MASK
    log_lo, log_hi = math.log(TRAIN_ASPECT[0]), math.log(TRAIN_ASPECT[1])
    mirror = _uniform(seed, _FLIP_DRAW) < 0.5
    for attempt in range(TRAIN_CROP_ATTEMPTS):
        draw = 4 * attempt
        target = width * height * (TRAIN_AREA[0] + (TRAIN_AREA[1] - TRAIN_AREA[0]) * _uniform(seed, draw))
        aspect = math.exp(log_lo + (log_hi - log_lo) * _uniform(seed, draw + 1))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            x = math.floor(_uniform(seed, draw + 2) * (width - w + 1))
            y = math.floor(_uniform(seed, draw + 3) * (height - h + 1))
            return x, y, x + w, y + h, mirror
    aspect = min(max(width / height, TRAIN_ASPECT[0]), TRAIN_ASPECT[1])
    w = min(width, round(height * aspect))
    h = min(height, round(width / aspect))
    x, y = (width - w) // 2, (height - h) // 2
    return x, y, x + w, y + h, mirror
