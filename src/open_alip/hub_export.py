"""A hub-ready folder from trained weights: what `create_model_and_transforms("hf-hub:ORG/REPO")`
reads back.

    OUT/open_clip_config.json   {"model_cfg": the architecture, "preprocess_cfg": size, mean, std, ...}
    OUT/model.safetensors       the weights in the released layout (float32; the decays as trained)
    OUT/README.md               a model card: the config, the training settings, the evaluation results

open_clip names its config file and keys the same way, so the folder reads like one of its repos.
Serve it with `rwkv-clip-hub-server --root OUT --repo-id ORG/REPO --repo-type model`, or upload
it. The folder appears whole or not at all (written under a temporary name, then renamed).

Its command line is export_cli.py.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .constants import CLIP_MEAN, CLIP_STD
from .errors import ModelConfigError, PretrainedError
from .model import (
    CheckpointMismatchError,
    check_fits,
    checkpoint_state_dict,
    config_in_checkpoint,
    config_name,
    get_model_config,
)
from .pretrained import HUB_CONFIG, mismatch_error, read_weights, resolve_pretrained

WEIGHTS_FILE = "model.safetensors"
CARD_FILE = "README.md"
# Training settings worth a line of the card, in this order (a train.py checkpoint's "run").
_CARD_SETTINGS = (
    "config",
    "recipe",
    "train_data",
    "epochs",
    "batch_size",
    "lr",
    "wd",
    "warmup",
    "lr_scheduler",
    "precision",
    "text_decay_dtype",
    "seed",
)


def hub_config(config: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "model_cfg": dict(config),
        "preprocess_cfg": {
            "image_size": config["input_size"],
            "mean": list(CLIP_MEAN),
            "std": list(CLIP_STD),
            "interpolation": "bicubic",
            "resize_mode": "shortest",
        },
    }


def _flat(values: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, number or string) for every leaf of a JSON value."""
    if isinstance(values, Mapping):
        return [row for k, v in values.items() for row in _flat(v, f"{prefix}{k}.")]
    if isinstance(values, list) and len(values) > 8:
        return [(prefix[:-1], f"[{len(values)} values]")]
    return [(prefix[:-1], values)]


def model_card(
    title: str, config: Mapping[str, Any], checkpoint: Mapping[str, Any], results: Mapping[str, Any]
) -> str:
    name = config_name(config) or "a custom config (open_clip_config.json)"
    lines = [
        "---",
        "tags:",
        "- rwkv-clip",
        "- clip",
        "- zero-shot-image-classification",
        "---",
        "",
        f"# {title}",
        "",
        f"RWKV-CLIP, architecture {name}: input {config['input_size']} px, image tower "
        f"{config['image_depth']} blocks x {config['image_embed_dims']}, text tower {config['n_layer']} "
        f"blocks x {config['n_embd']}, context {config['ctx_len']} tokens.",
        "",
        "```python",
        "from open_alip import create_model_and_transforms, get_tokenizer",
        'model, _, preprocess = create_model_and_transforms("hf-hub:ORG/REPO")',
        'tokenizer = get_tokenizer("hf-hub:ORG/REPO")',
        "```",
        "",
    ]
    run = checkpoint.get("run")
    if isinstance(run, Mapping):
        lines += ["## Training", "", "| setting | value |", "| --- | --- |"]
        lines += [f"| {k} | {json.dumps(run[k])} |" for k in _CARD_SETTINGS if k in run]
        lines += [
            f"| {k} | {json.dumps(checkpoint[k])} |"
            for k in ("step", "epoch", "world_size")
            if k in checkpoint
        ]
        lines.append("")
    if results:
        lines += ["## Evaluation", "", "| result | value |", "| --- | --- |"]
        lines += [f"| {k} | {v if isinstance(v, str) else json.dumps(v)} |" for k, v in _flat(results)]
        lines.append("")
    return "\n".join(lines)


def export_for_hub(
    weights: str | os.PathLike,
    output: str | os.PathLike,
    config: str | os.PathLike | Mapping[str, Any] | None = None,
    results: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> Path:
    """Write the folder `output` (which must not exist) from `weights` (a train.py checkpoint, a
    state dict, .safetensors, or anything `pretrained=` takes); `config` defaults to the one the
    checkpoint records; `results` ({name: JSON}) go into the card."""
    from safetensors.torch import save_file

    out = Path(output)
    if out.exists():
        raise PretrainedError(f"output {out} already exists; pass a new folder")
    if not out.parent.is_dir():
        raise PretrainedError(f"output {out}: its parent folder does not exist")
    raw = read_weights(resolve_pretrained(weights), str(weights))
    stored = config_in_checkpoint(raw)
    if config is None and stored is None:
        raise ModelConfigError(f"weights {weights} record no model config; pass --config NAME or a JSON file")
    try:
        cfg = get_model_config(config if config is not None else stored)
    except (FileNotFoundError, ValueError) as exc:
        raise ModelConfigError(" ".join(str(exc).split())) from None
    try:
        check_fits(cfg, raw, f"weights {weights}")
    except CheckpointMismatchError as exc:
        raise mismatch_error(exc, raw, str(weights), str(config or "the recorded config")) from None
    state = {k: v.contiguous() for k, v in checkpoint_state_dict(raw, str(weights)).items()}
    checkpoint = raw if isinstance(raw, Mapping) else {}
    tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        save_file(state, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / HUB_CONFIG).write_text(json.dumps(hub_config(cfg), indent=2) + "\n")
        card = model_card(title or out.name, cfg, checkpoint, results or {})
        (tmp / CARD_FILE).write_text(card)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
