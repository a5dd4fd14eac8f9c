"""torch.distributed set-up from torchrun's environment (or a single plain process)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from src.devices import resolve_device


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    backend: str | None  # None: a single process, no process group

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def is_master(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))


def init_distributed(device: str = "auto", timeout_s: int = 1800) -> DistEnv:
    """Join the process group torchrun describes: NCCL on GPUs, gloo on CPUs.

    `timeout_s` bounds every collective (train.py --dist-timeout): a rank that waits
    longer, e.g. for others still evaluating at an epoch end, fails instead of hanging.

    Without torchrun's variables this is a single process and no group is made, so
    `python train.py ...` works as it is.
    """
    if not launched_by_torchrun():
        return DistEnv(0, 0, 1, resolve_device(device, 0), None)
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if world_size == 1:
        return DistEnv(rank, local_rank, 1, dev, None)
    backend = "nccl" if dev.type == "cuda" else "gloo"
    kwargs = {"device_id": dev} if dev.type == "cuda" else {}
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s), **kwargs)
    return DistEnv(rank, local_rank, world_size, dev, backend)


def cleanup(env: DistEnv) -> None:
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.distributed:
        if env.device.type == "cuda":
            dist.barrier(device_ids=[env.device.index])
        else:
            dist.barrier()


def all_reduce_mean(value: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Mean of a tensor over ranks (a copy; the input is left alone)."""
    out = value.detach().clone()
    if env.distributed:
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        out /= env.world_size
    return out


def gather_object(obj: Any, env: DistEnv) -> list[Any]:
    """`obj` of every rank, in rank order, on every rank (a collective)."""
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def wrap_ddp(model: nn.Module, env: DistEnv, *, static_graph: bool) -> nn.Module:
    """`model` in DistributedDataParallel when there is a process group, else as it is.

    Every parameter gets a gradient in every step (docs/model.md), so no
    find_unused_parameters. Gradients live in the communication buckets
    (gradient_as_bucket_view: no copy between the two). `static_graph` lets DDP skip
    per-step bookkeeping when every step runs the same graph.
    """
    if not env.distributed:
        return model
    ids = [env.device.index] if env.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(
        model, device_ids=ids, bucket_cap_mb=32, gradient_as_bucket_view=True, static_graph=static_graph
    )


def broadcast_object(obj, env: DistEnv, src: int = 0):
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
