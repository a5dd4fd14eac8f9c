"""torch.compile with a fallback: a compiler failure costs speed, never the run.

The recipes compile by default (the eager step moves several times the memory traffic,
benchmarks/step_traffic.py), so a missing C++/Triton toolchain or a compiler bug must not stop
training. The failure can come when the model is wrapped (an unknown backend) or at the
first compiled call (dynamo tracing, the backend, a lazily compiled backward); either way
the run logs one warning and continues with the eager model.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from src.errors import UserError

LOG = logging.getLogger("rwkv_clip.train")

# Not compiler failures: retrying eagerly would hide them or fail the same way.
NOT_COMPILER_ERRORS: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, UserError)


def warn_compile_failed(exc: BaseException, backend: str) -> None:
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    LOG.warning(
        "WARNING: torch.compile (backend %s) failed: %s: %s. Training continues EAGERLY, several times slower "
        "per step; fix the compiler (see the error) or pass --no-compile to silence this.",
        backend, type(exc).__name__, first,
    )


def compile_model(model: nn.Module, backend: str) -> nn.Module:
    """`torch.compile(model, backend=backend)`, or `model` itself (with the warning) if that fails."""
    try:
        return torch.compile(model, backend=backend)
    except NOT_COMPILER_ERRORS:
        raise
    except Exception as exc:  # noqa: BLE001 - any compiler failure falls back
        warn_compile_failed(exc, backend)
        return model
