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

import sys
import warnings
from types import ModuleType

import torch

from .triton_env import constant_under_compile, device_guard, kernel_problem

Tensor = torch.Tensor

# device type -> why fla cannot run there (None: it can). Filled on first use.
_problems: dict[str, str | None] = {}


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


def _probe(device_type: str) -> str | None:
    problem = kernel_problem(
        device_type,
        lambda: _import_fla().fused_recurrent_rwkv6_fwd_kernel,
        needs="the fla-core and triton packages",
        package="fla-core",
        module="fla",
    )
    if problem is None and device_type == "cpu":
        _pin_autotuners()
    return problem


def fla_problem(device: torch.device | str) -> str | None:
    """Why fla's kernels cannot run on `device` now, or None when they can.

    The first call for a device type imports fla (a few seconds); later calls are a
    dictionary look-up.
    """
    return _problem_for(torch.device(device).type)


# The answer holds for the whole process, so torch.compile may call this while tracing
# and keep the result as a constant instead of tracing fla's import.
@constant_under_compile
def _problem_for(device_type: str) -> str | None:
    if device_type not in _problems:
        _problems[device_type] = _probe(device_type)
    return _problems[device_type]


def _both_directions_forward(r: Tensor, k: Tensor, v: Tensor, logd: Tensor, u: Tensor) -> Tensor:
    fused_recurrent = _import_fla()
    # The kernels index memory as dense [B, T, H, N]; a compiler may hand over other strides.
    r, k, v, logd, u = (t.contiguous() for t in (r, k, v, logd, u))
    options = {"scale": 1.0, "initial_state": None, "output_final_state": False, "reverse": False}
    with device_guard(r):
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
    with device_guard(r):
        dr, dk, dv, dlogd, du, _ = fused_recurrent.fused_recurrent_rwkv6_bwd(
            r, k, v, logd, u, grad, **options
        )
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


# The largest key x value tile of each fused recurrent kernel in fla-core 0.6.0 (a head is cut
# into tiles of min(next power of two of N, cap)): the forward, the dq and the dk/dv kernel.
FLA_TILES = {"fwd": (32, 32), "dq": (16, 64), "dkv": (32, 32)}


def _blocks(size: int, cap: int) -> int:
    """How many tiles fla-core 0.6.0 cuts a head of `size` into, tiles of min(next pow2, cap)."""
    tile = min(1 << max(size - 1, 0).bit_length(), cap)
    return -(-size // tile)


def traffic_bytes(batch: int, time: int, heads: int, size: int) -> dict[str, int]:
    """Bytes `wkv_fla_op`'s forward and backward load plus store in device memory, by part.

    Its inputs are float32. Counted from fla-core 0.6.0's fused recurrent RWKV-6 launch
    shapes: each kernel program reads its key tile of r, k, logd and its value tile of
    v and dy over all steps, so inputs are read once per tile of the other dimension;
    outputs are float32 partials per tile, summed afterwards by torch. Flips, the final
    additions and fla's element-wise bonus gradient are eager torch ops. The same
    kernels run once per direction.
    """
    e = 4 * batch * time * heads * size  # one float32 [B, T, H, N] tensor
    nk, nv = (_blocks(size, cap) for cap in FLA_TILES["fwd"])  # forward and dk/dv kernels
    qk, qv = (_blocks(size, cap) for cap in FLA_TILES["dq"])
    small = 4 * batch * heads * size
    per_pass = {
        # q, k, logd per value tile; v per key tile; o partials per key tile; o.sum(0)
        "forward/fla kernel": (3 * nv + nk + nk) * e + nv * small,
        "forward/fla sum of tile partials": (nk + 1) * e,
        # k, logd per value tile, v and dy per key tile, dq and dq1 partials; their sums
        "backward/fla dq kernel": (2 * qv + 2 * qk + 2 * qv) * e + qv * small,
        "backward/fla dq sums": 2 * (qv + 1) * e,
        # q, k, logd per value tile, v, dy per key tile; dk, dk1 and dv partials; their sums
        "backward/fla dk dv kernel": (3 * nv + 2 * nk + 2 * nv + nk) * e + nv * small,
        "backward/fla dk dv sums": (2 * nv + nk + 3) * e,
        "backward/fla dw kernel": 5 * e,  # q, k, dq1, dk1 in, dw out
        # (dy * v).sum(-1) * q * k * scale, then a sum over batch and time
        "backward/fla du element-wise": 12 * e,
    }
    total = {part: 2 * n for part, n in per_pass.items()}
    total["forward/flip r k v logd, flip and add the outputs"] = 4 * 2 * e + 2 * e + 3 * e
    total["backward/flip r k v logd dy"] = 5 * 2 * e
    total["backward/flip and add dr dk dv dlogd"] = 4 * (2 * e + 3 * e)
    return total
