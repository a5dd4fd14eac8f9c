"""Learning-rate schedules: the lr (and, for OneCycle, AdamW's beta1) as a function of the
optimizer step, counted in optimizer steps (not micro-batches).

A schedule holds no state of its own: the value at step s depends only on s and the
settings. A resumed run therefore rebuilds the schedule from the flags it is given and
evaluates it at the step it resumes from, so a new --lr, --lr-scheduler, --warmup or
--epochs takes effect at once (the resume says so in the log).

Names mean what they meant in the original repository (deepglint/RWKV-CLIP, train.py):

- `cosine` (the original's default, and this toolkit's): torch's OneCycleLR with its
  defaults. The lr rises along a half cosine from lr/25 to lr over the first `--warmup`
  fraction of the run (the original fixed it at 0.1), then falls along a half cosine to
  lr/25/1e4. AdamW's beta1 cycles the other way, 0.95 -> 0.85 -> 0.95, so `--beta1` has no
  effect, as in the original. `onecycle` is the same schedule under its own name.
- `linear`: the original's LinearLR, lr falling linearly to 0 over the run, no warmup.

Until this toolkit's rename, `cosine` and `linear` meant linear warmup then cosine or
linear decay; those schedules are now `warmup-cosine` and `warmup-linear`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: train.py's parser (this module's SCHEDULES) needs no torch
    import torch

SCHEDULES = ("cosine", "onecycle", "linear", "warmup-cosine", "warmup-linear", "const")
ONECYCLE = ("cosine", "onecycle")
# What each name meant before the rename (see the module docstring), for notices on resume.
FORMER_MEANING = {"cosine": "warmup-cosine", "linear": "warmup-linear"}

# torch.optim.lr_scheduler.OneCycleLR's defaults, which the original used.
_DIV_FACTOR = 25.0
_FINAL_DIV_FACTOR = 1e4
_BASE_MOMENTUM, _MAX_MOMENTUM = 0.85, 0.95


def warmup_steps_from(warmup: float, total_steps: int) -> int:
    """`--warmup` below 1 is a fraction of all steps (the original's 0.1); from 1 up, a step count."""
    if warmup < 0:
        raise ValueError(f"--warmup {warmup}: must be >= 0")
    steps = int(round(warmup * total_steps)) if warmup < 1 else int(warmup)
    return min(steps, total_steps)


def _cos_anneal(start: float, end: float, pct: float) -> float:
    # The same expression as OneCycleLR's, so the floats agree exactly.
    return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)


@dataclass(frozen=True)
class Schedule:
    kind: str
    peak_lr: float
    total_steps: int
    warmup: float  # as --warmup gives it: a fraction below 1, else steps

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"--lr-scheduler {self.kind!r}: choose one of {', '.join(SCHEDULES)}")
        object.__setattr__(self, "total_steps", max(1, int(self.total_steps)))

    @property
    def warmup_steps(self) -> int:
        return warmup_steps_from(self.warmup, self.total_steps)

    @property
    def cycles_beta1(self) -> bool:
        return self.kind in ONECYCLE

    def _onecycle(self, step: int, start: tuple[float, float, float], end_of_rise: float) -> float:
        """OneCycleLR's two-phase cosine: value at `start[0]` rises/falls to `start[1]`,
        then to `start[2]`, with the turn after the first `end_of_rise` steps."""
        phases = ((end_of_rise - 1, start[0], start[1]), (self.total_steps - 1, start[1], start[2]))
        begin = 0.0
        for i, (end_step, a, b) in enumerate(phases):
            if step <= end_step or i == len(phases) - 1:
                span = end_step - begin
                return _cos_anneal(a, b, (step - begin) / span if span > 0 else 1.0)
            begin = end_step
        raise AssertionError("unreachable")

    def _pct_start(self) -> float:
        pct = self.warmup if self.warmup < 1 else self.warmup / self.total_steps
        return float(pct * self.total_steps)

    def lr_at(self, step: int) -> float:
        """The lr of optimizer step `step` (0-based)."""
        step = min(max(0, step), self.total_steps)
        lr = self.peak_lr
        if self.kind in ONECYCLE:
            initial = lr / _DIV_FACTOR
            return self._onecycle(step, (initial, lr, initial / _FINAL_DIV_FACTOR), self._pct_start())
        if self.kind == "linear":
            return lr * (1.0 - min(step, self.total_steps) / self.total_steps)
        warm = self.warmup_steps
        if warm > 0 and step < warm:
            return lr * (step + 1) / warm
        if self.kind == "const":
            return lr
        progress = min(1.0, (step - warm) / max(1, self.total_steps - warm))
        if self.kind == "warmup-cosine":
            return lr * 0.5 * (1.0 + math.cos(math.pi * progress))
        return lr * (1.0 - progress)  # warmup-linear

    def beta1_at(self, step: int) -> float | None:
        """OneCycle's beta1 at `step`; None for the other schedules, which leave the optimizer's own."""
        if not self.cycles_beta1:
            return None
        step = min(max(0, step), self.total_steps)
        return self._onecycle(step, (_MAX_MOMENTUM, _BASE_MOMENTUM, _MAX_MOMENTUM), self._pct_start())

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every parameter group's lr (and OneCycle's beta1) for optimizer step `step`; returns the lr."""
        lr = self.lr_at(step)
        beta1 = self.beta1_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
            if beta1 is not None and "betas" in group:
                group["betas"] = (beta1, *group["betas"][1:])
        return lr

    def describe(self) -> str:
        if self.kind in ONECYCLE:
            return (
                f"{self.kind}: OneCycle as in the original, lr {self.peak_lr / _DIV_FACTOR:.3g} -> "
                f"{self.peak_lr:.3g} over the first {self._pct_start():.0f} steps, then -> "
                f"{self.peak_lr / _DIV_FACTOR / _FINAL_DIV_FACTOR:.3g}; beta1 cycles 0.95 -> 0.85 -> 0.95"
            )
        if self.kind == "linear":
            return (
                f"linear: lr {self.peak_lr:.3g} -> 0 over {self.total_steps} steps, no warmup (the "
                "original's)"
            )
        return (
            f"{self.kind}: {self.warmup_steps} warmup steps to lr {self.peak_lr:.3g}, {self.total_steps} "
            "in all"
        )
