"""The training run: wire model, loader, optimizer, schedule and checkpoints together.

`run(args)` is what train.py calls. It is written to be read top to bottom:
set-up, resume, the epoch loop, clean-up.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from src.fsutil import atomic_write_json
from src.open_alip.model import strip_wrapper_prefixes, unwrap_model
from src.training import checkpoint as ckpt_io
from src.training.distributed import DistEnv, barrier, broadcast_object, cleanup, init_distributed
from src.training.errors import NonFiniteLossError, TrainingError
from src.training.loop import Trainer, make_grad_scaler
from src.training.observe import LOG, RunLog, Throughput, format_duration, setup_logging
from src.training.params import check_args, resolve_model_config
from src.training.schedule import build_scheduler

# Called at the end of each epoch on every rank with the unwrapped model (in eval mode,
# under no_grad), the number of completed epochs, the arguments and the process group.
# Metrics it returns are logged (rank 0) under "eval/". A hook decides itself whether
# this epoch is one to evaluate (e.g. from args.zeroshot_frequency) and may return None.
# train.py passes `run(args, epoch_end_hooks=[...])`; the zero-shot evaluation plugs in here.
EpochEndHook = Callable[[nn.Module, int, argparse.Namespace, DistEnv], "dict[str, float] | None"]


def seed_everything(seed: int, rank: int) -> None:
    # Ranks differ so that their drop-path masks are independent.
    s = seed + rank
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _gather(obj: Any, env: DistEnv) -> list[Any]:
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def _jsonable_args(args: argparse.Namespace) -> dict[str, Any]:
    plain = (str, int, float, bool, type(None))
    return {
        k: list(v) if isinstance(v, (list, tuple)) else v
        for k, v in vars(args).items()
        if isinstance(v, plain) or (isinstance(v, (list, tuple)) and all(isinstance(x, plain) for x in v))
    }


def _data_label(args: argparse.Namespace) -> str:
    return " ".join(args.train_data)


def _steps_per_epoch(args: argparse.Namespace, loader, env: DistEnv) -> int:
    records = int(loader.total_records)
    micro_per_epoch = len(loader)
    if args.train_num_samples is not None:
        if args.train_num_samples > records:
            raise TrainingError(
                f"--train-num-samples {args.train_num_samples} is more than the {records} records in "
                f"{_data_label(args)}; pass {records} or leave the flag out"
            )
        if args.train_num_samples < records:
            LOG.warning(
                "--train-num-samples %d is less than the %d records in %s: each epoch uses %d samples",
                args.train_num_samples, records, _data_label(args), args.train_num_samples,
            )
            micro_per_epoch = min(micro_per_epoch, args.train_num_samples // (args.batch_size * env.world_size))
    steps = micro_per_epoch // args.accum_freq
    if steps < 1:
        global_batch = args.batch_size * env.world_size * args.accum_freq
        raise TrainingError(
            f"{_data_label(args)} has {records} records, fewer than one optimizer step's {global_batch} "
            "(batch-size x processes x accum-freq); lower --batch-size or --accum-freq"
        )
    return steps


def _build_model(args: argparse.Namespace, model_cfg: dict[str, Any], env: DistEnv) -> nn.Module:
    from src.open_alip import create_model
    from src.open_alip.model import CheckpointMismatchError

    try:
        model = create_model(model_cfg, pretrained=args.pretrained)
    except (FileNotFoundError, CheckpointMismatchError) as exc:
        raise TrainingError(f"--pretrained {args.pretrained}: {exc}") from exc
    return model.to(env.device)


def _build_loader(args: argparse.Namespace, model_cfg: dict[str, Any], env: DistEnv):
    from dataloaders.imagenet import build_loader

    data = args.train_data[0] if len(args.train_data) == 1 else list(args.train_data)
    return build_loader(
        data,
        args.batch_size,
        input_size=int(model_cfg.get("input_size", 224)),
        train=True,
        backend=args.data_backend,
        device=env.device,
        num_threads=int(model_cfg.get("workers") or 4),
        rank=env.rank,
        world_size=env.world_size,
        seed=args.seed,
        all_captions=False,
        drop_last=True,
    )


def _check_resumable(state: dict[str, Any], args: argparse.Namespace, env: DistEnv, path: Path) -> None:
    saved = state.get("args", {})
    for key in ("batch_size", "accum_freq"):
        if key in saved and saved[key] != getattr(args, key):
            raise TrainingError(
                f"--resume {path}: the checkpoint was trained with --{key.replace('_', '-')} {saved[key]}, "
                f"not {getattr(args, key)}; resume with the same value"
            )
    if state.get("world_size", env.world_size) != env.world_size:
        raise TrainingError(
            f"--resume {path}: the checkpoint was written by {state['world_size']} processes, this run has "
            f"{env.world_size}; resume with the same number, or start a new run from it with --pretrained"
        )


def run(args: argparse.Namespace, epoch_end_hooks: list[EpochEndHook] | None = None) -> None:
    """Train as `args` say. Raises TrainingError / NonFiniteLossError with a user-facing message."""
    check_args(args)
    env = init_distributed(args.device)
    try:
        _run(args, env, list(epoch_end_hooks or []))
    finally:
        cleanup(env)


def _run(args: argparse.Namespace, env: DistEnv, hooks: list[EpochEndHook]) -> None:
    from src.open_alip import ClipLoss, get_model_config

    output = Path(args.output)
    if env.is_master:
        output.mkdir(parents=True, exist_ok=True)
    barrier(env)
    setup_logging(output, env.rank)
    if args.zeroshot_data and not hooks:
        raise TrainingError(
            "--zeroshot-data was given but no zero-shot evaluation is wired into this train.py; leave the flag out"
        )

    try:
        base_cfg = get_model_config(args.config)
    except (FileNotFoundError, KeyError, ValueError) as exc:
        raise TrainingError(f"--config {args.config}: {exc}") from exc
    model_cfg = resolve_model_config(args, base_cfg)
    precision = model_cfg["precision"]
    if precision == "tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # Rank 0 picks the checkpoint so that every rank resumes from the same one (and all
    # ranks stop together when the path is wrong, instead of the others waiting forever).
    choice: tuple[str, Any] = ("ok", None)
    if env.is_master:
        try:
            choice = ("ok", ckpt_io.resolve_resume(args.resume, output))
        except FileNotFoundError as exc:
            choice = ("error", str(exc))
        if not args.resume and ckpt_io.list_checkpoints(output):
            # Mixing two runs' checkpoints would make a later `--resume latest` pick either.
            choice = ("error", f"--output {output} already holds checkpoints; pass --resume latest to "
                               "continue that run, or choose another --output")
    choice = broadcast_object(choice, env)
    if choice[0] == "error":
        raise TrainingError(choice[1])
    resume_path = choice[1]
    state = ckpt_io.load_checkpoint_file(resume_path) if resume_path else None
    if state is not None:
        _check_resumable(state, args, env, resume_path)

    # The loader first: a wrong data path should not wait for a large model to be built.
    loader = _build_loader(args, model_cfg, env)
    steps_per_epoch = _steps_per_epoch(args, loader, env)
    seed_everything(args.seed, env.rank)
    model = _build_model(args, model_cfg, env)
    total_steps = steps_per_epoch * args.epochs
    stop_step = min(total_steps, args.max_steps) if args.max_steps else total_steps

    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps, weight_decay=args.weight_decay
    )
    scheduler = build_scheduler(optimizer, kind=args.lr_scheduler, total_steps=total_steps, warmup=args.warmup)
    scaler = make_grad_scaler(precision, env.device)

    global_step, start_epoch, epoch_step = 0, 0, 0
    if state is not None:
        try:
            unwrap_model(model).load_state_dict(strip_wrapper_prefixes(state["state_dict"]), strict=True)
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[-1].strip()[:300]
            raise TrainingError(
                f"--resume {resume_path}: its weights do not fit this model ({first}); "
                "resume with the model flags and --config the run was started with"
            ) from exc
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        global_step = int(state["step"])
        start_epoch = int(state["epoch"])
        epoch_step = int(state["epoch_step"])
        if state["epoch_complete"]:
            start_epoch, epoch_step = start_epoch + 1, 0
        else:
            loader.load_state_dict(state["data"][env.rank])
        ckpt_io.restore_rng_state(state["rng"][env.rank])
        LOG.info("resumed from %s at step %d (epoch %d, step %d of it)", resume_path, global_step,
                 start_epoch + 1, epoch_step)
        del state

    train_model: nn.Module = model
    if env.distributed:
        ids = [env.device.index] if env.device.type == "cuda" else None
        # Every parameter gets a gradient (docs/model.md), so no find_unused_parameters.
        train_model = nn.parallel.DistributedDataParallel(model, device_ids=ids, bucket_cap_mb=32)
    if args.compile:
        train_model = torch.compile(train_model)

    loss_fn = ClipLoss(
        local_loss=args.local_loss, gather_with_grad=args.gather_with_grad, rank=env.rank, world_size=env.world_size
    )
    if args.local_loss and not args.gather_with_grad and env.world_size > 1:
        LOG.warning("--local-loss without --gather-with-grad drops cross-rank gradient terms (an approximation)")
    trainer = Trainer(
        train_model, optimizer, scheduler, loss_fn, env,
        precision=precision, grad_clip_norm=args.grad_clip_norm, accum_freq=args.accum_freq, scaler=scaler,
    )

    global_batch = args.batch_size * env.world_size * args.accum_freq
    resolved = {
        "args": _jsonable_args(args),
        "model": model_cfg,
        "world_size": env.world_size,
        "global_batch_size": global_batch,
        "steps_per_epoch": steps_per_epoch,
        "total_steps": total_steps,
        "records": int(loader.total_records),
        "torch": torch.__version__,
    }
    if env.is_master:
        atomic_write_json(output / "params.json", resolved, sort_keys=True, default=str)
    LOG.info(
        "model %s: %s parameters | %d process(es) on %s, %s | global batch %d (%d x %d x accum %d) | "
        "%d records, %d steps per epoch, %d steps in all",
        args.config, f"{count_params(model):,}", env.world_size, env.device.type, precision, global_batch,
        args.batch_size, env.world_size, args.accum_freq, int(loader.total_records), steps_per_epoch, total_steps,
    )

    run_log = RunLog(output, enabled=env.is_master)
    meter = Throughput(args.batch_size * args.accum_freq, env.world_size, stop_step, global_step)
    last_saved: Path | None = resume_path

    def save(path: Path, epoch: int, epoch_done: bool) -> None:
        nonlocal last_saved
        payload_data = _gather(loader.state_dict(), env)
        payload_rng = _gather(ckpt_io.capture_rng_state(), env)
        if env.is_master:
            ckpt_io.atomic_save(
                {
                    "state_dict": unwrap_model(model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "scaler": scaler.state_dict() if scaler is not None else None,
                    "step": global_step,
                    "epoch": epoch,
                    "epoch_step": epoch_step,
                    "epoch_complete": epoch_done,
                    "data": payload_data,
                    "rng": payload_rng,
                    "world_size": env.world_size,
                    "config": model_cfg,
                    "args": _jsonable_args(args),
                },
                path,
            )
            ckpt_io.prune_step_checkpoints(output, args.keep_checkpoints)
            LOG.info("saved %s", path)
        last_saved = path
        barrier(env)

    loss_sum, loss_count = 0.0, 0
    try:
        for epoch in range(start_epoch, args.epochs):
            if global_step >= stop_step:
                break
            if epoch_step == 0:
                loader.set_epoch(epoch)
            batches = iter(loader)
            while epoch_step < steps_per_epoch and global_step < stop_step:
                t0 = time.perf_counter()
                micro = []
                for _ in range(args.accum_freq):
                    images, tokens = next(batches)
                    micro.append((images.to(env.device, non_blocking=True), tokens.to(env.device, non_blocking=True)))
                meter.add_data_wait(time.perf_counter() - t0)
                result = trainer.step(micro)
                global_step += 1
                epoch_step += 1
                loss_sum += result.loss
                loss_count += 1
                if global_step % args.log_every_n_steps == 0 or epoch_step == steps_per_epoch:
                    speed = meter.report(global_step)
                    values = {
                        "loss": result.loss,
                        "loss_avg": loss_sum / loss_count,
                        "lr": optimizer.param_groups[0]["lr"],
                        "logit_scale": float(unwrap_model(model).logit_scale.detach().exp()),
                        "epoch": epoch + epoch_step / steps_per_epoch,
                        **speed,
                    }
                    if result.grad_norm is not None:
                        values["grad_norm"] = float(result.grad_norm)
                    if scaler is not None:
                        values["amp_scale"] = float(scaler.get_scale())
                    LOG.info(
                        "epoch %d/%d step %d/%d (%.1f%%) | loss %.4f (avg %.4f) | lr %.3e | logit_scale %.2f | "
                        "%.1f samples/s per rank, %.1f total | data wait %.0f%% | elapsed %s | ETA %s",
                        epoch + 1, args.epochs, global_step, stop_step, 100.0 * global_step / stop_step,
                        values["loss"], values["loss_avg"], values["lr"], values["logit_scale"],
                        speed["samples_per_s_per_rank"], speed["samples_per_s"], 100 * speed["data_wait_frac"],
                        format_duration(speed["elapsed_s"]), format_duration(speed["eta_s"]),
                    )
                    run_log.scalars(global_step, values)
                    loss_sum, loss_count = 0.0, 0
                if args.save_every_n_steps and global_step % args.save_every_n_steps == 0:
                    save(ckpt_io.step_checkpoint_path(output, global_step), epoch, epoch_step == steps_per_epoch)
            if epoch_step < steps_per_epoch:
                # Stopped by --max-steps inside the epoch: leave a checkpoint to go on from.
                if not (args.save_every_n_steps and global_step % args.save_every_n_steps == 0):
                    save(ckpt_io.step_checkpoint_path(output, global_step), epoch, False)
                break
            epoch_step = 0
            save(ckpt_io.epoch_checkpoint_path(output, epoch + 1), epoch, True)
            _run_hooks(hooks, model, epoch + 1, args, env, run_log, global_step)
    except NonFiniteLossError as exc:
        where = f"the last good checkpoint is {last_saved}" if last_saved else "no checkpoint was written yet"
        raise NonFiniteLossError(
            f"{exc} at step {global_step + 1} (epoch {epoch + 1}); stopped without saving, {where}; "
            "resume from it with a lower --lr, fp32/bf16 instead of fp16, or a smaller --grad-clip-norm"
        ) from None
    finally:
        run_log.close()
    LOG.info("finished at step %d", global_step)


def _run_hooks(hooks, model, epochs_done, args, env, run_log: RunLog, step: int) -> None:
    if not hooks:
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for hook in hooks:
                metrics = hook(model, epochs_done, args, env)
                if metrics:
                    LOG.info("eval after epoch %d: %s", epochs_done,
                             ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
                    run_log.scalars(step, dict(metrics), prefix="eval")
    finally:
        model.train(was_training)
        barrier(env)


__all__ = ["EpochEndHook", "TrainingError", "run"]
