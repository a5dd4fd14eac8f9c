"""One device vocabulary for every CLI: `auto | cpu | cuda | cuda:N`.

`resolve_device` is called once per process; the result (a `torch.device`) is what the
model, the loader and the loss all receive, so they cannot end up on different GPUs.
"""

from __future__ import annotations

import os

import torch

from src.errors import UserError

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"


class DeviceError(UserError):
    """A device that is unknown or not present on this machine."""


def local_rank_from_env() -> int:
    """torchrun's LOCAL_RANK (0 in a plain process)."""
    value = os.environ.get("LOCAL_RANK", "0")
    if not value.isdigit():
        raise DeviceError(f"LOCAL_RANK={value!r} is not a whole number; launch with torchrun or unset it")
    return int(value)


def resolve_device(
    name: str | torch.device = "auto", local_rank: int | None = None, option: str = "--device"
) -> torch.device:
    """`auto` is this process's GPU when CUDA is usable, else the CPU; `cuda` is this process's
    GPU (index LOCAL_RANK); `cuda:N` is GPU N.

    Raises DeviceError, naming `option`, for an unknown name, a GPU asked for on a machine
    without one, or a LOCAL_RANK with no GPU of its own (more processes than visible GPUs).
    """
    text = str(name).strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    if text == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if text not in ("auto", "cuda") and not (text.startswith("cuda:") and text[5:].isdigit()):
        raise DeviceError(f"{option} {name}: unknown device; use {DEVICE_CHOICES}")
    if not torch.cuda.is_available():
        raise DeviceError(
            f"{option} {name}: torch {torch.__version__} sees no CUDA GPU on this machine; use {option} cpu, "
            "or install a CUDA build of torch on a GPU machine"
        )
    count = torch.cuda.device_count()
    if text.startswith("cuda:"):
        index = int(text[5:])
        what = f"{option} {name}"
    else:
        index = local_rank_from_env() if local_rank is None else local_rank
        what = f"LOCAL_RANK {index}"
    if index >= count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        shown = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        raise DeviceError(
            f"{what}: only {count} GPU(s) are visible{shown}; start at most {count} process(es) per node "
            "or make more GPUs visible"
        )
    return torch.device("cuda", index)
