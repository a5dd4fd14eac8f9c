"""Warm the WKV kernels at the run's own micro-batch before the first training step.

fla's Triton autotuner keys its choice on the head sizes only, not on the batch, so the first
call decides the configuration for the whole run. If that first call is the planner's small
measurement, the choice fits a launch of a few samples and is reused at hundreds (and cached
on disk too). Here the remembered choices are forgotten and the kernels run once, forward and
backward, at the shapes the run will use: the choice that stays is made at the real batch.
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


def warm_wkv(model_cfg: Mapping[str, Any], impl: str, micro_batch: int, device: torch.device,
             precision: str = "bf16", force: bool = False) -> float | None:
    """Run the WKV forward and backward once per tower at `micro_batch`; seconds taken, or None
    when there is nothing to tune (a CPU run, an implementation without an autotuner)."""
    if not force and (device.type != "cuda" or impl not in TUNED_IMPLS):
        return None
    forget_tuning()
    act = AUTOCAST_DTYPES.get(precision, torch.float32)
    started = time.perf_counter()
    for tower in TOWERS:
        shape = tower_wkv_shape(model_cfg, tower)
        r, k, v = (torch.randn(micro_batch, shape.tokens, shape.channels, device=device, dtype=act,
                               requires_grad=True) for _ in range(3))
        w = torch.randn(micro_batch, shape.tokens, shape.channels, device=device, requires_grad=True)
        u = torch.randn(shape.heads, shape.head_size, device=device, requires_grad=True)
        wkv(r, k, v, w, u, impl=impl).float().sum().backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
