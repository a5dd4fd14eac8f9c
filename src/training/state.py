"""Everything a resumed run needs, in one object: `TrainState`.

It holds the pieces that change as training goes (model, optimizer, grad scaler, loader)
and the counters (optimizer step, epoch, position in the epoch). `state_dict()` is the
checkpoint; `load_state_dict()` puts a checkpoint back. Saving is collective: each rank's
loader position and RNG streams are gathered to rank 0, which writes the file.

The file is a dict that `torch.load(..., weights_only=True)` accepts. Its "state_dict" is
the model in the released checkpoints' layout (RWKV_CLIP.released_state_dict), so
`create_model(config, pretrained=path)` and the original code load it; "master_params"
holds the full-precision copies of what that layout rounds (the text decays), so a resume
is exact. The schedule has no state: it is a function of the step (schedule.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from src.open_alip.model import CheckpointMismatchError, load_checkpoint
from src.training import checkpoint as ckpt_io
from src.training.batching import BatchPlan
from src.training.distributed import DistEnv, gather_object
from src.training.errors import TrainingError

# Loader-state fields that must agree for a saved position to mean the same records.
_LOADER_IDENTITY = ("seed", "rank", "world_size", "batch_size", "total_records")


class TrainState:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scaler: torch.amp.GradScaler | None,
        loader,
        env: DistEnv,
    ) -> None:
        self.model = model  # the bare model, not its DDP/compile wrapper
        self.optimizer = optimizer
        self.scaler = scaler
        self.loader = loader
        self.env = env
        self.step = 0  # optimizer steps done
        self.epoch = 0  # the epoch being trained (0-based)
        self.epoch_step = 0  # optimizer steps done in it

    def finish_epoch(self) -> None:
        self.epoch, self.epoch_step = self.epoch + 1, 0

    # --- saving ---------------------------------------------------------------------------

    def state_dict(self, *, plan: BatchPlan, run: dict[str, Any]) -> dict[str, Any] | None:
        """The checkpoint on rank 0, None elsewhere. Collective: every rank calls it."""
        data = gather_object(self.loader.state_dict(), self.env)
        rng = gather_object(ckpt_io.capture_rng_state(), self.env)
        if not self.env.is_master:
            return None
        own = self.model.state_dict()
        released = self.model.released_state_dict()
        return {
            "state_dict": released,
            "master_params": {k: v for k, v in own.items() if released[k].dtype != v.dtype},
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "step": self.step,
            "epoch": self.epoch,
            "epoch_step": self.epoch_step,
            "data": data,
            "rng": rng,
            "world_size": self.env.world_size,
            "batch": plan.to_json(),
            "config": self.model.config,
            "run": run,
        }

    # --- restoring ------------------------------------------------------------------------

    def load_state_dict(self, ckpt: dict[str, Any], *, where: Path, plan: BatchPlan) -> list[str]:
        """Put `ckpt` back on this rank; returns notices for the log.

        Raises TrainingError when the checkpoint cannot continue this run exactly (another
        model, another batch split or number of processes).
        """
        self._check_same_split(ckpt, where, plan)
        try:
            load_checkpoint(self.model, ckpt, strict=True)
        except CheckpointMismatchError as exc:
            raise TrainingError(
                f"--resume {where}: {exc}; resume with the --config and model flags the run was started with"
            ) from exc
        _load_optimizer_moments(self.optimizer, ckpt["optimizer"])
        if self.scaler is not None and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.step = int(ckpt["step"])
        self.epoch, self.epoch_step = int(ckpt["epoch"]), int(ckpt["epoch_step"])
        if ckpt.get("epoch_complete"):
            # The first checkpoint format kept a finished epoch's index and marked it done.
            self.finish_epoch()
        notices = []
        saved_loader = ckpt["data"][self.env.rank]
        # The loader takes every rank's state, so that no rank meets a record another rank
        # already found bad.
        state = ckpt["data"]
        if self.epoch_step:
            self.loader.load_state_dict(state)
        elif all(saved_loader.get(k) == getattr(self.loader, k, None) for k in _LOADER_IDENTITY):
            self.loader.load_state_dict(state)  # carries the loader's own counters
        else:
            notices.append("the data differ from the checkpoint's; the next epoch reads the data given now")
        ckpt_io.restore_rng_state(ckpt["rng"][self.env.rank])
        return notices

    def _check_same_split(self, ckpt: dict[str, Any], where: Path, plan: BatchPlan) -> None:
        saved_world = int(ckpt.get("world_size", self.env.world_size))
        batch = ckpt.get("batch")
        if batch is None:  # the first checkpoint format kept the flags instead
            args = ckpt.get("args", {})
            batch = {
                "micro_batch": args.get("batch_size", plan.micro_batch),
                "accum_freq": args.get("accum_freq", plan.accum_freq),
            }
        saved = (int(batch["micro_batch"]), int(batch["accum_freq"]), saved_world)
        now = (plan.micro_batch, plan.accum_freq, self.env.world_size)
        if saved != now:
            raise TrainingError(
                f"--resume {where}: the checkpoint was trained with micro-batches of {saved[0]} x "
                f"accumulation {saved[1]} on {saved[2]} process(es), this run has {now[0]} x {now[1]} on "
                f"{now[2]}; resume with the same split (--batch-size, --accum-freq, --global-batch-size and "
                "number of processes), or start a new run from it with --pretrained"
            )


def _load_optimizer_moments(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
    """Load AdamW's moments and step counts, but keep this run's hyper-parameters (lr, betas,
    eps, weight decay, fused): a resume takes the settings it is given."""
    current = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    optimizer.load_state_dict(saved)
    for group, settings in zip(optimizer.param_groups, current):
        group.update(settings)
