"""The DALI CPU pipeline's crops resized, flipped and normalised with torch, off DALI.

On the CPU DALI decodes each crop's window and stops there: its antialiased CPU resize cost
about 2.8 ms an image against 1.3 ms for PIL's, most of the pipeline (docs/loader.md), while
torch's bilinear antialiased resize of a uint8 image in channels-last layout is a vectorised
kernel several times faster than PIL's, with PIL's filter: within one grey level of PIL's crop
+ resize (the PyTorch fallback's transform). torch releases the GIL while it resamples, so
DALI's threads decode the next batches meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F

from dataloaders.torch_loader import PIXEL_MEAN, PIXEL_STD

# As the fallback normalises (torch_loader.normalize_pixels), for a batch.
_MEAN = torch.from_numpy(PIXEL_MEAN).view(1, 3, 1, 1)
_STD = torch.from_numpy(PIXEL_STD).view(1, 3, 1, 1)


def resize_crop(crop: np.ndarray, size: int) -> torch.Tensor:
    """An HWC uint8 crop resized to [3, size, size] uint8 (bilinear, antialiased when shrinking,
    as PIL's `resize(..., BILINEAR)`); a view of the HWC array's memory is what the kernel reads."""
    image = torch.from_numpy(crop).permute(2, 0, 1).unsqueeze(0)  # channels-last, no copy
    return F.interpolate(image, size=(size, size), mode="bilinear", antialias=True, align_corners=False)[0]


RESIZE_SHARE = 4  # DALI decoding threads per resizing thread: a resize costs about a quarter of a decode


class CropResizer:
    """Resizes, flips and normalises a batch of crops on `threads` threads: the calling one alone
    when 1, else a pool's (torch releases the GIL while it resamples)."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = max(1, threads)
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def beside(cls, decode_threads: int) -> CropResizer:
        """A resizer for DALI's `decode_threads`: one thread for every RESIZE_SHARE of them (a
        resize took 0.2-0.4 ms, a decode 1.0-1.3, each on one core)."""
        return cls(decode_threads // RESIZE_SHARE)

    def __call__(self, crops: Sequence[np.ndarray], mirror: np.ndarray, size: int) -> torch.Tensor:
        """float32 [n, 3, size, size]: each HWC uint8 crop resized to size x size, flipped
        left-right where `mirror` says so, and normalised with the CLIP mean and std."""
        batch = torch.empty((len(crops), 3, size, size), dtype=torch.uint8)

        def resize(rows: range) -> None:
            # One image is too little work to share: on 2 threads torch took twice the CPU time
            # for the same wall time (measured), time DALI's decoding threads need.
            torch.set_num_threads(1)
            for i in rows:
                resized = resize_crop(crops[i], size)
                batch[i] = resized.flip(-1) if mirror[i] else resized

        threads = torch.get_num_threads()
        try:
            if self.threads == 1 or len(crops) < 2:
                resize(range(len(crops)))
            else:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="crop-resize")
                step = -(-len(crops) // self.threads)
                list(
                    self._pool.map(
                        resize, [range(a, min(a + step, len(crops))) for a in range(0, len(crops), step)]
                    )
                )
        finally:
            torch.set_num_threads(threads)
        return batch.to(torch.float32).sub_(_MEAN).div_(_STD)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


def resize_flip_normalize(crops: Sequence[np.ndarray], mirror: np.ndarray, size: int) -> torch.Tensor:
    """CropResizer's work on the calling thread."""
    return CropResizer(1)(crops, mirror, size)
