"""Learning-rate schedules, counted in optimizer steps (not micro-batches)."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, OneCycleLR

SCHEDULES = ("cosine", "linear", "const", "onecycle")


def warmup_steps_from(warmup: float, total_steps: int) -> int:
    """`--warmup` below 1 is a fraction of all steps (the original's 0.1); from 1 up, a step count."""
    if warmup < 0:
        raise ValueError(f"--warmup {warmup}: must be >= 0")
    steps = int(round(warmup * total_steps)) if warmup < 1 else int(warmup)
    return min(steps, total_steps)


def lr_factor(step: int, *, kind: str, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """Multiplier of the base lr for optimizer step `step` (0-based)."""
    if warmup_steps > 0 and step < warmup_steps:
        return (step + 1) / warmup_steps
    if kind == "const":
        return 1.0
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if kind == "cosine":
        shape = 0.5 * (1.0 + math.cos(math.pi * progress))
    elif kind == "linear":
        shape = 1.0 - progress
    else:
        raise ValueError(f"unknown schedule {kind!r}; choose one of {', '.join(SCHEDULES)}")
    return min_ratio + (1.0 - min_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    kind: str,
    total_steps: int,
    warmup: float,
    min_lr_ratio: float = 0.0,
) -> LRScheduler:
    """A scheduler whose `state_dict()` round-trips through `torch.load(weights_only=True)`."""
    if kind not in SCHEDULES:
        raise ValueError(f"--lr-scheduler {kind!r}: choose one of {', '.join(SCHEDULES)}")
    total_steps = max(1, total_steps)
    warmup_steps = warmup_steps_from(warmup, total_steps)
    if kind == "onecycle":
        # The original repository's schedule: cosine up for `warmup` of the run, then down.
        max_lrs = [g["lr"] for g in optimizer.param_groups]
        pct = max(1, warmup_steps) / total_steps
        return OneCycleLR(optimizer, max_lr=max_lrs, total_steps=total_steps, pct_start=min(pct, 0.99))

    def factor(step: int) -> float:
        return lr_factor(step, kind=kind, total_steps=total_steps, warmup_steps=warmup_steps, min_ratio=min_lr_ratio)

    return LambdaLR(optimizer, factor)
