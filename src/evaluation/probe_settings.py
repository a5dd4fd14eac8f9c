"""The linear probe's settings and their defaults (linear_probe.py's flags), torch-free so that
`--help` answers at once. Which default is the paper's, CLIP's, CLIP_benchmark's or ours:
docs/evaluation.md, "Linear probe"."""

from __future__ import annotations

from dataclasses import dataclass

# The paper's linear-probe table: its zero-shot datasets without ImageNet, in that table's order.
LINEAR_PROBE_DATASETS = (
    "cifar10",
    "cifar100",
    "food101",
    "pets",
    "flowers",
    "sun397",
    "stanford_car",
    "dtd",
    "caltech101",
    "aircraft",
)
PROTOCOLS = ("paper", "clip_benchmark")
VAL_FRACTION = 0.2  # ours: the share of train held out where a dataset has no validation split
SEED = 0  # ours for the held-out draw; CLIP_benchmark's --seed default
MAX_ITER = 1000  # CLIP's (scikit-learn's lbfgs max_iter)
CB_LEARNING_RATE = 0.1  # CLIP_benchmark's --fewshot_lr
CB_EPOCHS = 10  # CLIP_benchmark's --fewshot_epochs
CB_BATCH_SIZE = 64  # CLIP_benchmark's --batch_size


@dataclass(frozen=True)
class ProbeSettings:
    protocol: str = "paper"
    seed: int = SEED  # the held-out validation draw; CLIP_benchmark's seed
    val_fraction: float = VAL_FRACTION
    max_iter: int = MAX_ITER
    cb_lr: float = CB_LEARNING_RATE
    cb_epochs: int = CB_EPOCHS
    cb_batch_size: int = CB_BATCH_SIZE
