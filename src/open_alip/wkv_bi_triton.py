"""The bidirectional WKV as one Triton kernel pair of our own (`--wkv-impl bi_triton`).

The operator is `wkv.py`'s: a left-to-right RWKV-6 scan with the bonus u plus a
right-to-left scan without it. Unlike the fla path (`wkv_fla.py`), which converts
r, k, v and the log-decay to float32, runs fla's one-direction kernels once per
direction on flipped copies and sums per-tile partials afterwards, these kernels

* read r, k, v and the decay logit w in the dtype they arrive in (bf16 from the bf16
  linears, or float32), keep states and sums in float32, and compute the log-decay
  -exp(w) themselves;
* run both directions in one program per (batch element, head), stepping t by index
  arithmetic;
* write y (float32) and each of dr, dk, dv (in its input's dtype) into its final
  buffer: the first pass stores its half, the second adds its half to it and stores the
  result. dw is stored once by the second pass; the first pass's terms of it travel in
  float32 (in dw's buffer when w is float32, else in one float32 buffer of w's shape),
  because they enter a difference of long sums that bf16 rounding would spoil (see the
  backward kernel). The bonus gradient du, a sum over batch and time, is summed over
  time inside each program into a [B, H, N] float32 buffer and over the batch by one
  small sum: the order is fixed, so du is the same on every run (atomics would not
  be), and B * H * N floats are a few per mille of one input.

The kernels themselves are in `wkv_bi_triton_kernels.py`, imported on first use so that
importing the model imports no Triton and TRITON_INTERPRET=1 set before that first use
runs them under Triton's interpreter on CPU tensors (how they are checked without a GPU).
The pair is one custom op (`open_alip::wkv_bi_triton`) with its backward a second one,
with fake kernels, so torch.compile keeps each as one opaque node and FakeTensors pass.
"""

from __future__ import annotations

from types import ModuleType

import torch

from .triton_env import constant_under_compile, device_guard, kernel_problem

Tensor = torch.Tensor


def warps(size: int) -> tuple[int, int]:
    """Warps per program of the forward and the backward kernel for head size `size`.

    Chosen by register use when compiled for sm_90 (Triton 3.7): head size 80 needs
    128 registers a thread in the forward at 8 warps (222 at 4) and in the backward,
    which holds two N x N states, at 16 warps (255, the limit, at 8); head size 64
    needs 64 and 128 at 8 warps. Not yet timed on a GPU.
    """
    return 8, (16 if size > 64 else 8)


# device type -> why the kernels cannot run there (None: they can). Filled on first use.
_problems: dict[str, str | None] = {}


def _kernels() -> ModuleType:
    from . import wkv_bi_triton_kernels

    return wkv_bi_triton_kernels


def _probe(device_type: str) -> str | None:
    return kernel_problem(
        device_type,
        lambda: _kernels().wkv_bi_forward_kernel,
        needs="the triton package",
        package="triton",
        module="src.open_alip.wkv_bi_triton_kernels",
    )


def bi_triton_problem(device: torch.device | str) -> str | None:
    """Why the bi_triton kernels cannot run on `device` now, or None when they can."""
    return _problem_for(torch.device(device).type)


# As in wkv_fla: the answer holds for the process, so torch.compile keeps it as a constant.
@constant_under_compile
def _problem_for(device_type: str) -> str | None:
    if device_type not in _problems:
        _problems[device_type] = _probe(device_type)
    return _problems[device_type]


def split_head_size(size: int) -> tuple[int, int]:
    """Two powers of two NA + NB >= `size` that the kernels tile a head with.

    NA is the largest power of two below `size` and NB the smallest that covers the
    rest: 80 = 64 + 16 and 64 = 32 + 32 exactly; other sizes mask the lanes past `size`.
    """
    if size < 1:
        raise ValueError(f"head size must be positive, got {size}")
    first = 1 if size == 1 else 1 << ((size - 1).bit_length() - 1)
    rest = max(size - first, 1)
    return first, 1 << (rest - 1).bit_length()


def _launch_shape(r: Tensor, u: Tensor) -> tuple[int, int, int, int]:
    batch, time, channels = r.shape
    heads, size = u.shape
    if heads * size != channels:
        raise ValueError(f"wkv expects u of shape [H, C/H] for C={channels}, got {tuple(u.shape)}")
    return batch, time, heads, size


@torch.library.custom_op("open_alip::wkv_bi_triton", mutates_args=())
def wkv_bi_triton_op(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor, w_max: float) -> Tensor:
    """Bidirectional WKV of `[B, T, C]` r, k, v and decay logits w (float32, bf16 or fp16,
    each its own), bonus u `[H, N]`; float32 `[B, T, C]`. Decay logits above `w_max` act as
    `w_max` and get no gradient."""
    batch, time, heads, size = _launch_shape(r, u)
    r, k, v, w, u = (t.contiguous() for t in (r, k, v, w, u))
    y = torch.empty(r.shape, dtype=torch.float32, device=r.device)
    if batch * heads:  # T = 0 runs no step; an empty grid does not launch
        first, rest = split_head_size(size)
        with device_guard(r):
            _kernels().wkv_bi_forward_kernel[(batch * heads,)](
                r, k, v, w, u, y, time, w_max, H=heads, N=size, NA=first, NB=rest, num_warps=warps(size)[0]
            )  # fmt: skip
    return y


@wkv_bi_triton_op.register_fake
def _(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor, w_max: float) -> Tensor:
    return r.new_empty(r.shape, dtype=torch.float32)


@torch.library.custom_op("open_alip::wkv_bi_triton_backward", mutates_args=())
def wkv_bi_triton_backward_op(
    grad: Tensor, r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor, w_max: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Gradients (r, k, v, w, u) of `wkv_bi_triton_op`, each in its input's dtype."""
    batch, time, heads, size = _launch_shape(r, u)
    grad, r, k, v, w, u = (t.contiguous() for t in (grad, r, k, v, w, u))
    dr, dk, dv, dw = (torch.empty_like(t) for t in (r, k, v, w))
    # The first pass's float32 terms of dw: dw's own buffer when it is float32.
    carry = dw if dw.dtype == torch.float32 else torch.empty(w.shape, dtype=torch.float32, device=w.device)
    du_part = torch.empty(batch, heads, size, dtype=torch.float32, device=r.device)
    if batch * heads:
        first, rest = split_head_size(size)
        with device_guard(r):
            _kernels().wkv_bi_backward_kernel[(batch * heads,)](
                r, k, v, w, u, grad, dr, dk, dv, dw, carry, du_part, time, w_max,
                H=heads, N=size, NA=first, NB=rest, num_warps=warps(size)[1],
            )  # fmt: skip
    return dr, dk, dv, dw, du_part.sum(0).to(u.dtype)


@wkv_bi_triton_backward_op.register_fake
def _(grad: Tensor, r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor, w_max: float):
    return tuple(torch.empty_like(t) for t in (r, k, v, w, u))


def _setup_context(ctx, inputs, output) -> None:
    *tensors, w_max = inputs
    ctx.save_for_backward(*tensors)
    ctx.w_max = w_max


def _backward(ctx, grad: Tensor):
    return (*wkv_bi_triton_backward_op(grad, *ctx.saved_tensors, ctx.w_max), None)


wkv_bi_triton_op.register_autograd(_backward, setup_context=_setup_context)


def traffic_bytes(
    batch: int, time: int, heads: int, size: int, itemsize: int, w_itemsize: int
) -> dict[str, int]:
    """Bytes the bi_triton forward and backward load plus store in device memory, by part.

    For r, k, v, u of `itemsize` bytes and w of `w_itemsize` (the gradients have their
    input's size), y and its gradient float32. Every pass counts what it reads and writes
    in full; what the second pass of a program finds still in L2 is counted again, so
    this is an upper bound on DRAM traffic. B * H * N terms (u, du) are included.
    """
    e = batch * time * heads * size
    inputs = e * (3 * itemsize + w_itemsize)  # r, k, v, w once
    per_head = batch * heads * size
    return {
        "forward/read r k v w, both passes": 2 * inputs + per_head * itemsize,
        "forward/y: store, read back, store": 3 * 4 * e,
        "backward/read r k v w and dy, both passes": 2 * (inputs + 4 * e) + per_head * itemsize,
        "backward/dr dk dv: store half, read back, store": 3 * 3 * itemsize * e,
        "backward/dw: first-pass terms in float32, stored and read back; dw stored": (8 + w_itemsize) * e,
        "backward/du: per (batch, head) sums, summed over the batch": 8 * per_head
        + _cast(heads * size, itemsize),
    }


def _cast(n: int, itemsize: int) -> int:
    """The float32 sum of n elements written, and converted to `itemsize` bytes if not float32."""
    return 4 * n + (0 if itemsize == 4 else (4 + itemsize) * n)
