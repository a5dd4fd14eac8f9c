"""The bidirectional WKV on flash-linear-attention's Triton kernels (package `fla-core`).

RWKV-CLIP's WKV is two RWKV-6 recurrences added together (see `wkv.py`): left to
right with the bonus u, and right to left without it. fla's `fused_recurrent_rwkv6`
computes one direction, `o_t = r_t^T (S_{t-1} + diag(u) k_t v_t^T)` with
`S_t = diag(exp(g_t)) S_{t-1} + k_t v_t^T`, for `g` the log-decay and `scale` a
factor on r (we pass 1; fla's default is 1/sqrt(N)). The right-to-left part is the
same recurrence over the time-reversed sequence with u = 0. Tensors are
`[B, T, H, N]`, which is our `[B, T, C]` viewed per head: no transpose.

fla's own `reverse=True` mode is not used: in fla-core 0.6.0 its gradient of the
log-decay disagrees with the reference by about the size of the gradient itself (its
outputs and other gradients are right), while flipping the sequence is exact.

The pair of recurrences is one custom op (`open_alip::wkv_fla`) with its backward
a second op, so `torch.compile` treats the Triton calls as opaque nodes. Between
forward and backward only the inputs are kept, as in the original CUDA kernel.

Nothing here imports triton or fla until a kernel is asked for: importing the model
stays cheap, and `TRITON_INTERPRET` is honoured if it is set before that first use.
On CPU tensors the kernels run under Triton's interpreter (`TRITON_INTERPRET=1`),
which is how they are checked without a GPU; there Triton's autotuner cannot time
candidate configs ("0 active drivers"), so every fla autotuner is pinned to its
first config (all configs compute the same numbers; they differ in speed only).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from types import ModuleType

import torch

Tensor = torch.Tensor

_TRUTHY = ("1", "true", "on", "yes")  # the values Triton accepts for TRITON_INTERPRET

# device type -> why fla cannot run there (None: it can). Filled on first use.
_problems: dict[str, str | None] = {}


def interpreter_requested() -> bool:
    """Whether TRITON_INTERPRET asks Triton to interpret kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUTHY


def _import_fla() -> ModuleType:
    with warnings.catch_warnings():
        # On a machine without a GPU fla warns that it "rolls back to CPU"; under the
        # interpreter that is the intended mode.
        warnings.filterwarnings("ignore", message="Triton is not supported on current platform")
        from fla.ops.rwkv6 import fused_recurrent

    return fused_recurrent


def _autotuners():
    """Every Triton autotuner in the loaded fla modules (unwrapping @triton.heuristics)."""
    from triton.runtime.autotuner import Autotuner, Heuristics

    for name, module in list(sys.modules.items()):
        if module is None or not (name == "fla" or name.startswith("fla.")):
            continue
        for obj in list(vars(module).values()):
            while isinstance(obj, Heuristics):
                obj = obj.fn
            if isinstance(obj, Autotuner):
                yield obj


def _pin_autotuners() -> None:
    # An autotuner with one config launches it without benchmarking (Autotuner.run).
    for tuner in _autotuners():
        if len(tuner.configs) > 1:
            tuner.configs = tuner.configs[:1]


def _is_interpreted(fused_recurrent: ModuleType) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    kernel = fused_recurrent.fused_recurrent_rwkv6_fwd_kernel
    while not isinstance(kernel, InterpretedFunction) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return isinstance(kernel, InterpretedFunction)


def _probe(device_type: str) -> str | None:
    if device_type not in ("cpu", "cuda"):
        return f"it runs on CUDA tensors (and on CPU under TRITON_INTERPRET=1), not on {device_type}"
    if device_type == "cpu" and not interpreter_requested():
        return (
            "it runs on CUDA tensors; for CPU tensors set TRITON_INTERPRET=1 in the environment "
            "before starting Python (Triton's interpreter: exact but slow, meant for checks)"
        )
    try:
        fused_recurrent = _import_fla()
    except ImportError as exc:
        return (
            "it needs the fla-core and triton packages (fla-core is in requirements.txt; triton comes with a "
            f"CUDA build of torch): {exc}"
        )
    except Exception as exc:  # a broken install (e.g. a triton that fla does not support)
        first_line = (str(exc).splitlines() or [""])[0]
        return f"fla-core failed to import ({type(exc).__name__}: {first_line})"
    if device_type == "cpu":
        if not _is_interpreted(fused_recurrent):
            return (
                "fla was imported before TRITON_INTERPRET=1 was set, so its kernels are not interpreted; "
                "set it in the environment before starting Python"
            )
        _pin_autotuners()
    return None


def fla_problem(device: torch.device | str) -> str | None:
    """Why fla's kernels cannot run on `device` now, or None when they can.

    The first call for a device type imports fla (a few seconds); later calls are a
    dictionary look-up.
    """
    return _problem_for(torch.device(device).type)


# The answer holds for the whole process, so torch.compile may call this while tracing
# and keep the result as a constant instead of tracing fla's import.
@torch.compiler.assume_constant_result
def _problem_for(device_type: str) -> str | None:
    if device_type not in _problems:
        _problems[device_type] = _probe(device_type)
    return _problems[device_type]


def _device_guard(t: Tensor):
    # Triton launches on the current CUDA device; a tensor on another GPU needs it switched.
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _both_directions_forward(r: Tensor, k: Tensor, v: Tensor, logd: Tensor, u: Tensor) -> Tensor:
    fused_recurrent = _import_fla()
    # The kernels index memory as dense [B, T, H, N]; a compiler may hand over other strides.
    r, k, v, logd, u = (t.contiguous() for t in (r, k, v, logd, u))
    options = {"scale": 1.0, "initial_state": None, "output_final_state": False, "reverse": False}
    with _device_guard(r):
        left, _ = fused_recurrent.fused_recurrent_rwkv6_fwd(r, k, v, logd, u, **options)
        flipped = [t.flip(1) for t in (r, k, v, logd)]
        right, _ = fused_recurrent.fused_recurrent_rwkv6_fwd(*flipped, torch.zeros_like(u), **options)
    return left + right.flip(1)


@torch.library.custom_op("open_alip::wkv_fla", mutates_args=())
def wkv_fla_op(r: Tensor, k: Tensor, v: Tensor, logd: Tensor, u: Tensor) -> Tensor:
    """Bidirectional WKV from contiguous float32 `[B, T, H, N]` inputs and log-decay; u is `[H, N]`."""
    return _both_directions_forward(r, k, v, logd, u)


@wkv_fla_op.register_fake
def _(r: Tensor, k: Tensor, v: Tensor, logd: Tensor, u: Tensor) -> Tensor:
    return torch.empty_like(v)


@torch.library.custom_op("open_alip::wkv_fla_backward", mutates_args=())
def wkv_fla_backward_op(
    grad: Tensor, r: Tensor, k: Tensor, v: Tensor, logd: Tensor, u: Tensor
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients (r, k, v, logd, u) of `wkv_fla_op` for the output gradient `grad`."""
    fused_recurrent = _import_fla()
    grad, r, k, v, logd, u = (t.contiguous() for t in (grad, r, k, v, logd, u))
    options = {"scale": 1.0, "initial_state": None, "reverse": False}
    with _device_guard(r):
        dr, dk, dv, dlogd, du, _ = fused_recurrent.fused_recurrent_rwkv6_bwd(r, k, v, logd, u, grad, **options)
        flipped = [t.flip(1) for t in (r, k, v, logd)]
        back = fused_recurrent.fused_recurrent_rwkv6_bwd(
            *flipped, torch.zeros_like(u), grad.flip(1), **options
        )
    dr, dk, dv, dlogd = (a + b.flip(1) for a, b in zip((dr, dk, dv, dlogd), back[:4]))
    return dr, dk, dv, dlogd, du.to(u.dtype)


@wkv_fla_backward_op.register_fake
def _(grad: Tensor, r: Tensor, k: Tensor, v: Tensor, logd: Tensor, u: Tensor):
    return tuple(torch.empty_like(t) for t in (r, k, v, logd, u))


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad: Tensor):
    return wkv_fla_backward_op(grad, *ctx.saved_tensors)


wkv_fla_op.register_autograd(_backward, setup_context=_setup_context)


def chunk_rwkv6():
    """fla's chunked RWKV-6 (`chunk_rwkv6`), imported on first use."""
    _import_fla()
    from fla.ops.rwkv6 import chunk_rwkv6 as fn

    return fn
