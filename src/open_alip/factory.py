"""open_clip's entry points for RWKV-CLIP: the model with its transforms, and its tokenizer.

    from src.open_alip import create_model_and_transforms, get_tokenizer
    model, preprocess_train, preprocess_val = create_model_and_transforms(
        "RWKV_CLIP_B32", pretrained="hf-hub:ORG/REPO")               # or a .pt / .safetensors file
    tokenizer = get_tokenizer("RWKV_CLIP_B32")
    image = preprocess_val(Image.open("cat.jpg")).unsqueeze(0)         # [1, 3, 224, 224] float32
    image_emb = model.encode_image(image); text_emb = model.encode_text(tokenizer(["a cat"]))

`preprocess_val` is the evaluation preprocessing (transform.preprocess_pil, what zero_shot.py and
retrieval.py use); `preprocess_train` is the PyTorch loader's training augmentation
(transform.augment_pil, then the loader's normalisation). Both take PIL images.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from PIL import Image

from .constants import CLIP_MEAN, CLIP_STD, CONTEXT_LENGTH
from .errors import ModelConfigError, OpenAlipError
from .model import RWKV_CLIP, get_model_config
from .pretrained import load_weights, read_weights, resolve_pretrained
from .tokenizer import tokenize
from .transform import augment_pil, preprocess_pil

# open_clip's precision names. "amp*" keep float32 weights for the caller's autocast.
PRECISIONS: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "amp": torch.float32,
    "amp_bf16": torch.float32,
    "amp_bfloat16": torch.float32,
    "fp16": torch.float16,
    "pure_fp16": torch.float16,
    "bf16": torch.bfloat16,
    "pure_bf16": torch.bfloat16,
    "fp64": torch.float64,
}

# The PyTorch loader (dataloaders/torch_loader.py) normalises uint8 pixels with these float32
# constants; the same arithmetic here gives bit-identical tensors.
_MEAN_255 = np.asarray(CLIP_MEAN, np.float32) * 255
_STD_255 = np.asarray(CLIP_STD, np.float32) * 255


class EvalTransform:
    """PIL image -> float32 [3, S, S]: bicubic shorter-side resize, centre crop, CLIP normalisation."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Image.Image) -> torch.Tensor:
        return preprocess_pil(img, self.size)

    def __repr__(self) -> str:
        return f"EvalTransform(size={self.size})"


class TrainTransform:
    """PIL image -> float32 [3, S, S]: random resized crop (area 0.7-1, aspect 0.8-1.25), flip with
    p=0.5, CLIP normalisation: the PyTorch training loader's augmentation.

    Without `rng`, each call draws its numpy seed from torch's global generator, so
    `torch.manual_seed` and DataLoader's per-worker seeding make runs repeatable, as with
    torchvision's transforms.
    """

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Image.Image, rng: np.random.Generator | None = None) -> torch.Tensor:
        if rng is None:
            rng = np.random.default_rng(int(torch.randint(0, 2**63 - 1, (1,)).item()))
        img = augment_pil(img.convert("RGB"), self.size, rng)
        pixels = (np.asarray(img, dtype=np.float32) - _MEAN_255) / _STD_255
        return torch.from_numpy(pixels.transpose(2, 0, 1).copy())

    def __repr__(self) -> str:
        return f"TrainTransform(size={self.size})"


class Tokenizer:
    """list of str (or one str) -> int64 [N, context_length] CLIP BPE ids."""

    def __init__(self, context_length: int = CONTEXT_LENGTH) -> None:
        self.context_length = context_length

    def __call__(self, texts: str | Iterable[str], context_length: int | None = None) -> torch.Tensor:
        return tokenize(texts, context_length or self.context_length)

    def __repr__(self) -> str:
        return f"Tokenizer(context_length={self.context_length})"


def resolve_config(name_or_json: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """get_model_config with its errors as ModelConfigError (one line)."""
    try:
        return get_model_config(name_or_json, **overrides)
    except (FileNotFoundError, ValueError) as exc:
        raise ModelConfigError(" ".join(str(exc).split())) from None


def _device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cpu")
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise OpenAlipError(f"device {device!r} is not a torch device; use cpu, cuda, cuda:N or auto") from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise OpenAlipError(f"device {device!r}: torch {torch.__version__} sees no CUDA GPU; use cpu or auto")
    return target


def _dtype(precision: str | None) -> torch.dtype:
    if precision is None:
        return torch.float32
    if precision not in PRECISIONS:
        raise OpenAlipError(f"precision {precision!r} is unknown; use one of {', '.join(PRECISIONS)}")
    return PRECISIONS[precision]


def create_model_and_transforms(
    name_or_json: str | os.PathLike | Mapping[str, Any],
    pretrained: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    precision: str | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    wkv_impl: str | None = None,
    **overrides: Any,
) -> tuple[RWKV_CLIP, TrainTransform, EvalTransform]:
    """(model, preprocess_train, preprocess_val), as open_clip returns them.

    `name_or_json`: a shipped config (`list_models()`: RWKV_CLIP_B32, RWKV_CLIP_B16, RWKV_CLIP_tiny)
    or a JSON file; `overrides` replace config values. `pretrained`: None (random weights), a
    local .pt/.safetensors file, or hf-hub:ORG/REPO[/FILE] (see pretrained.py; `cache_dir`
    replaces the hub cache). `device`: None (cpu), "auto", or any torch device. `precision`: None
    or "fp32" (float32, as the evaluation runs), "fp16"/"bf16" (weights cast), "amp"/"amp_bf16"
    (float32 weights for an autocast region), "fp64". `wkv_impl`: see `RWKV_CLIP.set_wkv_impl`.
    The model comes back in eval mode. Problems raise `errors.OpenAlipError` subclasses.
    """
    label = "the given config" if isinstance(name_or_json, Mapping) else str(name_or_json)
    config = resolve_config(name_or_json, **overrides)
    dtype, target = _dtype(precision), _device(device)
    weights = None
    if pretrained is not None and str(pretrained) != "":
        # Fetched and read before the model is built, so a bad file or hub answer fails at once.
        weights = read_weights(resolve_pretrained(pretrained, cache_dir), str(pretrained))
    model = RWKV_CLIP(config)
    if wkv_impl is not None:
        try:
            model.set_wkv_impl(wkv_impl)
        except ValueError as exc:
            raise OpenAlipError(" ".join(str(exc).split())) from None
    if weights is not None:
        load_weights(model, weights, str(pretrained), model_name=label)
        del weights
    model = model.to(device=target, dtype=dtype).eval()
    size = config["input_size"]
    return model, TrainTransform(size), EvalTransform(size)


def get_tokenizer(name_or_json: str | os.PathLike | Mapping[str, Any] = "RWKV_CLIP_B32") -> Tokenizer:
    """The tokenizer of a model config: a callable from texts to int64 [N, ctx_len] ids."""
    return Tokenizer(resolve_config(name_or_json)["ctx_len"])
