"""The training crop and flip of one sample, drawn from the sample's own seed.

Both backends take the crop box and the flip from the same draws: the PyTorch fallback
applies `transform.augment_pil` with `numpy.random.default_rng(seed)`, and the DALI
pipeline receives `crop_and_flip(width, height, seed)` as inputs, which makes the same
draws in the same order (the box of `transform.random_resized_box`, then the flip), so
nothing random runs inside DALI. A sample's augmentation is then a pure function of (its
seed, its image size): the same on both backends, on any number of threads or workers,
after a resume, and after a skipped record shifts the samples behind it into other batches.
"""

from __future__ import annotations

import numpy as np

from src.open_alip.transform import random_resized_box

__all__ = ["crop_and_flip"]


def crop_and_flip(width: int, height: int, seed: int) -> tuple[int, int, int, int, bool]:
    """(left, top, right, bottom, mirror) of the training crop of a width x height image."""
    rng = np.random.default_rng(seed)
    box = random_resized_box(width, height, rng)
    return (*box, bool(rng.random() < 0.5))
