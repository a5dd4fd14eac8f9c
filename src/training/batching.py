"""How the contrastive (global) batch is split into processes, micro-batches and accumulation.

The loss contrasts every image with every caption of one optimizer step, so the global
batch is a property of the recipe: the original B/32 run used 512 per GPU on 8 GPUs, a
global batch of 4,096. `--global-batch-size` keeps that number whatever the number of
processes: each process takes global / processes samples per step, in as few micro-batches
of at most `--batch-size` as divide it evenly (real accumulation, loop.py). When the global
batch cannot be split evenly, the nearest smaller one is used and the run says so loudly.

Without `--global-batch-size`, the global batch is what the flags multiply to:
`--batch-size` x processes x `--accum-freq`.

`per_process_max` is the one number that depends on the GPU's memory: `--batch-size N`, or
with `--batch-size auto` the cost model's choice (`plan_for_device`). Every process must take
the same micro-batch and accumulation, or the loss's all-gathers stop matching and the run
hangs until --dist-timeout: with GPUs of different sizes (80 GB beside 141 GB, MIG slices)
`auto` plans for the smallest GPU of all the processes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from src.training.config import PAPER_PER_GPU_BATCH
from src.training.distributed import DistEnv, gather_object
from src.training.errors import TrainingError

# `--batch-size auto` without a GPU: the recipe's per-GPU batch, as the limit of a micro-batch.
AUTO_CPU_BATCH = PAPER_PER_GPU_BATCH


@dataclass(frozen=True)
class BatchPlan:
    micro_batch: int  # samples per process per forward pass (the loader's batch)
    accum_freq: int  # micro-batches per optimizer step
    world_size: int
    requested: int | None  # --global-batch-size, if given

    @property
    def per_process(self) -> int:
        return self.micro_batch * self.accum_freq

    @property
    def global_batch(self) -> int:
        return self.per_process * self.world_size

    def to_json(self) -> dict[str, int]:
        """What params.json and a checkpoint record of the split."""
        return {
            "micro_batch": self.micro_batch,
            "accum_freq": self.accum_freq,
            "global_batch": self.global_batch,
        }

    def describe(self) -> str:
        return (
            f"global batch {self.global_batch} = {self.micro_batch} per micro-batch x {self.world_size} "
            f"process(es) x accumulation {self.accum_freq}"
        )

    def shortfall_notice(self) -> str | None:
        """A loud sentence when the run's global batch is not the one asked for."""
        if self.requested is None or self.global_batch == self.requested:
            return None
        return (
            f"the global batch is {self.global_batch}, not the --global-batch-size {self.requested} asked "
            f"for: {self.requested} does not split into equal micro-batches over {self.world_size} "
            "process(es); choose a global batch divisible by the number of processes to keep it exact"
        )


def _even_split(per_process: int, at_most: int) -> int | None:
    """The fewest micro-batches of at most `at_most` that divide `per_process` evenly, if a
    split within twice the minimum count exists."""
    least = math.ceil(per_process / at_most)
    for count in range(least, 2 * least + 1):
        if per_process % count == 0:
            return count
    return None


def plan_batches(
    *, per_process_max: int, world_size: int, global_batch: int | None = None, accum_freq: int | None = None
) -> BatchPlan:
    """Resolve --batch-size / --global-batch-size / --accum-freq for `world_size` processes."""
    if global_batch is None:
        return BatchPlan(per_process_max, accum_freq or 1, world_size, None)
    per_process = global_batch // world_size
    if per_process < 1:
        raise TrainingError(
            f"--global-batch-size {global_batch} is smaller than the {world_size} processes; "
            "give at least one sample per process"
        )
    if accum_freq is not None:
        micro = per_process // accum_freq
        if micro < 1:
            raise TrainingError(
                f"--accum-freq {accum_freq} splits the {per_process} samples per process of "
                f"--global-batch-size {global_batch} into empty micro-batches; lower --accum-freq or leave "
                "it out"
            )
        return BatchPlan(micro, accum_freq, world_size, global_batch)
    count = _even_split(per_process, per_process_max)
    if count is None:  # no even split near the minimum: round the micro-batch down
        count = math.ceil(per_process / per_process_max)
    return BatchPlan(per_process // count, count, world_size, global_batch)


def plan_for_device(
    *,
    model_config: dict,
    wkv_impl: str,
    precision: str,
    device,
    world_size: int,
    global_batch: int | None,
    accum_freq: int | None,
    batch_size: int | None,
    force_checkpointing: bool,
    env: DistEnv | None = None,
) -> tuple[BatchPlan, bool, str | None]:
    """(plan, gradient checkpointing, a line saying why) for this run on `device`.

    `batch_size` None is `--batch-size auto`: on a GPU the planner (src/perf/planner.py)
    picks the largest micro-batch that its measured per-sample memory says fits the GPU, and
    turns on gradient checkpointing when that is cheaper than accumulating; the global batch
    stays exact. A given `--batch-size N` is used as it is. With `env` (a collective: every
    process calls it) `auto` plans for the smallest GPU memory of all the processes, so that
    all of them take the same plan.
    """
    if batch_size is not None:
        plan = plan_batches(
            per_process_max=batch_size,
            world_size=world_size,
            global_batch=global_batch,
            accum_freq=accum_freq,
        )
        return plan, force_checkpointing, None
    if device.type != "cuda":
        plan = plan_batches(
            per_process_max=AUTO_CPU_BATCH,
            world_size=world_size,
            global_batch=global_batch,
            accum_freq=accum_freq,
        )
        return (
            plan,
            force_checkpointing,
            f"--batch-size auto: no GPU, so micro-batches of at most {AUTO_CPU_BATCH}",
        )
    if accum_freq is not None:
        raise TrainingError(
            "--batch-size auto chooses the accumulation itself; leave out --accum-freq, "
            "or give --batch-size N"
        )
    import torch

    from src.perf.planner import CostModelError, plan_micro_batch

    target = global_batch if global_batch is not None else AUTO_CPU_BATCH * world_size
    if target < world_size:
        raise TrainingError(
            f"--global-batch-size {target} is smaller than the {world_size} processes; "
            "give at least one sample per process"
        )
    local = torch.cuda.get_device_properties(device).total_memory
    memories = gather_object(local, env) if env is not None else [local]
    memory = min(memories)
    try:
        # Planned for the part that splits evenly; plan_batches below announces any shortfall.
        chosen = plan_micro_batch(
            model_config,
            wkv_impl=wkv_impl,
            precision=precision,
            device_memory_bytes=memory,
            global_batch=target // world_size * world_size,
            world_size=world_size,
            device_type="cuda",
            allow_checkpointing=True,
            bucket_view=True,  # the trainer's DDP uses gradient_as_bucket_view
        )
    except CostModelError as exc:
        raise TrainingError(f"--batch-size auto: {exc}; give --batch-size N") from exc
    plan = plan_batches(
        per_process_max=chosen.micro_batch, world_size=world_size, global_batch=target, accum_freq=None
    )
    why = f"--batch-size auto: {_smallest(memories)}{chosen.explanation}"
    return plan, force_checkpointing or chosen.grad_checkpointing, why


def _smallest(memories: list[int]) -> str:
    """What the log says when the processes' GPUs differ in memory (nothing when they do not)."""
    if len(set(memories)) < 2:
        return ""
    low, high = min(memories), max(memories)
    return (
        f"planned for the smallest GPU of the {len(memories)} processes (rank {memories.index(low)}: "
        f"{low / 1e9:.1f} GB; the largest {high / 1e9:.1f} GB), so that every process takes the same "
        "micro-batch and accumulation: "
    )
