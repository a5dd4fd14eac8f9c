"""RWKV-CLIP for CLIP_benchmark: a loader with the signature of its model loaders.

CLIP_benchmark (github LAION-AI/CLIP_benchmark) picks a loader by `--model_type` from the dict
`clip_benchmark.models.TYPE2FUNC` and calls it as
`load(model_name=..., pretrained=..., cache_dir=..., device=...)`, expecting
`(model, transform, tokenizer)`: a model with `encode_image` / `encode_text`, a transform from a
PIL image to a tensor, and a tokenizer from a list of texts to a token tensor. It has no plugin
registry; `clip_benchmark_eval.py` at the repository root adds this loader to that dict and
runs CLIP_benchmark's own command line.
"""

from __future__ import annotations

import os

import torch

from .errors import PretrainedError
from .factory import EvalTransform, Tokenizer, create_model_and_transforms, get_tokenizer
from .model import RWKV_CLIP
from .pretrained import is_hub_spec

MODEL_TYPE = "rwkv_clip"


def load_rwkv_clip(
    model_name: str = "RWKV_CLIP_B32",
    pretrained: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
) -> tuple[RWKV_CLIP, EvalTransform, Tokenizer]:
    """(model in float32 eval mode on `device`, the evaluation transform, the tokenizer).

    `model_name`: a shipped config, a JSON file, or hf-hub:ORG/REPO (its config and weights);
    `pretrained`: a released tag, a .pt/.safetensors file or hf-hub:ORG/REPO[/FILE] (required unless
    the model is a hub repo: a benchmark of random weights is a mistake); `cache_dir`:
    the hub cache to use instead of the default.
    """
    if (pretrained is None or str(pretrained).strip() == "") and not is_hub_spec(str(model_name)):
        raise PretrainedError(
            f"model {model_name}: no weights given; pass a .pt/.safetensors file or hf-hub:ORG/REPO[/FILE] "
            "as pretrained"
        )
    model, _, preprocess_val = create_model_and_transforms(
        model_name, pretrained=pretrained, device=device, precision="fp32", cache_dir=cache_dir
    )
    return model, preprocess_val, get_tokenizer(model_name, cache_dir=cache_dir)
