"""The one way the inference CLIs load a model: zero_shot.py, retrieval.py, embed.py,
clip_benchmark_eval.py (and the shell scripts, through the first two) and the demo.

Weights are a local .pt or .safetensors file (a raw state dict, DDP-saved, or a train.py
checkpoint) or `hf-hub:ORG/REPO[/FILE]`, all read by the model library's
`create_model_and_transforms` (src/open_alip/factory.py). The config is the one the weights
record (train.py checkpoints), else their hub repo's, else the one shipped config their shapes fit;
--model-name overrides it, and RWKV_CLIP_B32 is the config of --random-init without one. The model
comes back in float32 eval mode (the original evaluation runs in plain fp32) with its WKV
implementation resolved for the device before anything is built, and the library's errors become
this CLI's one-line errors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from src.errors import UserError
from src.open_alip.errors import OpenAlipError, WeightsMismatchError

if TYPE_CHECKING:  # torch is imported where a model is loaded: the CLIs' --help reads this module
    import torch

# The config of --random-init when no --model-name is given (the paper's model).
RANDOM_INIT_CONFIG = "RWKV_CLIP_B32"
MODEL_NAME_HELP = (
    "model config: a shipped name (RWKV_CLIP_B32, RWKV_CLIP_B16, RWKV_CLIP_tiny, RWKV_CLIP_demo) or a JSON "
    "file (default: the config the weights record, as train.py checkpoints and hub repos do, else the one "
    f"shipped config their shapes fit; {RANDOM_INIT_CONFIG} with --random-init); given, it overrides theirs"
)


class ModelLoadError(UserError):
    """No weights where some are needed, or weights, config or WKV choice the model library refuses."""


def resolve_wkv_impl(name: str, device: torch.device | str) -> str:
    """The WKV implementation `name` (--wkv-impl: "auto" or one of the library's) means on `device`,
    checked before any work: an unknown name, or one that cannot run there, is the user's to fix."""
    import torch

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


def _mismatch(
    exc: WeightsMismatchError, config: str | os.PathLike, weights: str | os.PathLike
) -> ModelLoadError:
    """The library's mismatch as advice about this command's flags."""
    if exc.recorded and exc.fits:
        hint = f"they record their own config, {exc.fits}: leave out --model-name"
    elif exc.recorded:
        hint = "they record their own config: leave out --model-name"
    elif exc.fits:
        hint = f"they fit {exc.fits}: leave out --model-name, or pass --model-name {exc.fits}"
    else:
        hint = "pass the --model-name (a name or JSON file) they were trained with"
    return ModelLoadError(
        f"--model-weight {weights} does not fit --model-name {config} ({exc.summary}); {hint}"
    )


def load_model_and_transform(
    config: str | os.PathLike | None,
    weights: str | os.PathLike | None,
    device: torch.device | str,
    wkv_impl: str | None = "auto",
    random_init: bool = False,
    cache_dir: str | os.PathLike | None = None,
):
    """(model in float32 eval mode on `device`, the evaluation transform from PIL images).
    `weights` None needs `random_init` (see `check_weights_given`); `config` None: the config the
    weights record (see the module doc). `model.config_source` says which config was used."""
    from src.open_alip import create_model_and_transforms

    check_weights_given(weights, random_init)
    impl = resolve_wkv_impl(wkv_impl, device) if wkv_impl is not None else None
    if config is None and weights is None:
        config = RANDOM_INIT_CONFIG
    try:
        model, _, preprocess_val = create_model_and_transforms(
            None if config is None else str(config),
            pretrained=None if weights is None else str(weights),
            device=device,
            precision="fp32",
            cache_dir=cache_dir,
            wkv_impl=impl,
            random_init_warning=False,
        )
    except WeightsMismatchError as exc:
        if config is None:
            raise ModelLoadError(str(exc)) from None
        raise _mismatch(exc, config, weights) from None
    except OpenAlipError as exc:  # the model library's errors are the user's to fix here
        raise ModelLoadError(str(exc)) from None
    return model, preprocess_val


def load_model(
    config: str | os.PathLike | None,
    weights: str | os.PathLike | None,
    device: torch.device | str,
    wkv_impl: str | None = "auto",
    random_init: bool = False,
    cache_dir: str | os.PathLike | None = None,
) -> torch.nn.Module:
    """`load_model_and_transform` without the transform."""
    return load_model_and_transform(config, weights, device, wkv_impl, random_init, cache_dir)[0]


def model_label(config: str | os.PathLike | None, model) -> str:
    """The config's name for result files: as given, else the shipped name the model's config has."""
    from src.open_alip.model import config_name

    if config is not None:
        return str(config)
    return config_name(model.config) or "a custom config (the weights')"


def weights_label(weights: str | os.PathLike | None) -> str:
    """A short name for weights in tables: a file's stem, a hub repo's last part."""
    if weights is None:
        return "random init"
    text = str(weights).removeprefix("hf-hub:")
    return Path(text).stem or text
