"""The log line, TensorBoard scalars and metrics.jsonl of a running training, every
--log-every-n-steps optimizer steps and at each epoch's end.

Values stay on the device between reports: the loss of every step is summed there, and
it is read (one host sync) only when a report is written. The same report checks that no
loss since the last one was NaN or infinite.
"""

from __future__ import annotations

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

    def after_step(self, state: TrainState, result: StepResult) -> None:
        loss = result.loss.detach()
        self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
        self._count += 1
        if state.step % self.cfg.log_every_n_steps == 0 or state.epoch_step == self.steps_per_epoch:
            self._report(state, result)

    def _report(self, state: TrainState, result: StepResult) -> None:
        self.trainer.raise_if_nonfinite()
        speed = self.meter.report(state.step)
        model = unwrap_model(self.trainer.model)
        values = {
            "loss": float(result.loss.item()),
            "loss_avg": float((self._loss_sum / self._count).item()),
            "lr": self.trainer.optimizer.param_groups[0]["lr"],
            "logit_scale": float(model.logit_scale.detach().exp()),
            "epoch": state.epoch + state.epoch_step / self.steps_per_epoch,
            "bad_records": _bad_records(state.loader, self.env),
            **speed,
        }
        if result.grad_norm is not None:
            values["grad_norm"] = float(result.grad_norm)
        if self.trainer.scaler is not None:
            values["amp_scale"] = float(self.trainer.scaler.get_scale())
        LOG.info(
            "epoch %d/%d step %d/%d (%.1f%%) | loss %.4f (avg %.4f) | lr %.3e | logit_scale %.2f | "
            "%.1f samples/s per rank, %.1f total | data wait %.0f%% | bad records %d | elapsed %s | ETA %s",
            state.epoch + 1, self.cfg.epochs, state.step, self.stop_step, 100.0 * state.step / self.stop_step,
            values["loss"], values["loss_avg"], values["lr"], values["logit_scale"],
            speed["samples_per_s_per_rank"], speed["samples_per_s"], 100 * speed["data_wait_frac"],
            values["bad_records"], format_duration(speed["elapsed_s"]), format_duration(speed["eta_s"]),
        )
        self.run_log.scalars(state.step, values)
        self._loss_sum, self._count = None, 0


def _bad_records(loader, env: DistEnv) -> int:
    """Records skipped as unreadable so far, over all ranks (a collective). After a resume every
    rank also knows the others' (they are left out everywhere), so count each record once."""
    found = gather_object(sorted(loader.skipped_records), env)
    return len(set().union(*map(set, found)))
