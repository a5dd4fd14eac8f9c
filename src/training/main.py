"""The training run. `run(config)` is what train.py calls; `_run` reads as the outline:

    prepare the output folder and pick the checkpoint to resume from
    build: batch plan, loader, model, optimizer, schedule, training state
    resume: put the checkpoint back (TrainState.load_state_dict)
    for each epoch: train_one_epoch, save, epoch-end hooks

Everything the run needs to know comes in one TrainConfig (config.py).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from src.errors import flag_of
from src.fsutil import atomic_write_json
from src.lock import OutputLock, OutputLocked
from src.open_alip.model import unwrap_model
from src.training import checkpoint as ckpt_io
from src.training.agreement import build_on_every_rank, check_same_data, check_same_plan, check_shared_output
from src.training.batching import BatchPlan, plan_for_device
from src.training.compiled import try_compile, warn_compile_failed
from src.training.config import TrainConfig, recipe_notices
from src.training.distributed import DistEnv, barrier, broadcast_object, cleanup, init_distributed, wrap_ddp
from src.training.errors import NonFiniteLossError, TrainingError
from src.training.loop import Trainer, make_grad_scaler
from src.training.observe import LOG, RunLog, Throughput, close_logging, setup_logging
from src.training.progress import Progress
from src.training.schedule import FORMER_MEANING, ONECYCLE, Schedule
from src.training.state import TrainState
from src.training.summary import draw_loss_curve, log_summary
from src.training.warmup import tuning_choices, warm_wkv

# Called at the end of each epoch on every rank as hook(model, epochs_done, config, plan, env),
# with the unwrapped model in eval mode under no_grad, the run's settings and its batch plan
# (e.g. plan.micro_batch: the per-process batch the run actually uses, also under
# --batch-size auto). Metrics it returns are logged (rank 0) under "eval/". A hook decides
# itself whether this epoch is one to evaluate (e.g. from config.zeroshot_frequency) and may
# return None. train.py passes `run(config, [hook, ...])`.
EpochEndHook = Callable[[nn.Module, int, TrainConfig, BatchPlan, DistEnv], "dict[str, float] | None"]

LOCK_NAME = "train.lock"  # held by rank 0 for the whole run: one writer per --output

# Settings a resume may change; it says which ones did (they take effect at once).
_RESUME_MAY_CHANGE = (
    "lr",
    "lr_scheduler",
    "warmup",
    "epochs",
    "max_steps",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
    "grad_clip_norm",
    "precision",
    "text_decay_dtype",
)


def run(config: TrainConfig, epoch_end_hooks: list[EpochEndHook] | None = None) -> None:
    """Train as `config` says. Raises TrainingError / NonFiniteLossError with a user-facing message."""
    env = init_distributed(config.device, timeout_s=config.dist_timeout)
    try:
        _run(config, env, list(epoch_end_hooks or []))
    finally:
        close_logging()
        cleanup(env)


def _run(cfg: TrainConfig, env: DistEnv, hooks: list[EpochEndHook]) -> None:
    if cfg.zeroshot_data and not hooks:
        raise TrainingError(
            "--zeroshot-data was given but no zero-shot evaluation is wired into this "
            "train.py; leave the flag out"
        )
    locks: list[OutputLock] = []
    try:
        resume_path = _prepare_output(cfg, env, locks)
        _run_locked(cfg, env, hooks, resume_path)
    finally:
        for lock in locks:
            lock.release()


def _plan_run(cfg: TrainConfig, env: DistEnv) -> tuple[str, BatchPlan, bool]:
    """The WKV implementation, the batch plan and whether to checkpoint, the same on every rank:
    what a run and `build_training_step` both start from."""
    wkv_impl = _resolve_wkv_impl(cfg, env)
    _check_mix_impl(cfg, env)
    plan, checkpointing, why = plan_for_device(
        model_config=cfg.model,
        wkv_impl=wkv_impl,
        precision=cfg.precision,
        device=env.device,
        world_size=env.world_size,
        global_batch=cfg.global_batch_size,
        accum_freq=cfg.accum_freq,
        batch_size=cfg.batch_size,
        force_checkpointing=bool(cfg.model.get("with_cp")),
        env=env,
    )
    if why:
        LOG.info("%s", why)
    check_same_plan(plan, checkpointing, env)
    return wkv_impl, plan, checkpointing


def _run_locked(cfg: TrainConfig, env: DistEnv, hooks: list[EpochEndHook], resume_path: Path | None) -> None:
    wkv_impl, plan, checkpointing = _plan_run(cfg, env)
    check_shared_output(cfg.output, env)
    # First: a wrong data path fails before the model is built, on every rank at once.
    loader = build_on_every_rank(lambda: _build_loader(cfg, plan, env), env)
    check_same_data(loader.shardset, env)
    steps_per_epoch = _steps_per_epoch(cfg, plan, loader)
    seed_everything(cfg.seed, env.rank)
    model = _build_model(cfg, env, wkv_impl, checkpointing)
    warmed = warm_wkv(cfg.model, wkv_impl, plan.micro_batch, env.device, cfg.precision)
    if warmed is not None:
        chosen = tuning_choices(plan.micro_batch)
        LOG.info(
            "WKV kernels (%s) tuned at the micro-batch %d in %.1f s%s",
            wkv_impl,
            plan.micro_batch,
            warmed,
            ":" if chosen else " (no autotuner chose anything)",
        )
        for line in chosen:
            LOG.info("  %s", line)
    optimizer = _build_optimizer(cfg, model, env)
    schedule = Schedule(cfg.lr_scheduler, cfg.lr, steps_per_epoch * cfg.epochs, cfg.warmup)
    state = TrainState(model, optimizer, make_grad_scaler(cfg.precision, env.device), loader, env)
    if resume_path is not None:
        _resume(state, resume_path, cfg, plan, schedule)
    trainer = _build_trainer(cfg, state, schedule, plan, env)
    _announce(cfg, env, plan, model, loader, steps_per_epoch, schedule)

    stop_step = min(schedule.total_steps, cfg.max_steps or schedule.total_steps)
    first_step, started = state.step, time.perf_counter()
    run_log = RunLog(cfg.output, enabled=env.is_master, resume_step=state.step)
    meter = Throughput(plan.per_process, env.world_size, stop_step, state.step)
    progress = Progress(cfg, env, trainer, run_log, meter, steps_per_epoch, stop_step)
    saver = _Saver(cfg, env, state, trainer, plan, last=resume_path)
    try:
        while state.epoch < cfg.epochs and state.step < stop_step:
            train_one_epoch(state, trainer, plan, steps_per_epoch, stop_step, progress, saver)
            if state.epoch_step < steps_per_epoch:  # --max-steps ended the run inside the epoch
                saver.save_step(final=True)
                break
            state.finish_epoch()
            saver.save(ckpt_io.epoch_checkpoint_path(cfg.output, state.epoch))
            if env.is_master:
                draw_loss_curve(cfg.output, plan.global_batch)
            _run_hooks(hooks, model, state.epoch, cfg, plan, env, run_log, state.step)
        trainer.raise_if_nonfinite()
    except NonFiniteLossError as exc:
        where = f"the last good checkpoint is {saver.last}" if saver.last else "no checkpoint was written yet"
        raise NonFiniteLossError(
            f"{exc}; stopped without saving, {where}; resume from it with --resume latest and a lower --lr, "
            "bf16 instead of fp16, or a smaller --grad-clip-norm (each takes effect on resume)"
        ) from None
    finally:
        run_log.close()
    if env.is_master:
        draw_loss_curve(cfg.output, plan.global_batch)
        log_summary(
            cfg.output,
            first_step=first_step,
            last_step=state.step,
            global_batch=plan.global_batch,
            seconds=time.perf_counter() - started,
            last_checkpoint=saver.last,
        )


def train_one_epoch(
    state: TrainState,
    trainer: Trainer,
    plan: BatchPlan,
    steps_per_epoch: int,
    stop_step: int,
    progress: Progress,
    saver: _Saver,
) -> None:
    """Optimizer steps from the state's position to the epoch's end (or to `stop_step`)."""
    if state.epoch_step == 0:
        state.loader.set_epoch(state.epoch)
    batches = iter(state.loader)
    device = state.env.device
    while state.epoch_step < steps_per_epoch and state.step < stop_step:
        t0 = time.perf_counter()
        micro = []
        for _ in range(plan.accum_freq):
            images, tokens = next(batches)
            micro.append((images.to(device, non_blocking=True), tokens.to(device, non_blocking=True)))
        progress.meter.add_data_wait(time.perf_counter() - t0)
        result = trainer.step(micro, state.step)
        state.step += 1
        state.epoch_step += 1
        progress.after_step(state, result)
        saver.save_step()


# --- prepare -------------------------------------------------------------------------------


def _prepare_output(cfg: TrainConfig, env: DistEnv, locks: list[OutputLock]) -> Path | None:
    """Create the run folder, clear what killed saves left, pick the checkpoint to resume from.

    Rank 0 decides and tells the others, so all ranks resume from the same file, and all
    stop together when something is wrong (instead of the others waiting forever).
    """
    decision: tuple[str, Any] = ("ok", (None, []))
    if env.is_master:
        try:
            decision = ("ok", _prepare_on_master(cfg, locks))
        except TrainingError as exc:
            decision = ("error", str(exc))
    decision = broadcast_object(decision, env)
    if decision[0] == "error":
        raise TrainingError(decision[1])
    setup_logging(cfg.output, env.rank)
    path, notices = decision[1]
    for notice in notices:
        LOG.warning("%s", notice)
    return path


def _prepare_on_master(cfg: TrainConfig, locks: list[OutputLock]) -> tuple[Path | None, list[str]]:
    try:
        cfg.output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainingError(
            f"--output {cfg.output}: cannot create it ({exc.strerror or exc}); pass a folder you can write"
        ) from exc
    # Two runs into one folder would overwrite each other's checkpoints and interleave metrics.
    lock = OutputLock(
        cfg.output,
        tool="train.py",
        path=cfg.output / LOCK_NAME,
        resume_hint="then rerun with --resume latest to continue it",
    )
    try:
        lock.acquire()
    except OutputLocked as exc:
        raise TrainingError(f"--output {exc}") from None
    except OSError as exc:
        raise TrainingError(
            f"--output {cfg.output}: cannot write there ({exc.strerror or exc}); pass a folder you can write"
        ) from exc
    locks.append(lock)
    notices = []
    removed = ckpt_io.remove_interrupted_saves(cfg.output)
    if removed:
        notices.append(
            f"removed {len(removed)} temporary file(s) of interrupted saves: "
            + ", ".join(p.name for p in removed)
        )
    path, skipped = ckpt_io.find_resume_checkpoint(cfg.resume, cfg.output)
    if cfg.resume and path is None:
        notices.append(
            f"--resume {cfg.resume}: no checkpoint in {ckpt_io.checkpoint_dir(cfg.output)} yet, so this "
            "run starts from step 0"
        )
    if not cfg.resume and ckpt_io.list_checkpoints(cfg.output):
        # Mixing two runs' checkpoints would make a later `--resume latest` pick either.
        raise TrainingError(
            f"--output {cfg.output} already holds checkpoints; pass --resume latest to "
            "continue that run, or choose another --output"
        )
    return path, notices + skipped


# --- build ---------------------------------------------------------------------------------


def seed_everything(seed: int, rank: int) -> None:
    # Ranks differ so that their drop-path masks are independent.
    s = seed + rank
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def _build_loader(cfg: TrainConfig, plan: BatchPlan, env: DistEnv):
    from dataloaders.imagenet import build_loader

    data = cfg.train_data[0] if len(cfg.train_data) == 1 else list(cfg.train_data)
    return build_loader(
        data,
        plan.micro_batch,
        input_size=int(cfg.model["input_size"]),
        train=True,
        backend=cfg.data_backend,
        device=env.device,
        num_threads=cfg.workers,
        rank=env.rank,
        world_size=env.world_size,
        seed=cfg.seed,
        all_captions=False,
        drop_last=True,
        max_bad_records=cfg.max_bad_records,
        reader_workers=cfg.reader_workers,
    )


def _data_label(cfg: TrainConfig) -> str:
    return " ".join(cfg.train_data)


def _steps_per_epoch(cfg: TrainConfig, plan: BatchPlan, loader) -> int:
    records = int(loader.total_records)
    micro_per_epoch = len(loader)
    if cfg.train_num_samples is not None:
        if cfg.train_num_samples > records:
            raise TrainingError(
                f"--train-num-samples {cfg.train_num_samples} is more than the {records} records in "
                f"{_data_label(cfg)}; pass {records} or leave the flag out"
            )
        if cfg.train_num_samples < records:
            LOG.warning(
                "--train-num-samples %d is less than the %d records in %s: each epoch uses %d samples",
                cfg.train_num_samples,
                records,
                _data_label(cfg),
                cfg.train_num_samples,
            )
            micro_per_epoch = min(
                micro_per_epoch, cfg.train_num_samples // (plan.micro_batch * plan.world_size)
            )
    steps = micro_per_epoch // plan.accum_freq
    if steps < 1:
        raise TrainingError(
            f"{_data_label(cfg)} has {records} records, fewer than one optimizer step's {plan.global_batch} "
            "(the global batch); lower --batch-size, --accum-freq or --global-batch-size"
        )
    return steps


def _resolve_wkv_impl(cfg: TrainConfig, env: DistEnv) -> str:
    """The concrete WKV implementation; resolved first, so that one this device cannot run
    fails before any work."""
    from src.open_alip.wkv import resolve_wkv_impl

    try:
        return resolve_wkv_impl(cfg.wkv_impl, env.device)
    except ValueError as exc:
        raise TrainingError(f"--wkv-impl {cfg.wkv_impl}: {exc}") from exc


def _check_mix_impl(cfg: TrainConfig, env: DistEnv) -> None:
    """Fused mixes where their kernels cannot run fail before any work, as the WKV does."""
    from src.open_alip.mix import mix_problem

    problem = mix_problem(env.device) if cfg.mix_impl == "triton" else None
    if problem is not None:
        raise TrainingError(f"--mix-impl triton: {problem}; or use --mix-impl torch")


def _build_model(cfg: TrainConfig, env: DistEnv, wkv_impl: str, checkpointing: bool) -> nn.Module:
    # The model library's one entry point, as the inference CLIs' loader (src/evaluation/model_loader.py)
    # uses it: the same files, hf-hub: repos and errors for --pretrained as for --model-weight.
    from src.open_alip import create_model_and_transforms
    from src.open_alip.errors import OpenAlipError, PretrainedError

    try:
        model, _, _ = create_model_and_transforms(
            cfg.model, pretrained=cfg.pretrained, wkv_impl=wkv_impl, random_init_warning=False
        )  # from scratch on purpose
    except PretrainedError as exc:
        raise TrainingError(f"--pretrained {cfg.pretrained}: {exc}") from None
    except OpenAlipError as exc:
        raise TrainingError(f"model config: {exc}") from None
    model.train()
    model.set_mix_impl(cfg.mix_impl)
    model.set_grad_checkpointing(checkpointing)
    if cfg.text_decay_dtype == "bf16":
        model.set_text_decay_dtype(torch.bfloat16)
    return model.to(env.device)


def _build_optimizer(cfg: TrainConfig, model: nn.Module, env: DistEnv) -> torch.optim.Optimizer:
    # One kernel for all parameters on CUDA (fused); torch's default elsewhere.
    fused = True if env.device.type == "cuda" else None
    return torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused,
    )


def _build_trainer(
    cfg: TrainConfig, state: TrainState, schedule: Schedule, plan: BatchPlan, env: DistEnv
) -> Trainer:
    return _make_trainer(cfg, state.model, state.optimizer, state.scaler, schedule, plan, env)


def build_training_step(cfg: TrainConfig, env: DistEnv, total_steps: int) -> tuple[Trainer, BatchPlan]:
    """The Trainer of a run of `cfg` on `env`, built as `run` builds it (WKV, batch plan, model,
    optimizer, schedule, DDP and compile wrappers, loss), without data or an output folder: what
    benchmarks/gpu.py times. Feed `trainer.step` batches of `plan.micro_batch`."""
    wkv_impl, plan, checkpointing = _plan_run(cfg, env)
    seed_everything(cfg.seed, env.rank)
    model = _build_model(cfg, env, wkv_impl, checkpointing)
    optimizer = _build_optimizer(cfg, model, env)
    schedule = Schedule(cfg.lr_scheduler, cfg.lr, total_steps, cfg.warmup)
    scaler = make_grad_scaler(cfg.precision, env.device)
    return _make_trainer(cfg, model, optimizer, scaler, schedule, plan, env), plan


def _make_trainer(
    cfg: TrainConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    schedule: Schedule,
    plan: BatchPlan,
    env: DistEnv,
) -> Trainer:
    from src.open_alip import ClipLoss

    if cfg.precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # static_graph: every step runs the same graph, except that accumulation's non-final
    # passes skip the gradient sync, which static graphs do not allow for.
    eager_model = wrap_ddp(model, env, static_graph=plan.accum_freq == 1)
    train_model, failure = (
        try_compile(eager_model, cfg.compile_backend) if cfg.compile else (eager_model, None)
    )
    if failure is not None and not env.distributed:  # a distributed run decides with the other ranks
        warn_compile_failed(failure, cfg.compile_backend)
    loss_fn = ClipLoss(
        local_loss=cfg.local_loss,
        gather_with_grad=cfg.gather_with_grad,
        rank=env.rank,
        world_size=env.world_size,
    )
    if cfg.local_loss and not cfg.gather_with_grad and env.world_size > 1:
        LOG.warning(
            "--local-loss without --gather-with-grad drops cross-rank gradient terms (an approximation)"
        )
    return Trainer(
        train_model,
        optimizer,
        schedule,
        loss_fn,
        env,
        precision=cfg.precision,
        grad_clip_norm=cfg.grad_clip_norm,
        accum_freq=plan.accum_freq,
        scaler=scaler,
        eager_fallback=eager_model if train_model is not eager_model else None,
        compile_backend=cfg.compile_backend,
        compile_failure=failure if env.distributed else None,
    )


def _announce(
    cfg: TrainConfig,
    env: DistEnv,
    plan: BatchPlan,
    model: nn.Module,
    loader,
    steps_per_epoch: int,
    schedule: Schedule,
) -> None:
    """Log what this run is and write params.json (the resolved configuration)."""
    params = sum(p.numel() for p in model.parameters())
    wkv = {m.wkv_impl for m in model.modules() if hasattr(m, "wkv_impl")}
    mixes = {m.mix_impl for m in model.modules() if hasattr(m, "mix_impl")}
    LOG.info(
        "model %s: %s parameters, WKV %s, token-shift mixes %s, text decays stored in %s | %d process(es) "
        "on %s, %s%s",
        cfg.config,
        f"{params:,}",
        "/".join(sorted(wkv)),
        "/".join(sorted(mixes)),
        cfg.text_decay_dtype,
        env.world_size,
        env.device.type,
        cfg.precision,
        f", compiled ({cfg.compile_backend})" if cfg.compile else "",
    )
    LOG.info(
        "%s | %d records, %d steps per epoch, %d steps in all",
        plan.describe(),
        int(loader.total_records),
        steps_per_epoch,
        schedule.total_steps,
    )
    if cfg.recipe:
        LOG.info("recipe %s, under the flags given beside it", cfg.recipe)
    for notice in [*recipe_notices(cfg), plan.shortfall_notice()]:
        if notice:
            LOG.warning("NOTICE: %s", notice)
    LOG.info("lr schedule %s", schedule.describe())
    if cfg.lr_scheduler in FORMER_MEANING:
        LOG.info(
            "(--lr-scheduler %s means what it meant in the original; this toolkit's former '%s' is now '%s')",
            cfg.lr_scheduler,
            cfg.lr_scheduler,
            FORMER_MEANING[cfg.lr_scheduler],
        )
    if cfg.lr_scheduler in ONECYCLE and "beta1" in cfg.given:
        LOG.warning(
            "NOTICE: --beta1 %g has no effect: --lr-scheduler %s cycles beta1 (0.95 -> 0.85 -> 0.95), "
            "as the original's schedule did",
            cfg.beta1,
            cfg.lr_scheduler,
        )
    if cfg.lr_scheduler == "linear" and "warmup" in cfg.given:
        LOG.warning(
            "NOTICE: --warmup has no effect: --lr-scheduler linear is the original's decay without "
            "warmup; use --lr-scheduler warmup-linear for a warmup"
        )
    if env.is_master:
        atomic_write_json(
            cfg.output / "params.json",
            {
                **cfg.to_json(),
                "world_size": env.world_size,
                "batch": plan.to_json(),
                "steps_per_epoch": steps_per_epoch,
                "total_steps": schedule.total_steps,
                "records": int(loader.total_records),
                "torch": torch.__version__,
            },
            sort_keys=True,
            default=str,
        )


# --- resume --------------------------------------------------------------------------------


def _resume(state: TrainState, path: Path, cfg: TrainConfig, plan: BatchPlan, schedule: Schedule) -> None:
    ckpt = ckpt_io.load_checkpoint_file(path)
    notices = state.load_state_dict(ckpt, where=path, plan=plan)
    LOG.info(
        "resumed from %s at step %d (epoch %d, step %d of it)",
        path,
        state.step,
        state.epoch + 1,
        state.epoch_step,
    )
    for notice in notices + _setting_changes(ckpt, cfg, schedule, state.step):
        LOG.warning("NOTICE: %s", notice)
    LOG.info(
        "a resume keeps the weights, the AdamW moments, the step, the data position and the random "
        "streams; the lr schedule and the optimizer settings are this command line's"
    )


def _setting_changes(ckpt: dict[str, Any], cfg: TrainConfig, schedule: Schedule, step: int) -> list[str]:
    saved = ckpt.get("run")
    old_format = saved is None
    saved = saved if saved is not None else ckpt.get("args", {})
    now = cfg.to_json()
    changed = [
        f"{flag_of(k)} {now[k]} (was {saved[k]})"
        for k in _RESUME_MAY_CHANGE
        if k in saved and saved[k] != now[k]
    ]
    notices = []
    if changed:
        notices.append(
            f"changed on resume, in effect from step {step + 1} (lr there {schedule.lr_at(step):.4g}): "
            + ", ".join(changed)
        )
    old_kind = saved.get("lr_scheduler")
    if old_format and old_kind in FORMER_MEANING:
        notices.append(
            f"this checkpoint's run used --lr-scheduler {old_kind} when the name meant "
            f"{FORMER_MEANING[old_kind]}; '{old_kind}' now means the original's schedule, so pass "
            f"--lr-scheduler {FORMER_MEANING[old_kind]} to continue the schedule it had"
        )
    return notices


# --- save and evaluate ---------------------------------------------------------------------


class _Saver:
    """Writes checkpoints: never one holding a non-finite step, always atomically, on rank 0."""

    def __init__(
        self,
        cfg: TrainConfig,
        env: DistEnv,
        state: TrainState,
        trainer: Trainer,
        plan: BatchPlan,
        last: Path | None,
    ) -> None:
        self.cfg, self.env, self.state, self.trainer, self.plan = cfg, env, state, trainer, plan
        self.last = last  # the newest good checkpoint, for the NaN message
        self._saved_step = state.step

    def save_step(self, final: bool = False) -> None:
        """A step checkpoint every --save-every-n-steps, and (`final`) when the run stops early."""
        every = self.cfg.save_every_n_steps
        due = bool(every) and self.state.step % every == 0
        if (due or final) and self._saved_step != self.state.step:
            self.save(ckpt_io.step_checkpoint_path(self.cfg.output, self.state.step))

    def save(self, path: Path) -> None:
        self.trainer.raise_if_nonfinite()
        ckpt = self.state.state_dict(plan=self.plan, run=self.cfg.to_json())
        error = None
        if ckpt is not None:
            try:
                if path.name.startswith("step_"):
                    # The last good checkpoint stays until this one is complete: the save may fail.
                    ckpt_io.prune_before_save(
                        self.cfg.output, self.cfg.keep_checkpoints, protect=[self.last] if self.last else []
                    )
                ckpt_io.atomic_save(ckpt, path)
            except TrainingError as exc:  # a full disk: every rank stops, none waits in the barrier
                error = str(exc)
            else:
                ckpt_io.prune_step_checkpoints(self.cfg.output, self.cfg.keep_checkpoints, protect=[path])
                LOG.info("saved %s", path)
        error = broadcast_object(error, self.env)
        if error:
            raise TrainingError(error)
        self.last, self._saved_step = path, self.state.step
        barrier(self.env)


def _run_hooks(
    hooks: list[EpochEndHook],
    model: nn.Module,
    epochs_done: int,
    cfg: TrainConfig,
    plan: BatchPlan,
    env: DistEnv,
    run_log: RunLog,
    step: int,
) -> None:
    if not hooks:
        return
    model = unwrap_model(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for hook in hooks:
                metrics = hook(model, epochs_done, cfg, plan, env)
                if metrics:
                    LOG.info(
                        "eval after epoch %d: %s",
                        epochs_done,
                        ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()),
                    )
                    run_log.scalars(step, dict(metrics), prefix="eval")
    finally:
        model.train(was_training)
        barrier(env)


__all__ = ["EpochEndHook", "TrainingError", "build_training_step", "run", "train_one_epoch"]
