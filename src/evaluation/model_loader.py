"""The one way the inference CLIs load a model: zero_shot.py, retrieval.py, embed.py,
clip_benchmark_eval.py (and the shell scripts, through the first two) and the demo.

Weights are a local .pt or .safetensors file (a raw state dict, DDP-saved, or a train.py
checkpoint) or `hf-hub:ORG/REPO[/FILE]`, all read by the model library's
`create_model_and_transforms` (src/open_alip/factory.py). The model comes back in float32 eval
mode (the original evaluation runs in plain fp32) with its WKV implementation resolved for the
device before anything is built, and the library's errors become this CLI's one-line errors.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from src.errors import UserError
from src.open_alip import create_model_and_transforms
from src.open_alip.errors import OpenAlipError


class ModelLoadError(UserError):
    """No weights where some are needed, or weights, config or WKV choice the model library refuses."""


def resolve_wkv_impl(name: str, device: torch.device | str) -> str:
    """The WKV implementation `name` (--wkv-impl: "auto" or one of the library's) means on `device`,
    checked before any work: an unknown name, or one that cannot run there, is the user's to fix."""
    from src.open_alip import wkv

    try:
        return wkv.resolve_wkv_impl(name, torch.device(device))
    except ValueError as exc:
        raise ModelLoadError(f"--wkv-impl {name}: {exc}") from None


def check_weights_given(weights: str | os.PathLike | None, random_init: bool) -> None:
    """Weights, or --random-init on purpose: exactly one."""
    if weights is None and not random_init:
        raise ModelLoadError(
            "no --model-weight given; pass the weights to use (a .pt or .safetensors file, or "
            "hf-hub:ORG/REPO[/FILE]), or --random-init for untrained weights on purpose"
        )
    if weights is not None and random_init:
        raise ModelLoadError("--random-init and --model-weight exclude each other; keep one")


def load_model_and_transform(
    config: str | os.PathLike,
    weights: str | os.PathLike | None,
    device: torch.device | str,
    wkv_impl: str | None = "auto",
    random_init: bool = False,
    cache_dir: str | os.PathLike | None = None,
):
    """(model in float32 eval mode on `device`, the evaluation transform from PIL images).
    `weights` None needs `random_init` (see `check_weights_given`)."""
    check_weights_given(weights, random_init)
    impl = resolve_wkv_impl(wkv_impl, device) if wkv_impl is not None else None
    try:
        model, _, preprocess_val = create_model_and_transforms(
            str(config), pretrained=None if weights is None else str(weights), device=device, precision="fp32",
            cache_dir=cache_dir, wkv_impl=impl,
        )
    except OpenAlipError as exc:  # the model library's errors are the user's to fix here
        raise ModelLoadError(str(exc)) from None
    return model, preprocess_val


def load_model(
    config: str | os.PathLike,
    weights: str | os.PathLike | None,
    device: torch.device | str,
    wkv_impl: str | None = "auto",
    random_init: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> torch.nn.Module:
    """`load_model_and_transform` without the transform."""
    return load_model_and_transform(config, weights, device, wkv_impl, random_init, cache_dir)[0]


def weights_label(weights: str | os.PathLike | None) -> str:
    """A short name for weights in tables: a file's stem, a hub repo's last part."""
    if weights is None:
        return "random init"
    text = str(weights).removeprefix("hf-hub:")
    return Path(text).stem or text
