#!/usr/bin/env python3
"""Training throughput of a small RWKV-CLIP on this machine's CPU, against a bare loop.

Printed rates are samples/s of one process, each with its ratio to the baseline measured
in the same run:
  bare      the compute floor: model forward, ClipLoss, backward, AdamW step on tensors
            already in memory (no trainer, no loader)
  trainer   the same batches through src.training.loop.Trainer (loss all-reduce, NaN
            guard, clipping, logit-scale clamp, schedule)
  accum2    Trainer with --accum-freq 2 on half batches (same contrastive batch; the extra
            no-grad feature pass costs about one more forward)
  train.py  the whole run() in this process: DALI CPU loader over a .rec the benchmark
            writes, logging, TensorBoard, a checkpoint at the end
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.corpora import write_colour_records
from src.open_alip import ClipLoss, create_model
from src.training.config import RECIPES
from src.training.distributed import DistEnv
from src.training.loop import Trainer
from src.training.schedule import Schedule

# The optimiser settings of the paper's recipe, read from the recipe train.py runs.
RECIPE = RECIPES["rwkv_clip_b32_yfcc15m"].values


def _adamw(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(),
        lr=RECIPE["lr"],
        weight_decay=RECIPE["weight_decay"],
        betas=(RECIPE["beta1"], RECIPE["beta2"]),
        eps=RECIPE["eps"],
    )


def _batches(n: int, batch: int, side: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        tokens = torch.zeros(batch, 77, dtype=torch.long)
        tokens[:, :12] = torch.randint(1, 49000, (batch, 12), generator=g)
        out.append((torch.randn(batch, 3, side, side, generator=g), tokens))
    return out


def _rate(step, batches, batch: int, warmup: int) -> float:
    for b in batches[:warmup]:
        step(b)
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        step(b)
    return (len(batches) - warmup) * batch / (time.perf_counter() - t0)


def bench_bare(cfg: dict, precision: str, batches, batch: int, warmup: int) -> float:
    torch.manual_seed(0)
    model = create_model(cfg)
    opt = _adamw(model)
    loss_fn = ClipLoss()
    dtype = {"bf16": torch.bfloat16}.get(precision)

    def step(b):
        with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
            out = model(*b, normalize=False)  # as the Trainer calls it: ClipLoss normalises
        loss_fn(*out).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _rate(step, batches, batch, warmup)


def bench_trainer(cfg: dict, precision: str, batches, batch: int, warmup: int, accum: int = 1) -> float:
    torch.manual_seed(0)
    model = create_model(cfg)
    opt = _adamw(model)
    schedule = Schedule(
        RECIPE["lr_scheduler"], RECIPE["lr"], total_steps=len(batches), warmup=RECIPE["warmup"]
    )
    env = DistEnv(0, 0, 1, torch.device("cpu"), None)
    trainer = Trainer(model, opt, schedule, ClipLoss(), env, precision=precision, accum_freq=accum)
    half = batch // accum
    count = iter(range(len(batches)))

    def step(b):
        images, tokens = b
        micro = [(images[i * half : (i + 1) * half], tokens[i * half : (i + 1) * half]) for i in range(accum)]
        trainer.step(micro, next(count)).loss.item()  # read the loss as a logging step would

    return _rate(step, batches, batch, warmup)


def bench_train_py(cfg_name: str, precision: str, batch: int, steps: int, workers: int) -> float:
    from src.training.main import run
    from src.training.params import parse_config

    with tempfile.TemporaryDirectory() as tmp:
        data = write_colour_records(Path(tmp) / "data" / "colours", batch * steps, side=48)
        out = Path(tmp) / "run"
        config = parse_config(
            [
                "--train-data",
                str(data),
                "--output",
                str(out),
                "--config",
                cfg_name,
                "--precision",
                precision,
                "--batch-size",
                str(batch),
                "--epochs",
                "1",
                "--workers",
                str(workers),
                "--device",
                "cpu",
                "--log-every-n-steps",
                "5",
                "--save-every-n-steps",
                "0",
            ]
        )
        run(config)
        reports = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # The first interval holds start-up (pipeline build, first decode); leave it out.
    rates = [r["samples_per_s"] for r in reports[1:]]
    return statistics.mean(rates)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    p.add_argument("--config", default="RWKV_CLIP_tiny", help="model config name or JSON")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--steps", type=int, default=20, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--workers", type=int, default=1, help="DALI threads for the train.py row")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from src.open_alip import get_model_config

    cfg = get_model_config(args.config)
    side = cfg["input_size"]
    batches = _batches(args.steps + args.warmup, args.batch_size, side)
    print(
        f"{args.config} ({sum(p.numel() for p in create_model(cfg).parameters()):,} parameters), "
        f"{args.precision}, batch {args.batch_size}, {side}x{side} images, {torch.get_num_threads()} "
        f"torch thread(s), {args.steps} timed steps"
    )
    rows = [("bare", bench_bare(cfg, args.precision, batches, args.batch_size, args.warmup))]
    rows.append(("trainer", bench_trainer(cfg, args.precision, batches, args.batch_size, args.warmup)))
    rows.append(
        ("accum2", bench_trainer(cfg, args.precision, batches, args.batch_size, args.warmup, accum=2))
    )
    rows.append(
        (
            "train.py",
            bench_train_py(
                args.config, args.precision, args.batch_size, args.steps + args.warmup, args.workers
            ),
        )
    )
    base = rows[0][1]
    for name, rate in rows:
        print(f"{name:9s} {rate:8.1f} samples/s   x{rate / base:.2f} of bare")


if __name__ == "__main__":
    main()
