"""The DALI CPU loader's torch resize against the PyTorch fallback's PIL resize."""

import numpy as np
import pytest
import torch
from PIL import Image

from dataloaders.resize import RESIZE_SHARE, CropResizer, resize_flip_normalize
from dataloaders.torch_loader import normalize_pixels
from src.open_alip.constants import CLIP_STD
from src.open_alip.transform import resize_box_pil

LEVEL = 1 / 255 / min(CLIP_STD)  # one grey level after normalisation


def _pil_batch(crops: list[np.ndarray], mirror: np.ndarray, size: int) -> torch.Tensor:
    """What the fallback (dataloaders/torch_loader.py) makes of each whole crop."""
    out = []
    for crop, flip in zip(crops, mirror.tolist()):
        img = resize_box_pil(Image.fromarray(crop), size, (0, 0, crop.shape[1], crop.shape[0]), bool(flip))
        out.append(normalize_pixels(img))
    return torch.stack(out)


@pytest.mark.parametrize("size", [32, 224])
def test_torch_resize_is_pils_within_one_grey_level_up_and_down(size):
    # Noise shows every pixel each filter reads: shrunk up to 9x, enlarged from 16 pixels, odd
    # aspect ratios, half of them flipped.
    rng = np.random.default_rng(0)
    sides = [
        (16, 20),
        (size, size),
        (size + 1, size - 1),
        (3 * size, 2 * size),
        (9 * size, 5 * size),
        (7, 9 * size),
    ]
    crops = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sides]
    mirror = np.array([0, 1, 0, 1, 1, 0], np.int32)
    ours = resize_flip_normalize(crops, mirror, size)
    assert ours.shape == (len(crops), 3, size, size) and ours.dtype == torch.float32 and ours.is_contiguous()
    diff = (ours - _pil_batch(crops, mirror, size)).abs()
    # PIL rounds to uint8 between its horizontal and vertical passes, torch does not.
    assert float(diff.max()) <= 1.001 * LEVEL
    assert float((diff > LEVEL / 2).float().mean()) < 0.05


def test_a_pool_of_resizing_threads_gives_the_calling_threads_pixels_and_leaves_its_thread_count():
    rng = np.random.default_rng(1)
    crops = [
        rng.integers(0, 256, (int(rng.integers(20, 90)), int(rng.integers(20, 90)), 3), dtype=np.uint8)
        for _ in range(11)
    ]
    mirror = rng.integers(0, 2, 11).astype(np.int32)
    before = torch.get_num_threads()
    alone = resize_flip_normalize(crops, mirror, 32)
    assert torch.get_num_threads() == before
    pool = CropResizer(3)
    try:
        for _ in range(2):  # the pool is made once and kept
            assert torch.equal(pool(crops, mirror, 32), alone)
            assert torch.get_num_threads() == before
        assert torch.equal(pool(crops[:1], mirror[:1], 32), alone[:1])
    finally:
        pool.close()
    # One resizing thread for every RESIZE_SHARE decoding threads; the caller's own below that.
    assert [CropResizer.beside(n).threads for n in (1, 2, RESIZE_SHARE, 4 * RESIZE_SHARE)] == [1, 1, 1, 4]
