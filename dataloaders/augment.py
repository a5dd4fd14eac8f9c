"""The training crop and flip of every sample, drawn from the sample's own seed.

Both backends take the crop box and the flip from here: the DALI pipeline receives them
as inputs (so nothing random runs inside DALI), the PyTorch fallback applies them with
PIL. A sample's augmentation is then a pure function of (its seed, its image size): the
same on both backends, on any number of threads or workers, after a resume, and after a
skipped record shifts the samples behind it into other batches.

The crop is the original's (its DALI `image_random_crop`): area 70-100% of the image,
aspect ratio log-uniform in [0.8, 1.25] (the ranges in src/open_alip/transform.py), up
to 100 attempts, else the largest centred crop within the aspect range.

Random numbers come from a counter-based generator (splitmix64 of seed and draw number),
vectorised over a batch: a numpy Generator per sample would cost more than the rest of
the sample's bookkeeping.
"""

from __future__ import annotations

import math

import numpy as np

from src.open_alip.transform import TRAIN_AREA, TRAIN_ASPECT

__all__ = ["CROP_ATTEMPTS", "crop_boxes", "uniforms"]

CROP_ATTEMPTS = 100  # the original's num_attempts
_FIRST_ROUND = 8  # attempts drawn for every sample; the rest only for samples none of these fitted
# Draw numbers: the attempts use 0 .. 2*CROP_ATTEMPTS-1, then these.
_DRAW_X, _DRAW_Y, _DRAW_FLIP = 2 * CROP_ATTEMPTS, 2 * CROP_ATTEMPTS + 1, 2 * CROP_ATTEMPTS + 2

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def uniforms(seeds: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """[n, len(draws)] floats in [0, 1): draw number `draws[j]` of the stream of `seeds[i]`."""
    with np.errstate(over="ignore"):
        base = _mix(np.asarray(seeds, dtype=np.int64).astype(np.uint64))
        bits = _mix(base[:, None] + np.asarray(draws, dtype=np.uint64)[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def _attempts(width: np.ndarray, height: np.ndarray, seeds: np.ndarray, first: int, count: int):
    k = np.arange(first, first + count)
    u = uniforms(seeds, np.concatenate([2 * k, 2 * k + 1]))
    area = (width * height)[:, None] * (TRAIN_AREA[0] + (TRAIN_AREA[1] - TRAIN_AREA[0]) * u[:, :count])
    log_lo, log_hi = math.log(TRAIN_ASPECT[0]), math.log(TRAIN_ASPECT[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * u[:, count:])
    w = np.rint(np.sqrt(area * aspect)).astype(np.int64)
    h = np.rint(np.sqrt(area / aspect)).astype(np.int64)
    fits = (w > 0) & (w <= width[:, None]) & (h > 0) & (h <= height[:, None])
    pick = fits.argmax(axis=1)
    rows = np.arange(len(seeds))
    return fits.any(axis=1), w[rows, pick], h[rows, pick]


def crop_boxes(widths, heights, seeds) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, w, h, flip) per sample: a crop box inside its image and whether to mirror it."""
    width = np.asarray(widths, dtype=np.int64)
    height = np.asarray(heights, dtype=np.int64)
    seeds = np.asarray(seeds, dtype=np.int64)
    n = len(seeds)
    w, h = np.zeros(n, np.int64), np.zeros(n, np.int64)
    found = np.zeros(n, bool)
    todo = np.arange(n)
    for first, count in ((0, _FIRST_ROUND), (_FIRST_ROUND, CROP_ATTEMPTS - _FIRST_ROUND)):
        if not len(todo):
            break
        ok, tw, th = _attempts(width[todo], height[todo], seeds[todo], first, count)
        hit = todo[ok]
        found[hit], w[hit], h[hit] = True, tw[ok], th[ok]
        todo = todo[~ok]
    if len(todo):  # no attempt fitted (a very elongated image): the largest centred crop in range
        aspect = np.clip(width[todo] / height[todo], TRAIN_ASPECT[0], TRAIN_ASPECT[1])
        w[todo] = np.minimum(width[todo], np.rint(height[todo] * aspect).astype(np.int64))
        h[todo] = np.minimum(height[todo], np.rint(width[todo] / aspect).astype(np.int64))
    u = uniforms(seeds, np.array([_DRAW_X, _DRAW_Y, _DRAW_FLIP]))
    x = np.where(found, np.floor(u[:, 0] * (width - w + 1)), (width - w) // 2).astype(np.int64)
    y = np.where(found, np.floor(u[:, 1] * (height - h + 1)), (height - h) // 2).astype(np.int64)
    return x, y, w, h, u[:, 2] < 0.5
