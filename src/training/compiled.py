"""torch.compile with a fallback: a compiler failure costs speed, never the run.

The recipes compile by default (the eager step moves several times the memory traffic,
benchmarks/step_traffic.py), so a missing C++/Triton toolchain or a compiler bug must not stop
training. The failure can come when the model is wrapped (an unknown backend) or at the
first compiled call (dynamo tracing, the backend, a lazily compiled backward); either way
the run logs one warning and continues with the eager model.

Under DDP every rank must take the same way: a rank that fell back alone would run other
collectives than the others (the compiled step buckets its gradient all-reduces by graph) and
the run would hang. So a distributed run decides together, before its first collective
(src/training/loop.py, `Trainer`): each rank compiles its step without any collective, the
ranks gather who failed, and all fall back or none does.
"""

from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn

from src.errors import UserError

LOG = logging.getLogger("rwkv_clip.train")

# Not compiler failures: retrying eagerly would hide them or fail the same way.
NOT_COMPILER_ERRORS: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, UserError)


def describe(exc: BaseException) -> str:
    """`Type: first line` of a compiler failure, short enough for one log line; dynamo's wrapper
    (BackendCompilerFailed, whose own first line names no cause) with the error it wraps."""
    root = exc
    for _ in range(8):
        inner = getattr(root, "inner_exception", None) or root.__cause__
        if inner is None:
            break
        root = inner
    first = (str(root).strip().splitlines() or [""])[0][:300]
    if root is exc:
        return f"{type(exc).__name__}: {first}"
    return f"{type(exc).__name__}: {type(root).__name__}: {first}"


def warn_compile_failed(failure: BaseException | str, backend: str, where: str = "") -> None:
    text = failure if isinstance(failure, str) else describe(failure)
    LOG.warning(
        "WARNING: torch.compile (backend %s) failed%s: %s. Training continues EAGERLY%s, several times "
        "slower per step; fix the compiler (see the error) or pass --no-compile to silence this.",
        backend,
        where,
        text,
        " on every rank" if where else "",
    )


def try_compile(model: nn.Module, backend: str) -> tuple[nn.Module, BaseException | None]:
    """(`torch.compile(model, backend=backend)`, None), or (`model`, the error) if wrapping fails."""
    try:
        return torch.compile(model, backend=backend), None
    except NOT_COMPILER_ERRORS:
        raise
    except Exception as exc:  # noqa: BLE001 - any compiler failure falls back
        return model, exc


def backward_compiled_with_forward():
    """Compile the backward graph together with the forward one, not at the first backward:
    a backward that fails to compile then fails before any gradient all-reduce starts, where
    the ranks can still agree (a no-op where this torch has no such switch)."""
    from torch._functorch import config

    if not hasattr(config, "force_non_lazy_backward_lowering"):
        return contextlib.nullcontext()
    return config.patch(force_non_lazy_backward_lowering=True)
