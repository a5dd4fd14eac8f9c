"""What training RWKV-CLIP costs: FLOPs and memory per sample, the fit on a GPU, run time.

    python -m benchmarks.training_cost --config RWKV_CLIP_B32
    python -m benchmarks.training_cost --config RWKV_CLIP_B16 --gpu h200 --mfu 0.3

Everything is measured on this machine's CPU by src/perf/cost_model.py (FakeTensors:
no GPU, no arithmetic); the time predictions assume a model-FLOPs utilisation (MFU) of
the GPU's dense bf16 peak, which is a stated assumption, not a measurement. The paper's
own run gives the MFU it implies for comparison. Memory figures are in GB (10^9 bytes).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from src.errors import UserError
from src.errors import report as report_error
from src.open_alip.wkv import WKV_IMPL_CHOICES
from src.training.config import PAPER_GPUS, RECIPES

PROG = "benchmarks.training_cost"

# One YFCC15M epoch as the authors count it, and the paper's recipe (its owner, the recipe object
# train.py runs) and reported run.
YFCC15M_PAIRS = 15_061_515
PAPER_RECIPE = RECIPES["rwkv_clip_b32_yfcc15m"].values
EPOCHS = PAPER_RECIPE["epochs"]
GPUS = PAPER_GPUS
GLOBAL_BATCH = PAPER_RECIPE["global_batch_size"]
PAPER_HOURS = 26.0  # B/32, EPOCHS epochs, GPUS x A100
PAPER_GPU = "a100"
# The issue's own count per B/32 sample, forward+backward (image + text).
ISSUE_GFLOP = {"image": 24.0, "text": 15.0}


@dataclass(frozen=True)
class Gpu:
    name: str
    peak_flops: float  # dense bf16, FLOP/s
    memory_bytes: int  # nominal (vendor GB); torch reports a little more


GPU_SPECS = {
    "a100": Gpu("A100 SXM 80GB", 312e12, 80 * 10**9),
    "h100": Gpu("H100 SXM 80GB", 989e12, 80 * 10**9),
    "h200": Gpu("H200 141GB", 989e12, 141 * 10**9),
}
FIT_MEMORY = 80 * 10**9  # "does batch 512 per GPU fit in 80 GB"


def samples_per_s(flops_per_sample: float, gpu: Gpu, mfu: float) -> float:
    return mfu * gpu.peak_flops / flops_per_sample


def run_hours(
    rate_per_gpu: float, gpus: int = GPUS, epochs: int = EPOCHS, pairs: int = YFCC15M_PAIRS
) -> float:
    return epochs * pairs / (rate_per_gpu * gpus) / 3600


def implied_mfu(flops_per_sample: float, hours: float, gpu: Gpu) -> tuple[float, float]:
    """(samples/s per GPU, MFU) of a run of EPOCHS x YFCC15M on GPUS GPUs taking `hours`."""
    rate = EPOCHS * YFCC15M_PAIRS / (hours * 3600 * GPUS)
    return rate, rate * flops_per_sample / gpu.peak_flops


def _g(flops: float) -> str:
    return f"{flops / 1e9:6.2f} GFLOP"


def _mb(n: float) -> str:
    return f"{n / 1e6:7.1f} MB"


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def report(cost, args: argparse.Namespace) -> list[str]:
    from src.perf.cost_model import analytic_flops
    from src.perf.planner import plan_micro_batch, usable_bytes

    gpu = GPU_SPECS[args.gpu]
    lines = [
        f"{cost.name}: {cost.params:,} parameters; wkv {cost.wkv_impl}; " + "; ".join(cost.notes),
        "FLOPs per training sample, forward+backward (matmuls counted by torch's FlopCounterMode on "
        "FakeTensors; the WKV counted analytically in its recurrent form, 10 N^2 per token, head and "
        "both directions, backward = 2 x forward):",
    ]
    parts = analytic_flops(cost.config)
    for tower in cost.towers:
        p = parts[tower.name]
        lines.append(
            f"  {tower.name:5s} tower {_g(tower.flops)}   {tower.layers} blocks x {tower.wkv.tokens} tokens; "
            f"projections {p['projections'] / 1e9:.2f}, LoRAs {p['lora'] / 1e9:.2f}, "
            f"patch embedding {p['patch_embed'] / 1e9:.2f}, WKV {tower.wkv_flops / 1e9:.2f}"
        )
    lines.append(f"  WKV         {_g(cost.wkv_flops_per_sample)}   (both towers; included above)")
    lines.append(f"  total       {_g(cost.flops_per_sample)}")
    lines.append(
        f"  (the chunked WKV implementation itself runs "
        f"{sum(t.counted_wkv_flops for t in cost.towers) / 1e9:.2f} GFLOP of matmuls per sample for those "
        f"{cost.wkv_flops_per_sample / 1e9:.2f}: work of the implementation, not of the model)"
        if cost.wkv_impl == "chunked"
        else f"  (the counter saw {sum(t.counted_wkv_flops for t in cost.towers) / 1e9:.2f} GFLOP inside "
        f"wkv {cost.wkv_impl}; replaced by the analytic count)"
    )
    if cost.name == "RWKV_CLIP_B32":
        issue = sum(ISSUE_GFLOP.values())
        named = sum(parts[t]["projections"] + parts[t]["patch_embed"] for t in parts) / 1e9
        lora = sum(parts[t]["lora"] for t in parts) / 1e9
        lines.append(
            f"  vs the issue's ~{issue:.0f} GFLOP ({ISSUE_GFLOP['image']:.0f} image + "
            f"{ISSUE_GFLOP['text']:.0f} text): its count matches the projections and the patch embedding "
            f"alone ({named:.1f}); this one adds the token-shift and decay LoRAs ({lora:.2f}) and the WKV "
            f"({cost.wkv_flops_per_sample / 1e9:.2f})"
        )

    lines += [
        "Memory (bf16 autocast keeps float32 master weights):"
        if cost.precision in ("bf16", "fp16")
        else "Memory:",
        f"  parameters {_mb(cost.param_bytes)}, gradients {_mb(cost.grad_bytes)}, AdamW state "
        f"{_mb(cost.optimizer_bytes)}",
        "  activations per sample   saved for backward   alive after forward   with checkpointing",
    ]
    for tower in cost.towers:
        lines.append(
            f"    {tower.name:5s} tower         {_mb(tower.saved.per_sample)}           "
            f"{_mb(tower.retained.per_sample)}            {_mb(tower.retained_cp.per_sample)}"
        )
    b = args.batch_size
    lines.append(
        f"  peak of one forward+backward at batch {b}: {_gb(cost.activation_bytes(b, False))} "
        f"({_gb(cost.activation_bytes(b, True))} with gradient checkpointing), "
        f"i.e. {_mb(cost.activation_bytes(b, False) / b).strip()} per sample"
    )

    usable = usable_bytes(FIT_MEMORY)
    for cp in (False, True):
        need = cost.step_bytes(b, 1, GPUS, cp)["total"]
        verdict = "fits" if need <= usable else "does NOT fit"
        lines.append(
            f"Batch {b} per GPU on an {_gb(FIT_MEMORY)} GPU "
            f"({GPUS} GPUs){' with checkpointing' if cp else ''}: predicted peak {_gb(need)} of "
            f"{_gb(usable)} usable: {verdict}"
        )
    try:
        plan = plan_micro_batch(
            cost.config,
            wkv_impl=cost.wkv_impl,
            precision=cost.precision,
            device_memory_bytes=gpu.memory_bytes,
            global_batch=GLOBAL_BATCH,
            world_size=GPUS,
            cost=cost,
        )
        lines.append(f"Planner on {gpu.name}: {plan.explanation}")
    except ValueError as exc:
        lines.append(f"Planner on {gpu.name}: {exc}")

    rate = samples_per_s(cost.flops_per_sample, gpu, args.mfu)
    lines.append(
        f"At MFU {args.mfu:.2f} on {gpu.name} (dense bf16 peak {gpu.peak_flops / 1e12:.0f} TFLOP/s): "
        f"{rate:,.0f} samples/s per GPU; {EPOCHS} epochs of YFCC15M ({YFCC15M_PAIRS:,} pairs) on {GPUS} GPUs "
        f"in {run_hours(rate):.1f} h"
    )
    paper = GPU_SPECS[PAPER_GPU]
    if cost.name == "RWKV_CLIP_B32":
        paper_rate, mfu = implied_mfu(cost.flops_per_sample, PAPER_HOURS, paper)
        lines.append(
            f"The paper's B/32 run ({PAPER_HOURS:.0f} h for {EPOCHS} epochs on {GPUS}x A100) is "
            f"{paper_rate:,.0f} samples/s per GPU: MFU {mfu:.3f} at {paper.peak_flops / 1e12:.0f} TFLOP/s"
        )
    else:
        lines.append("(The paper's run time is for B/32: --config RWKV_CLIP_B32 prints the MFU it implies.)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--config", required=True, help="model config name (e.g. RWKV_CLIP_B32) or JSON path")
    parser.add_argument("--batch-size", type=int, default=512, help="per-GPU batch to check (default 512)")
    parser.add_argument("--gpu", choices=sorted(GPU_SPECS), default="h100", help="GPU type (default h100)")
    parser.add_argument(
        "--wkv-impl",
        default="auto",
        choices=WKV_IMPL_CHOICES,
        help="WKV implementation the model runs (default auto: what a GPU run picks, fla when it imports)",
    )
    parser.add_argument("--precision", default=None, help="bf16, fp16, fp32 or tf32 (default: the config's)")
    parser.add_argument(
        "--mfu", type=float, default=0.2, help="assumed model-FLOPs utilisation (default 0.2)"
    )
    args = parser.parse_args(argv)
    if args.batch_size < 1 or not 0 < args.mfu <= 1:
        return report_error(
            PROG,
            UserError(
                f"--batch-size {args.batch_size} and --mfu {args.mfu}: need a batch "
                "of at least 1 and an MFU in (0, 1]"
            ),
        )

    import torch

    if not torch.cuda.is_available():
        # The fla kernels can then run on the CPU: its custom op's shape-only kernel on
        # FakeTensors, the Triton kernels in the interpreter. fla reads this on import.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    from src.perf.cost_model import estimate_cost

    try:
        cost = estimate_cost(args.config, wkv_impl=args.wkv_impl, precision=args.precision)
    except UserError as exc:
        return report_error(PROG, exc)
    print("\n".join(report(cost, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
