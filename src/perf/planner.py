"""The per-GPU micro-batch that fits: what `--batch-size auto` runs (src/training/batching.py).

    plan = plan_micro_batch("RWKV_CLIP_B32", wkv_impl="chunked", precision="bf16",
                            device_memory_bytes=torch.cuda.get_device_properties(0).total_memory,
                            global_batch=4096, world_size=8)
    print(plan.explanation)                # micro-batch, accumulation, checkpointing, why

The memory a step needs comes from the cost model (src/perf/cost_model.py,
`CostModel.step_bytes`); what is not modelled there (allocator fragmentation, the CUDA
context, NCCL and DALI workspaces) is what HEADROOM and RESERVED_BYTES keep free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from src.perf.cost_model import CostModel, CostModelError, estimate_cost

__all__ = [
    "HEADROOM",
    "MIN_EFFICIENT_MICRO",
    "RESERVED_BYTES",
    "CostModelError",
    "MicroBatchPlan",
    "plan_micro_batch",
    "usable_bytes",
]

GiB = 2**30
# Share of device memory kept free for the caching allocator's fragmentation.
HEADROOM = 0.10
# CUDA context, cuBLAS and NCCL workspaces, the DALI decoder's own buffers.
RESERVED_BYTES = 3 * GiB
# Below this many samples the towers' matmuls are too small to keep a GPU busy: the
# planner would rather recompute (checkpointing) than accumulate smaller micro-batches.
MIN_EFFICIENT_MICRO = 32


@dataclass(frozen=True)
class MicroBatchPlan:
    micro_batch: int  # samples per GPU per forward/backward pass
    accum_steps: int  # micro-batches per optimizer step
    grad_checkpointing: bool
    world_size: int
    global_batch: int  # micro_batch * accum_steps * world_size: always the one asked for
    predicted_bytes: int  # predicted peak per GPU
    usable_bytes: int  # what a plan may use: the device less headroom and reserve
    explanation: str  # one line for the log


def usable_bytes(
    device_memory_bytes: int, reserved_bytes: int = RESERVED_BYTES, headroom: float = HEADROOM
) -> int:
    return int(device_memory_bytes * (1.0 - headroom)) - int(reserved_bytes)


def _gb(n: float) -> str:
    return f"{n / 1e9:.1f} GB"


def plan_micro_batch(
    config: str | Mapping[str, Any],
    *,
    wkv_impl: str,
    precision: str | None,
    device_memory_bytes: int,
    global_batch: int,
    world_size: int,
    device_type: str = "cuda",
    allow_checkpointing: bool = True,
    bucket_view: bool = False,
    reserved_bytes: int = RESERVED_BYTES,
    headroom: float = HEADROOM,
    cost: CostModel | None = None,
) -> MicroBatchPlan:
    """Per-GPU micro-batch, accumulation steps and checkpointing for `global_batch`.

    The global batch is kept exactly: micro_batch * accum_steps * world_size ==
    global_batch, with micro_batch a divisor of the per-GPU batch. Each way of saving
    memory costs about one extra forward pass (a third of a step), so the first of
    these that fits wins:
      1. the whole per-GPU batch in one pass;
      2. the same with gradient checkpointing (recomputes the forward in backward);
      3. accumulation (src/training/loop.py runs one extra no-grad forward) over the
         largest micro-batch of at least MIN_EFFICIENT_MICRO that fits;
      4. accumulation and checkpointing, the same way;
      5. accumulation over any micro-batch that fits, then with checkpointing.
    `device_memory_bytes` is the device's total memory (torch.cuda.get_device_properties
    (i).total_memory); HEADROOM of it and RESERVED_BYTES are kept free. `wkv_impl` and
    `precision` are what the run uses ("auto" resolves as on `device_type`).
    `allow_checkpointing=False` never plans checkpointing; `bucket_view=True` when DDP
    uses gradient_as_bucket_view. `cost` reuses an estimate (the measurement takes
    seconds and is cached per process; it is deterministic, so every rank may call
    this and gets the same plan). Raises CostModelError (a UserError and a ValueError)
    when the global batch does not split over the GPUs or nothing fits.
    """
    if world_size < 1 or global_batch < 1:
        raise CostModelError(f"global batch {global_batch} and world size {world_size} must be at least 1")
    if global_batch % world_size:
        raise CostModelError(
            f"global batch {global_batch} does not split evenly over {world_size} GPUs; "
            f"use a multiple of {world_size}"
        )
    if device_memory_bytes <= 0:
        raise CostModelError(f"device memory {device_memory_bytes} bytes: must be positive")
    cost = cost or estimate_cost(config, wkv_impl=wkv_impl, precision=precision, device_type=device_type)
    per_gpu = global_batch // world_size
    budget = usable_bytes(device_memory_bytes, reserved_bytes, headroom)
    divisors = [m for m in range(per_gpu, 0, -1) if per_gpu % m == 0]
    cps = (False, True) if allow_checkpointing else (False,)

    def need(micro: int, cp: bool) -> float:
        return cost.step_bytes(micro, per_gpu // micro, world_size, cp, bucket_view)["total"]

    candidates = [(per_gpu, cp) for cp in cps]
    for floor in (min(MIN_EFFICIENT_MICRO, per_gpu), 1):
        for cp in cps:
            candidates += [(m, cp) for m in divisors[1:] if m >= floor]
    choice = next(((m, cp) for m, cp in candidates if need(m, cp) <= budget), None)
    setting = (
        f"{cost.name}, wkv {cost.wkv_impl}, {cost.precision}: {_gb(budget)} usable of "
        f"{_gb(device_memory_bytes)}"
    )
    if choice is None:
        raise CostModelError(
            f"even 1 sample per GPU{' with gradient checkpointing' if allow_checkpointing else ''} needs "
            f"{_gb(need(1, allow_checkpointing))} ({setting}); use GPUs with more memory"
        )
    micro, cp = choice
    accum = per_gpu // micro
    predicted = need(micro, cp)
    if (micro, cp) == (per_gpu, False):
        why = "fits as it is"
    else:
        why = f"{per_gpu} at once without checkpointing would need {_gb(need(per_gpu, False))}"
    explanation = (
        f"micro-batch {micro} x accum {accum} x {world_size} GPU(s) = global batch {global_batch}, "
        f"gradient checkpointing {'on' if cp else 'off'}, predicted peak {_gb(predicted)} per GPU; "
        f"{why} ({setting})"
    )
    return MicroBatchPlan(
        micro_batch=micro,
        accum_steps=accum,
        grad_checkpointing=cp,
        world_size=world_size,
        global_batch=global_batch,
        predicted_bytes=int(predicted + 0.5),
        usable_bytes=budget,
        explanation=explanation,
    )
