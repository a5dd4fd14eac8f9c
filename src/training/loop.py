"""One optimizer step of contrastive training: forward, loss, backward, clip, update.

With `accum_freq` > 1 the step is *real* accumulation, as open_clip does it: the
features of all micro-batches are first computed without gradients, then each
micro-batch is recomputed with gradients and its features swapped into the cached
set, so the loss contrasts the whole accumulated batch and the summed gradient equals
that of one big batch (the temperature's gradient is taken in the last pass only). The RNG
state is replayed for each recompute so that drop-path masks are the same in both passes.

Nothing here waits for the device: the loss stays a device tensor, and a non-finite loss
is only recorded (on the device) with its step. The caller reads it with
`raise_if_nonfinite()` on logging steps and before every save, so a NaN never reaches a
checkpoint and the host never stalls on a per-step `.item()`.

A compiled model that fails to compile falls back to the eager one. In a distributed run
the ranks decide that together in their first step (`_agree_on_compile`), before any
collective: each compiles its step with gradient sync off, they gather who failed, and all
fall back or none does. After that a compiler failure (a recompile) stops the run, since one
rank falling back alone would desynchronise DDP.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import nn

from src.open_alip.model import unwrap_model
from src.training.compiled import (
    NOT_COMPILER_ERRORS,
    backward_compiled_with_forward,
    describe,
    warn_compile_failed,
)
from src.training.distributed import DistEnv, all_reduce_mean, gather_object
from src.training.errors import NonFiniteLossError
from src.training.schedule import Schedule

LOGIT_SCALE_MAX = math.log(100)


@dataclass
class StepResult:
    loss: torch.Tensor  # mean over ranks of the step's loss, on the device: read it only when logging
    grad_norm: torch.Tensor | None  # global norm before clipping, likewise


def autocast_dtype(precision: str) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def make_grad_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler | None:
    """fp16 needs loss scaling; bf16 has fp32's range and does not."""
    if precision != "fp16":
        return None
    # The original's settings: start small, grow slowly.
    return torch.amp.GradScaler(device.type, init_scale=128, growth_interval=200)


def _rng_snapshot(device: torch.device):
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _rng_restore(snapshot, device: torch.device) -> None:
    cpu, cuda = snapshot
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


class Trainer:
    """`model(images, tokens, normalize=False)` must return raw (image, text) embeddings and
    exp(logit_scale), as RWKV_CLIP does: the loss normalises them in float32, which under bf16
    autocast is more precise than normalising in the towers' dtype."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        schedule: Schedule,
        loss_fn: nn.Module,
        env: DistEnv,
        *,
        precision: str = "fp32",
        grad_clip_norm: float = 1.0,
        accum_freq: int = 1,
        scaler: torch.amp.GradScaler | None = None,
        eager_fallback: nn.Module | None = None,
        compile_backend: str = "",
        compile_failure: BaseException | None = None,
    ) -> None:
        self.model = model
        # `model` compiled: the same model uncompiled, taken if the compiler fails.
        self.eager_fallback = eager_fallback
        self.compile_backend = compile_backend
        # Compiling was asked for in a distributed run: the first step decides it for all ranks.
        # `compile_failure`: wrapping the model failed on this rank (it is `model` itself).
        self._compile_failure = compile_failure
        self._agree_pending = env.distributed and (eager_fallback is not None or compile_failure is not None)
        self.raw_model = unwrap_model(model)
        self.optimizer = optimizer
        self.schedule = schedule
        self.loss_fn = loss_fn
        self.env = env
        self.device = env.device
        self.dtype = autocast_dtype(precision)
        self.grad_clip_norm = grad_clip_norm
        self.accum_freq = accum_freq
        self.scaler = scaler
        # DDP, when there is one, may sit inside a torch.compile wrapper.
        self.ddp = _find_ddp(model)
        # The first step whose loss was not finite (-1: none yet) and that loss.
        self._bad_step = torch.full((), -1, dtype=torch.int64, device=self.device)
        self._bad_loss = torch.zeros((), dtype=torch.float32, device=self.device)

    def _autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def _no_sync(self, last: bool):
        if not last and self.ddp is not None:
            return self.ddp.no_sync()
        return contextlib.nullcontext()

    def _backward(self, loss: torch.Tensor) -> None:
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def _forward_backward(self, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        if len(micro) == 1:
            images, tokens = micro[0]
            with self._autocast():
                image_emb, text_emb, logit_scale = self.model(images, tokens, normalize=False)
            loss = self.loss_fn(image_emb, text_emb, logit_scale)
            self._backward(loss)
            return loss.detach()

        cached_image, cached_text, rng = [], [], []
        with torch.no_grad():
            for images, tokens in micro:
                rng.append(_rng_snapshot(self.device))
                with self._autocast():
                    image_emb, text_emb, _ = self.model(images, tokens, normalize=False)
                cached_image.append(image_emb)
                cached_text.append(text_emb)
        loss = None
        for j, (images, tokens) in enumerate(micro):
            _rng_restore(rng[j], self.device)
            last = j == len(micro) - 1
            with self._no_sync(last=last):
                with self._autocast():
                    image_emb, text_emb, logit_scale = self.model(images, tokens, normalize=False)
                if not last:
                    # Every pass computes the full loss; its gradient w.r.t. the temperature
                    # must be taken once, not once per micro-batch.
                    logit_scale = logit_scale.detach()
                all_image = torch.cat(cached_image[:j] + [image_emb] + cached_image[j + 1 :])
                all_text = torch.cat(cached_text[:j] + [text_emb] + cached_text[j + 1 :])
                loss = self.loss_fn(all_image, all_text, logit_scale)
                self._backward(loss)
        return loss.detach()

    def _compile_without_collectives(
        self, micro: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> BaseException | None:
        """Compile this step's graphs (forward, backward, and accumulation's gradient-free
        forward) by running the model once with DDP's gradient sync off; the error, if the
        compiler fails. Nothing here is a collective: the model has no buffers to broadcast, and
        without sync DDP starts no all-reduce (the outputs are dropped, no backward runs)."""
        images, tokens = micro[0]
        rng = _rng_snapshot(self.device)  # the step proper draws the same drop-path masks
        no_sync = self.ddp.no_sync() if self.ddp is not None else contextlib.nullcontext()
        try:
            with no_sync, backward_compiled_with_forward():
                if len(micro) > 1:
                    with torch.no_grad(), self._autocast():
                        self.model(images, tokens, normalize=False)
                with self._autocast():
                    self.model(images, tokens, normalize=False)
        except NOT_COMPILER_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - a compiler failure, decided below with the other ranks
            return exc
        finally:
            _rng_restore(rng, self.device)
        return None

    def _agree_on_compile(self, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Every rank compiles (or found wrapping failed), then all learn who failed: all fall
        back to the eager model, with one warning from rank 0 naming the ranks, or none does."""
        self._agree_pending = False
        failure = self._compile_failure
        if failure is None and self.eager_fallback is not None:
            failure = self._compile_without_collectives(micro)
        failures = gather_object(None if failure is None else describe(failure), self.env)
        failed = [rank for rank, text in enumerate(failures) if text]
        if failed:
            if self.env.is_master:
                ranks = ", ".join(map(str, failed))
                warn_compile_failed(
                    failures[failed[0]],
                    self.compile_backend,
                    f" on rank{'s' if len(failed) > 1 else ''} {ranks} of {self.env.world_size}",
                )
            if self.eager_fallback is not None:
                self.model = self.eager_fallback
            self.optimizer.zero_grad(set_to_none=True)
        self.eager_fallback = None

    def _forward_backward_or_eager(self, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        if self._agree_pending:
            self._agree_on_compile(micro)
        if self.eager_fallback is None:
            return self._forward_backward(micro)
        try:
            return self._forward_backward(micro)
        except NOT_COMPILER_ERRORS:
            raise
        except Exception as exc:  # noqa: BLE001 - a compiler failure (a model bug fails again eagerly)
            warn_compile_failed(exc, self.compile_backend)
        self.model, self.eager_fallback = self.eager_fallback, None
        # A backward that failed halfway may have left some gradients: the step starts over.
        self.optimizer.zero_grad(set_to_none=True)
        return self._forward_backward(micro)

    def step(self, micro: list[tuple[torch.Tensor, torch.Tensor]], step: int) -> StepResult:
        """Optimizer step number `step` (0-based) over `micro` (accum_freq micro-batches)."""
        self.model.train()
        self.schedule.apply(self.optimizer, step)
        local_loss = self._forward_backward_or_eager(micro)
        loss = all_reduce_mean(local_loss, self.env)
        newly_bad = ~torch.isfinite(loss) & (self._bad_step < 0)
        self._bad_step.masked_fill_(newly_bad, step)
        self._bad_loss = torch.where(newly_bad, loss, self._bad_loss)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grad_norm = None
        if self.grad_clip_norm > 0:
            grad_norm = nn.utils.clip_grad_norm_(self.raw_model.parameters(), self.grad_clip_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            self.raw_model.logit_scale.clamp_(0, LOGIT_SCALE_MAX)
        return StepResult(loss=loss, grad_norm=grad_norm)

    def raise_if_nonfinite(self) -> None:
        """Raise NonFiniteLossError naming the first step whose loss was NaN or infinite since
        the start (a host sync: call it where the loss is read anyway). Every rank holds the
        same all-reduced loss, so all ranks raise together."""
        bad_step = int(self._bad_step.item())
        if bad_step >= 0:
            raise NonFiniteLossError(f"loss is {self._bad_loss.item()} at step {bad_step + 1}")


def _find_ddp(model: nn.Module) -> nn.parallel.DistributedDataParallel | None:
    """The DistributedDataParallel in `model`, looking through torch.compile's wrapper."""
    while model is not None:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            return model
        model = getattr(model, "_orig_mod", None)
    return None
