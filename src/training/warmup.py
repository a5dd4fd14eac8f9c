"""Tune the WKV kernels at the run's own micro-batch before the first training step.

fla-core 0.6.0 keys its Triton autotuners' choice on tile and head sizes only (BK and BV are 32 for both
towers' heads of 80 and 64), not on the batch, the tokens or the heads, and caches each choice
on disk by that key (FLA_CACHE_RESULTS, on by default). Left so, the first call of the
process, or of any earlier run on the machine, decides the configuration for both towers at
every batch: a launch of a few samples (the planner's measurement) would choose for one of
hundreds, and the image tower's 49 tokens for the text tower's 77. So before tuning, each of
fla's RWKV-6 autotuners is keyed on the launch's shape as well (`key_tuning_by_shape`: B, T
and H where the kernel takes them), which separates the towers and the batches in memory and
on disk alike; a kernel that takes no batch argument (the dw kernel, the chunked ones) keeps
no choice on disk at all. Then the choices in memory are forgotten and the kernels run once,
forward and backward, at the shapes the run will use. What was chosen is written to
train.log (`tuning_choices`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

import torch

from src.open_alip.wkv import wkv
from src.perf.cost_model import tower_wkv_shape
from src.perf.step_trace import AUTOCAST_DTYPES, TOWERS

TUNED_IMPLS = ("fla", "fla_chunk")  # the implementations an autotuner configures
_FLA_MODULES = ("fla.ops.rwkv6.fused_recurrent", "fla.ops.rwkv6.chunk")
# Kernel arguments added to each autotuner's key: batch, tokens, heads (the head size is in BK/BV/K).
SHAPE_ARGS = ("B", "T", "H")


def _loaded_autotuners() -> list[Any]:
    found = []
    for name in _FLA_MODULES:
        module = sys.modules.get(name)
        found += autotuners(module) if module else []
    return found


def key_tuning_by_shape() -> int:
    """Add SHAPE_ARGS to the key of every loaded fla RWKV-6 autotuner that lacks them, so that a
    choice (in memory and in Triton's on-disk cache, whose name hashes the key) holds for one
    launch shape only; one whose kernel takes no batch argument stops caching on disk, where a
    choice made at another batch would be read back. Returns how many autotuners changed;
    calling it again changes none."""
    changed = 0
    for tuner in _loaded_autotuners():
        extra = [a for a in SHAPE_ARGS if a in tuner.arg_names and a not in tuner.keys]
        if extra:
            tuner.keys = [*tuner.keys, *extra]
        no_batch = "B" not in tuner.arg_names and getattr(tuner, "cache_results", False)
        if no_batch:
            tuner.cache_results = False
        changed += bool(extra or no_batch)
    return changed


def tuning_choices(micro_batch: int | None = None) -> list[str]:
    """One line per choice the loaded fla RWKV-6 autotuners hold (those at `micro_batch` when
    given): the kernel, the launch shape it was chosen for, the configuration."""
    lines = []
    for tuner in _loaded_autotuners():
        name = getattr(getattr(tuner, "base_fn", None), "__name__", type(tuner).__name__)
        for key, config in tuner.cache.items():
            # Triton's key: the values of `keys` in order, then the dtypes of the tensor arguments.
            named = dict(zip(tuner.keys, key))
            if micro_batch is not None and named.get("B", micro_batch) != micro_batch:
                continue
            shape = " ".join(f"{k}={v}" for k, v in named.items())
            dtypes = ",".join(sorted({str(v).replace("torch.", "") for v in key[len(named) :]}))
            lines.append(f"{name} [{shape}{' ' + dtypes if dtypes else ''}]: {config}")
    return sorted(lines)


def forget_tuning() -> int:
    """Clear the in-memory choices of fla's RWKV-6 autotuners; returns how many were dropped.

    Only modules already imported are touched: a kernel never called has chosen nothing.
    """
    dropped = 0
    for name in _FLA_MODULES:
        module = sys.modules.get(name)
        for tuner in autotuners(module) if module else ():
            dropped += len(tuner.cache)
            tuner.cache.clear()
    return dropped


def autotuners(module: object) -> list[Any]:
    """The triton Autotuners in `module`, also under @triton.heuristics wrappers (`.fn` chains)."""
    found = []
    for obj in vars(module).values():
        for _ in range(4):  # heuristics -> autotune -> jit: a short chain
            if isinstance(getattr(obj, "cache", None), dict) and hasattr(obj, "configs"):
                found.append(obj)
                break
            obj = getattr(obj, "fn", None)
            if obj is None:
                break
    return found


def warm_wkv(
    model_cfg: Mapping[str, Any],
    impl: str,
    micro_batch: int,
    device: torch.device,
    precision: str = "bf16",
    force: bool = False,
) -> float | None:
    """Run the WKV forward and backward once per tower at `micro_batch`; seconds taken, or None
    when there is nothing to tune (a CPU run, an implementation without an autotuner)."""
    if not force and (device.type != "cuda" or impl not in TUNED_IMPLS):
        return None
    if impl in TUNED_IMPLS:
        from src.open_alip.wkv_fla import fla_problem

        problem = fla_problem(device)  # imports fla's kernels, whose autotuners get the shape keys
        if problem is not None:
            raise ValueError(f"wkv implementation {impl!r} cannot run on {device.type}: {problem}")
        key_tuning_by_shape()
    forget_tuning()
    act = AUTOCAST_DTYPES.get(precision, torch.float32)
    started = time.perf_counter()
    for tower in TOWERS:
        shape = tower_wkv_shape(model_cfg, tower)
        r, k, v = (
            torch.randn(
                micro_batch, shape.tokens, shape.channels, device=device, dtype=act, requires_grad=True
            )
            for _ in range(3)
        )
        w = torch.randn(micro_batch, shape.tokens, shape.channels, device=device, requires_grad=True)
        u = torch.randn(shape.heads, shape.head_size, device=device, requires_grad=True)
        wkv(r, k, v, w, u, impl=impl).float().sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
