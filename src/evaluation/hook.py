"""train.py's epoch-end zero-shot evaluation (`--zeroshot-data SPEC --zeroshot-frequency N`).

Every rank calls the hook; the evaluation is spread over the ranks (each embeds its slice of the
prompts and images with the run's loader workers and per-GPU batch) and the predictions are
gathered, so no rank idles in a barrier while one decodes the whole dataset.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from src.evaluation.run import DatasetSpec, as_spec, evaluate_classification, load_classification_data
from src.evaluation.sharding import Shard
from src.open_alip.model import unwrap_model

DEFAULT_WORKERS = 4  # train.py's own default when neither --workers nor the config sets one
DEFAULT_BATCH = 64


def zero_shot_epoch_hook(
    dataset_spec: DatasetSpec | str | Path,
    frequency: int = 1,
    batch_size: int | None = None,
    workers: int | None = None,
    protocol: str = "standard",
) -> Callable:
    """An epoch-end hook for the training loop.

    Called as ``hook(model, epochs_done, args, env)`` on every rank (`env`: rank, world_size,
    device, distributed). Every `frequency` epochs all ranks evaluate their share; rank 0 returns
    ``{"zeroshot_top1": ..., "zeroshot_top5": ..., "zeroshot_mean_per_class_recall": ...}``
    (percent), the other ranks and the other epochs ``{}``. `batch_size` and `workers` default to
    the run's `args.batch_size` (its per-GPU batch: evaluation keeps no activations for a backward
    pass, so it fits) and `args.workers`.
    """
    spec = as_spec(dataset_spec)
    load_classification_data(spec)  # fail at start-up, not after the first epoch

    def hook(model: torch.nn.Module, epochs_done: int, args=None, env=None) -> dict:
        if epochs_done % frequency:
            return {}
        rank = getattr(env, "rank", 0)
        distributed = bool(getattr(env, "distributed", False))
        shard = Shard(rank, getattr(env, "world_size", 1)) if distributed else Shard()
        device = getattr(env, "device", None) or next(unwrap_model(model).parameters()).device
        input_size = int(unwrap_model(model).config["input_size"])
        batch = batch_size or getattr(args, "batch_size", None) or DEFAULT_BATCH
        loaders = workers if workers is not None else getattr(args, "workers", None)
        loaders = DEFAULT_WORKERS if loaders is None else loaders
        result = evaluate_classification(model, spec, input_size, device, batch, loaders, protocol=protocol,
                                         shard=shard)
        if rank != 0:
            return {}
        return {f"zeroshot_{k}": v for k, v in result["metrics"].items()}

    return hook
