"""The log line, TensorBoard scalars and metrics.jsonl of a running training, every
--log-every-n-steps optimizer steps, about every --log-every-s seconds, at each epoch's end and
at the last step.

Values stay on the device between reports: the loss of every step is summed there, and
it is read (one host sync) only when a report is written. The same report checks that no
loss since the last one was NaN or infinite.

A report is a collective (the ranks' skipped records are gathered), so every rank must report at
the same steps: the step of the next timed report is rank 0's estimate from its step time,
handed to the others in that same gather.
"""

from __future__ import annotations

import math

import torch

from src.open_alip.model import unwrap_model
from src.training.config import TrainConfig
from src.training.distributed import DistEnv, gather_object
from src.training.loop import StepResult, Trainer
from src.training.observe import LOG, RunLog, Throughput, format_duration
from src.training.state import TrainState


class Progress:
    def __init__(
        self,
        cfg: TrainConfig,
        env: DistEnv,
        trainer: Trainer,
        run_log: RunLog,
        meter: Throughput,
        steps_per_epoch: int,
        stop_step: int,
    ) -> None:
        self.cfg, self.env, self.trainer, self.run_log, self.meter = cfg, env, trainer, run_log, meter
        self.steps_per_epoch, self.stop_step = steps_per_epoch, stop_step
        self._loss_sum: torch.Tensor | None = None
        self._count = 0
        # The first timed report comes after the first step of this process (start or resume).
        self._next_timed = math.inf if cfg.log_every_s <= 0 else -1
        self._reports = 0

    def after_step(self, state: TrainState, result: StepResult) -> None:
        loss = result.loss.detach()
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        self._count += 1
        if self._next_timed < 0:
            self._next_timed = state.step
        if (
            state.step % self.cfg.log_every_n_steps == 0
            or state.epoch_step == self.steps_per_epoch
            or state.step >= self._next_timed
            or state.step == self.stop_step
        ):
            self._report(state, result)

    def _timed_step_after(self, step: int, step_time_s: float) -> float:
        """This rank's estimate of the step about --log-every-s from now (10 s after the first line)."""
        if self.cfg.log_every_s <= 0:
            return math.inf
        interval = min(10.0, self.cfg.log_every_s) if self._reports == 0 else self.cfg.log_every_s
        return step + max(1, round(interval / max(step_time_s, 1e-9)))

    def _report(self, state: TrainState, result: StepResult) -> None:
        self.trainer.raise_if_nonfinite()
        speed = self.meter.report(state.step)
        model = unwrap_model(self.trainer.model)
        bad_records, self._next_timed = _bad_records_and_next(
            state.loader, self.env, self._timed_step_after(state.step, speed["step_time_s"])
        )
        self._reports += 1
        values = {
            "loss": float(result.loss.item()),
            "loss_avg": float((self._loss_sum / self._count).item()),
            "lr": self.trainer.optimizer.param_groups[0]["lr"],
            "logit_scale": float(model.logit_scale.detach().exp()),
            "epoch": state.epoch + state.epoch_step / self.steps_per_epoch,
            "bad_records": bad_records,
            **speed,
        }
        if result.grad_norm is not None:
            values["grad_norm"] = float(result.grad_norm)
        if self.trainer.scaler is not None:
            values["amp_scale"] = float(self.trainer.scaler.get_scale())
        LOG.info(
            "epoch %d/%d step %d/%d (%.1f%%) | loss %.4f (avg %.4f) | lr %.3e | logit_scale %.2f | "
            "%.1f samples/s per rank, %.1f total | data wait %.0f%% | bad records %d | elapsed %s | ETA %s",
            state.epoch + 1,
            self.cfg.epochs,
            state.step,
            self.stop_step,
            100.0 * state.step / self.stop_step,
            values["loss"],
            values["loss_avg"],
            values["lr"],
            values["logit_scale"],
            speed["samples_per_s_per_rank"],
            speed["samples_per_s"],
            100 * speed["data_wait_frac"],
            values["bad_records"],
            format_duration(speed["elapsed_s"]),
            format_duration(speed["eta_s"]),
        )
        self.run_log.scalars(state.step, values)
        self._loss_sum, self._count = None, 0


def _bad_records_and_next(loader, env: DistEnv, next_timed: float) -> tuple[int, float]:
    """(records skipped as unreadable so far over all ranks, rank 0's step for the next timed
    report), in one collective. After a resume every rank also knows the others' skipped records
    (they are left out everywhere), so each is counted once."""
    found = gather_object((sorted(loader.skipped_records), next_timed), env)
    return len(set().union(*(set(records) for records, _ in found))), found[0][1]
