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

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from .constants import CLIP_MEAN, CLIP_STD, CONTEXT_LENGTH, TRAIN_AREA, TRAIN_ASPECT
from .errors import ModelConfigError, OpenAlipError, PretrainedError, WeightsNotFoundError
from .model import (
    RWKV_CLIP,
    CheckpointMismatchError,
    check_fits,
    config_in_checkpoint,
    config_name,
    get_model_config,
    list_models,
    shipped_configs_that_fit,
)
from .pretrained import (
    HF_HUB_PREFIX,
    HUB_CONFIG,
    download_from_hub,
    is_hub_spec,
    load_weights,
    mismatch_error,
    parse_hub_spec,
    read_weights,
    resolve_pretrained,
    resolve_released,
)
from .released import get_pretrained_cfg, is_pretrained_tag
from .tokenizer import tokenize
from .transform import ConvertRGB, augment_pil, eval_steps

LOG = logging.getLogger(__name__.rpartition(".")[0])  # "open_alip" (or "src.open_alip" in the repository)

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
    """PIL image -> float32 [3, S, S]: bicubic shorter-side resize, centre crop, CLIP normalisation.
    `transforms` lists the steps in order, as open_clip's Compose does."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.transforms = eval_steps(size)

    def __call__(self, img: Image.Image) -> torch.Tensor:
        for step in self.transforms:
            img = step(img)
        return img

    def __repr__(self) -> str:
        return f"EvalTransform(size={self.size})"


class RandomResizedCropFlip:
    """The training crop (area share TRAIN_AREA, aspect TRAIN_ASPECT) resized bilinearly to
    size x size, then a flip with p=0.5, all drawn from `seed` (crops.py)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __call__(self, img: Image.Image, seed: int) -> Image.Image:
        return augment_pil(img, self.size, seed)

    def __repr__(self) -> str:
        return (
            f"RandomResizedCropFlip(size={self.size}, scale={TRAIN_AREA}, ratio={TRAIN_ASPECT}, flip_p=0.5, "
            "interpolation=bilinear)"
        )


class NormalizedTensor:
    """RGB image -> float32 [3, H, W] normalised with CLIP's mean and std, in the PyTorch loader's
    arithmetic on uint8 pixels (dataloaders/torch_loader.py), so both give bit-identical tensors."""

    mean, std = CLIP_MEAN, CLIP_STD

    def __call__(self, img: Image.Image) -> torch.Tensor:
        pixels = (np.asarray(img, dtype=np.float32) - _MEAN_255) / _STD_255
        return torch.from_numpy(pixels.transpose(2, 0, 1).copy())

    def __repr__(self) -> str:
        return f"NormalizedTensor(mean={self.mean}, std={self.std})"


class TrainTransform:
    """PIL image -> float32 [3, S, S]: random resized crop (area 0.7-1, aspect 0.8-1.25), flip with
    p=0.5, CLIP normalisation: the PyTorch training loader's augmentation. `transforms` lists the
    steps in order.

    `seed` gives the crop and flip the training loaders give a sample with that augmentation
    seed. Without it, each call draws its seed from `rng`, else from torch's global generator,
    so `torch.manual_seed` and DataLoader's per-worker seeding make runs repeatable, as with
    torchvision's transforms.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.transforms = (ConvertRGB(), RandomResizedCropFlip(size), NormalizedTensor())

    def __call__(
        self, img: Image.Image, rng: np.random.Generator | None = None, seed: int | None = None
    ) -> torch.Tensor:
        if seed is None:
            seed = (
                int(rng.integers(0, 2**63 - 1))
                if rng is not None
                else int(torch.randint(0, 2**63 - 1, (1,)).item())
            )
        rgb, crop, to_tensor = self.transforms
        return to_tensor(crop(rgb(img), seed))

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
    except ModelConfigError:
        raise
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
        raise OpenAlipError(
            f"device {device!r} is not a torch device; use cpu, cuda, cuda:N or auto"
        ) from None
    if target.type == "cuda" and not torch.cuda.is_available():
        raise OpenAlipError(f"device {device!r}: torch {torch.__version__} sees no CUDA GPU; use cpu or auto")
    return target


def _dtype(precision: str | None) -> torch.dtype:
    if precision is None:
        return torch.float32
    if precision not in PRECISIONS:
        raise OpenAlipError(f"precision {precision!r} is unknown; use one of {', '.join(PRECISIONS)}")
    return PRECISIONS[precision]


def _hub_config(spec: str, cache_dir: str | os.PathLike | None) -> tuple[str, Path]:
    """(hf-hub:ORG/REPO, the local copy of its config file) for a model named hf-hub:ORG/REPO."""
    repo_id, filename = parse_hub_spec(spec)
    if filename is not None:
        raise ModelConfigError(
            f"model {spec}: name the repo only (hf-hub:ORG/REPO); a weights file goes in pretrained="
        )
    try:
        return f"{HF_HUB_PREFIX}{repo_id}", download_from_hub(
            f"{HF_HUB_PREFIX}{repo_id}/{HUB_CONFIG}", cache_dir
        )
    except WeightsNotFoundError:
        raise ModelConfigError(
            f"model {spec}: the repo has no {HUB_CONFIG}; pass a config name (list_models()) as the model "
            f"and pretrained={spec}"
        ) from None


def _is_tag(name_or_json: Any, pretrained: str | os.PathLike) -> bool:
    """A released tag rather than a file: open_clip's order, a tag first (a file of that name then
    needs ./ before it)."""
    text = str(pretrained)
    return (
        isinstance(name_or_json, str)
        and not is_hub_spec(text)
        and "/" not in text
        and is_pretrained_tag(text)
    )


def _hub_repo_config(
    pretrained: str | os.PathLike | None, cache_dir: str | os.PathLike | None
) -> Path | None:
    """The config file of the hub repo `pretrained` names (hf-hub:ORG/REPO or ORG/REPO/FILE), if it
    has one."""
    if pretrained is None or not is_hub_spec(str(pretrained)):
        return None
    repo_id, _ = parse_hub_spec(str(pretrained))
    try:
        return download_from_hub(f"{HF_HUB_PREFIX}{repo_id}/{HUB_CONFIG}", cache_dir)
    except WeightsNotFoundError:
        return None


def _config_of_weights(
    weights: Mapping[str, Any], label: str, pretrained: str | os.PathLike, cache_dir: str | os.PathLike | None
) -> tuple[Any, str]:
    """(the config for weights given without one, how it was found): the config they record
    (train.py checkpoints), else their hub repo's open_clip_config.json, else the one shipped config
    their shapes fit."""
    stored = config_in_checkpoint(weights)
    if stored is not None:
        return stored, f"{config_name(stored) or 'a custom config'}, recorded in the weights"
    repo_config = _hub_repo_config(pretrained, cache_dir)
    if repo_config is not None:
        return repo_config, f"the config of {HF_HUB_PREFIX}{parse_hub_spec(str(pretrained))[0]}"
    fitting = shipped_configs_that_fit(weights)
    if len(fitting) == 1:
        return fitting[0], f"{fitting[0]}, the one shipped config the weights fit"
    found = f"they fit {' and '.join(fitting)}" if fitting else "they fit no shipped config"
    raise ModelConfigError(
        f"no model config given and weights {label} record none ({found}); pass a config name "
        f"({', '.join(list_models())}) or a JSON file"
    )


def load_config_and_weights(
    name_or_json: str | os.PathLike | Mapping[str, Any] | None,
    pretrained: str | os.PathLike | None,
    cache_dir: str | os.PathLike | None = None,
    **overrides: Any,
) -> tuple[dict[str, Any], Mapping[str, Any] | None, str]:
    """(the resolved config, the weights read or None, the model's label), checked to fit each
    other before any model is built.

    The config is `name_or_json`; for hf-hub:ORG/REPO the repo's open_clip_config.json (and its
    weights unless `pretrained` names others); for None, the one the weights record (train.py
    checkpoints; params.json beside them is also accepted as `name_or_json`), else the config of
    the hub repo they come from, else the one shipped config their shapes fit.
    """
    model_label = "the given config" if isinstance(name_or_json, Mapping) else str(name_or_json)
    if isinstance(name_or_json, str) and is_hub_spec(name_or_json):
        repo_spec, name_or_json = _hub_config(name_or_json, cache_dir)
        model_label = repo_spec
        if pretrained is None or str(pretrained) == "":
            pretrained = repo_spec
    weights, label = None, None
    if pretrained is not None and str(pretrained) != "":
        label = str(pretrained)
        if _is_tag(name_or_json, pretrained):
            entry = get_pretrained_cfg(str(name_or_json), str(pretrained))
            path = resolve_released(entry, cache_dir)
            label = f"{entry.config}:{entry.tag} ({entry.hub_spec})"
        else:
            path = resolve_pretrained(pretrained, cache_dir)
        # Fetched and read before the model is built, so a bad file or hub answer fails at once.
        weights = read_weights(path, label)
    if name_or_json is None:
        if weights is None:
            raise ModelConfigError(
                "no model config given and no weights were given; pass a config name "
                f"({', '.join(list_models())}) or a JSON file"
            )
        found, model_label = _config_of_weights(weights, label, pretrained, cache_dir)
        config = resolve_config(found, **overrides)
    else:
        config = resolve_config(name_or_json, **overrides)
    if weights is not None:
        try:
            check_fits(config, weights, f"weights {label}")
        except CheckpointMismatchError as exc:
            raise mismatch_error(exc, weights, label, model_label) from None
    return config, weights, model_label


def create_model_and_transforms(
    model_name: str | os.PathLike | Mapping[str, Any] | None = None,
    pretrained: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    precision: str | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    wkv_impl: str | None = None,
    output_dict: bool = False,
    random_init_warning: bool = True,
    **overrides: Any,
) -> tuple[RWKV_CLIP, TrainTransform, EvalTransform]:
    """(model, preprocess_train, preprocess_val), as open_clip returns them.

    `model_name`: a shipped config (`list_models()`), a JSON file (a config, train.py's
    params.json, or an open_clip_config.json), hf-hub:ORG/REPO (a repo with an open_clip_config.json,
    as `export_hub.py` writes it), or None (the config the weights record, as train.py checkpoints do,
    else their hub repo's, else the one shipped config they fit: `load_config_and_weights`);
    `overrides` replace config values. `pretrained`: None (random weights, or the repo's for a hub
    model), a released tag (`list_pretrained()`: "yfcc15m" for RWKV_CLIP_B32), a local
    .pt/.safetensors file, or hf-hub:ORG/REPO[/FILE] (see pretrained.py; `cache_dir` replaces the hub
    cache). `device`: None (where the model is built: the CPU, or a `with torch.device(...)` block's),
    "auto", or any torch device. `precision`: None or "fp32" (float32,
    as the evaluation runs), "fp16"/"bf16" (weights cast), "amp"/"amp_bf16" (float32 weights for an
    autocast region), "fp64". `wkv_impl`: see `RWKV_CLIP.set_wkv_impl`; `output_dict`: see RWKV_CLIP.
    The model comes back in eval mode, with `model.config_source` naming its config and how it was
    found. Random weights (no `pretrained`) are logged as a warning, as open_clip does, unless
    `random_init_warning=False` (a trainer that starts from scratch on purpose). Problems raise
    `errors.OpenAlipError` subclasses.
    """
    config, weights, model_label = load_config_and_weights(model_name, pretrained, cache_dir, **overrides)
    dtype, target = _dtype(precision), _device(device)
    if weights is None and random_init_warning:
        LOG.warning("no pretrained weights loaded for model %s: it is randomly initialised", model_label)
    model = RWKV_CLIP(config, output_dict=output_dict)
    model.config_source = model_label
    if wkv_impl is not None:
        try:
            model.set_wkv_impl(wkv_impl)
        except ValueError as exc:  # still a ValueError for callers, as set_wkv_impl raises it
            raise ModelConfigError(" ".join(str(exc).split()), key="wkv_impl") from None
    if weights is not None:
        load_weights(model, weights, str(pretrained or model_name), model_name=model_label)
        del weights
    # Moved only when asked: built under `with torch.device(...)` (meta, say), a model stays there.
    if device is not None or precision is not None:
        model = model.to(device=target, dtype=dtype)
    model = model.eval()
    size = config["input_size"]
    return model, TrainTransform(size), EvalTransform(size)


def create_model(
    model_name: str | os.PathLike | Mapping[str, Any] | None = None,
    pretrained: str | os.PathLike | None = None,
    precision: str | None = None,
    device: str | torch.device | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    wkv_impl: str | None = "auto",
    output_dict: bool = False,
    **overrides: Any,
) -> RWKV_CLIP:
    """open_clip's `create_model(model_name, pretrained, precision, device)`: the model alone, in
    train mode as open_clip returns it (call `.eval()` before inference). The arguments are
    create_model_and_transforms'."""
    model, _, _ = create_model_and_transforms(
        model_name,
        pretrained,
        device,
        precision,
        cache_dir=cache_dir,
        wkv_impl=wkv_impl,
        output_dict=output_dict,
        **overrides,
    )
    return model.train()


def create_model_from_pretrained(
    model_name: str | os.PathLike | Mapping[str, Any] | None = None,
    pretrained: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    precision: str | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    return_transform: bool = True,
    **kwargs: Any,
) -> RWKV_CLIP | tuple[RWKV_CLIP, EvalTransform]:
    """open_clip's (model, preprocess) with trained weights: `pretrained` is required unless
    `model_name` is hf-hub:ORG/REPO; the arguments are create_model_and_transforms'."""
    hub_model = isinstance(model_name, str) and is_hub_spec(model_name)
    if not hub_model and (pretrained is None or str(pretrained) == ""):
        raise PretrainedError(
            f"model {model_name}: no weights given; pass pretrained= a released tag (list_pretrained()), "
            "a .pt/.safetensors file or hf-hub:ORG/REPO[/FILE]"
        )
    model, _, preprocess_val = create_model_and_transforms(
        model_name, pretrained, device, precision, cache_dir=cache_dir, **kwargs
    )
    return (model, preprocess_val) if return_transform else model


def get_tokenizer(
    model_name: str | os.PathLike | Mapping[str, Any] = "RWKV_CLIP_B32",
    context_length: int | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
) -> Tokenizer:
    """The tokenizer of a model config (or of hf-hub:ORG/REPO's config): a callable from texts to
    int64 [N, context_length] ids; `context_length` defaults to the config's ctx_len, as in open_clip."""
    if isinstance(model_name, str) and is_hub_spec(model_name):
        model_name = _hub_config(model_name, cache_dir)[1]
    if context_length is not None and (not isinstance(context_length, int) or context_length < 2):
        raise OpenAlipError(f"context_length {context_length!r}: give a whole number of tokens, at least 2")
    return Tokenizer(context_length or resolve_config(model_name)["ctx_len"])
