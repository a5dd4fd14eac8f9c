"""Image preprocessing of RWKV-CLIP: the evaluation transform and the training augmentation.

Evaluation (open_clip's eval transform, which the original evaluation uses): resize the
shorter side to the input size with bicubic interpolation, centre crop, CLIP mean/std.
`preprocess_pil` does it exactly on CPU, and the evaluation uses it on every device;
`preprocess_tensor` approximates it on a uint8 tensor on any device (antialiased bicubic,
rounded to uint8 as PIL rounds: within a few grey levels of PIL, which can change a
prediction, so results meant to be compared should come from `preprocess_pil`).

Training (the original's crop): a random crop covering 70-100% of the image area with an
aspect ratio in [0.8, 1.25], resized to the input size, flipped with probability 0.5.
The DALI pipeline (dataloaders/imagenet.py) and the PyTorch loader both use these ranges.

PIL and numpy are imported here, not by `src.open_alip` itself, so importing the
tokenizer stays light.
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from .constants import CLIP_MEAN, CLIP_STD
from .crops import crop_and_flip


def resized_size(width: int, height: int, size: int) -> tuple[int, int]:
    """(width, height) after torchvision's Resize(int): the shorter side becomes `size`,
    the longer one is truncated."""
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


def center_crop_offsets(width: int, height: int, size: int) -> tuple[int, int]:
    """(top, left) of a centred size x size crop, rounded as torchvision's CenterCrop."""
    return int(round((height - size) / 2.0)), int(round((width - size) / 2.0))


def normalize(chw_float01: torch.Tensor) -> torch.Tensor:
    mean = torch.tensor(CLIP_MEAN, dtype=chw_float01.dtype, device=chw_float01.device).view(-1, 1, 1)
    std = torch.tensor(CLIP_STD, dtype=chw_float01.dtype, device=chw_float01.device).view(-1, 1, 1)
    return (chw_float01 - mean) / std


def _to_chw_float(img: Image.Image) -> torch.Tensor:
    array = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1)
    return array.float() / 255.0


# --- the evaluation transform, step by step (open_clip's Compose lists the same steps) ----------


class ConvertRGB:
    def __call__(self, img: Image.Image) -> Image.Image:
        return img.convert("RGB")

    def __repr__(self) -> str:
        return "ConvertRGB()"


class ResizeShorterSide:
    """The shorter side to `size` (bicubic), as torchvision's Resize(int)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Image.Image) -> Image.Image:
        w, h = img.size
        nw, nh = resized_size(w, h, self.size)
        return img if (nw, nh) == (w, h) else img.resize((nw, nh), Image.BICUBIC)

    def __repr__(self) -> str:
        return f"ResizeShorterSide(size={self.size}, interpolation=bicubic)"


class CenterCrop:
    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Image.Image) -> Image.Image:
        top, left = center_crop_offsets(img.width, img.height, self.size)
        return img.crop((left, top, left + self.size, top + self.size))

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size})"


class ToTensor:
    """RGB image -> float32 [3, H, W] in [0, 1]."""

    def __call__(self, img: Image.Image) -> torch.Tensor:
        return _to_chw_float(img)

    def __repr__(self) -> str:
        return "ToTensor()"


class Normalize:
    """CLIP's mean and std per channel."""

    mean, std = CLIP_MEAN, CLIP_STD

    def __call__(self, chw_float01: torch.Tensor) -> torch.Tensor:
        return normalize(chw_float01)

    def __repr__(self) -> str:
        return f"Normalize(mean={self.mean}, std={self.std})"


def eval_steps(size: int) -> tuple:
    """The evaluation transform's steps, in order (what `preprocess_pil` applies)."""
    return ConvertRGB(), ResizeShorterSide(size), CenterCrop(size), ToTensor(), Normalize()


def preprocess_pil(img: Image.Image, size: int) -> torch.Tensor:
    """The evaluation transform of one PIL image: float32 [3, size, size]."""
    for step in eval_steps(size):
        img = step(img)
    return img


def preprocess_tensor(image: torch.Tensor, size: int) -> torch.Tensor:
    """The evaluation transform of a uint8 [3, H, W] tensor, on whatever device it lives on."""
    _, h, w = image.shape
    nw, nh = resized_size(w, h, size)
    x = image.unsqueeze(0).float()
    if (nw, nh) != (w, h):
        x = torch.nn.functional.interpolate(
            x, size=(nh, nw), mode="bicubic", align_corners=False, antialias=True
        )
        # PIL hands back uint8: round and clip so both paths see the same quantised pixels
        x = x.round().clamp(0, 255)
    top, left = center_crop_offsets(nw, nh, size)
    x = x[0, :, top : top + size, left : left + size]
    return normalize(x / 255.0)


def resize_box_pil(img: Image.Image, size: int, box: tuple[int, int, int, int], mirror: bool) -> Image.Image:
    """`box` (left, top, right, bottom) of `img` cut out, resized to size x size (bilinear), then
    flipped if `mirror`. Cut first: the resize sees the box's pixels only, as torchvision's
    RandomResizedCrop and the DALI loader (dataloaders/imagenet.py) do; `resize(box=...)` would
    also read pixels around the box."""
    img = img.crop(box).resize((size, size), Image.BILINEAR)
    return img.transpose(Image.FLIP_LEFT_RIGHT) if mirror else img


def augment_pil(img: Image.Image, size: int, seed: int) -> Image.Image:
    """The training augmentation of one RGB image (crops.py: random resized crop and flip), bilinear."""
    *box, mirror = crop_and_flip(img.width, img.height, seed)
    return resize_box_pil(img, size, tuple(box), mirror)
