"""train.py's epoch-end zero-shot evaluation (`--zeroshot-data SPEC --zeroshot-frequency N`).

Every rank calls the hook; the evaluation is spread over the ranks (each embeds its slice of the
prompts and images with the run's loader workers and its per-process micro-batch) and the
predictions are gathered, so no rank idles in a barrier while one decodes the whole dataset.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch

from src.evaluation.run import evaluate_classification
from src.evaluation.sharding import Shard
from src.evaluation.specs import DatasetSpec, as_spec, load_classification_data
from src.open_alip.model import unwrap_model


# What the hook reads of the training run's TrainConfig (src/training/config.py) and BatchPlan
# (src/training/batching.py), named structurally: evaluation sits beside training, so it
# imports neither.
class RunSettings(Protocol):
    workers: int


class BatchSplit(Protocol):
    micro_batch: int


class RunPlace(Protocol):
    rank: int
    world_size: int
    device: torch.device
    distributed: bool


def zero_shot_epoch_hook(
    dataset_spec: DatasetSpec | str | Path, frequency: int = 1, protocol: str = "standard"
) -> Callable[..., dict]:
    """An epoch-end hook for the training loop (src/training/main.py's EpochEndHook).

    Called as ``hook(model, epochs_done, config, plan, env)`` on every rank. Every `frequency`
    epochs all ranks evaluate their share, with `config.workers` loader workers and batches of
    `plan.micro_batch` images: the micro-batch the run trains with on this process, also when
    --batch-size auto chose it (evaluation keeps no activations for a backward pass, so it fits).
    Rank 0 returns ``{"zeroshot_top1": ..., "zeroshot_top5": ..., "zeroshot_mean_per_class_recall": ...}``
    (percent), the other ranks and the other epochs ``{}``.
    """
    spec = as_spec(dataset_spec)
    load_classification_data(spec)  # fail at start-up, not after the first epoch

    def hook(
        model: torch.nn.Module, epochs_done: int, config: RunSettings, plan: BatchSplit, env: RunPlace
    ) -> dict:
        if epochs_done % frequency:
            return {}
        shard = Shard(env.rank, env.world_size) if env.distributed else Shard()
        input_size = int(unwrap_model(model).config["input_size"])
        result = evaluate_classification(
            model,
            spec,
            input_size,
            env.device,
            plan.micro_batch,
            config.workers,
            protocol=protocol,
            shard=shard,
        )
        if env.rank != 0:
            return {}
        return {f"zeroshot_{k}": v for k, v in result["metrics"].items()}

    return hook
