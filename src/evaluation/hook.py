"""train.py's epoch-end zero-shot evaluation (`--zeroshot-data SPEC --zeroshot-frequency N`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from src.evaluation.run import DatasetSpec, as_spec, evaluate_classification, load_classification_data
from src.open_alip.model import unwrap_model


def zero_shot_epoch_hook(
    dataset_spec: DatasetSpec | str | Path, frequency: int = 1, batch_size: int = 64, workers: int = 0
) -> Callable:
    """An epoch-end hook for the training loop.

    Called as ``hook(model, epochs_done, args, env)``; on the master rank (``env.is_master``) every
    `frequency` epochs it returns ``{"zeroshot_top1": ..., "zeroshot_top5": ...,
    "zeroshot_mean_per_class_recall": ...}`` (percent), elsewhere ``{}``.
    """
    spec = as_spec(dataset_spec)
    load_classification_data(spec)  # fail at start-up, not after the first epoch

    def hook(model: torch.nn.Module, epochs_done: int, args=None, env=None) -> dict:
        if epochs_done % frequency or not getattr(env, "is_master", True):
            return {}
        device = getattr(env, "device", None) or next(unwrap_model(model).parameters()).device
        input_size = int(unwrap_model(model).config["input_size"])
        result = evaluate_classification(model, spec, input_size, device, batch_size, workers)
        return {f"zeroshot_{k}": v for k, v in result["metrics"].items()}

    return hook
