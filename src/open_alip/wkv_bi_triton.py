"""The bidirectional WKV on Triton kernels of our own (`--wkv-impl bi_triton`).

The operator is `wkv.py`'s: a left-to-right RWKV-6 scan with the bonus u plus a
right-to-left scan without it. Unlike the fla path (`wkv_fla.py`), which converts
r, k, v and the log-decay to float32, runs fla's one-direction recurrent kernels once per
direction on flipped copies and sums per-tile partials afterwards, these kernels

* read r, k, v and the decay logit w in the dtype they arrive in (bf16 from the bf16
  linears, or float32), compute in float32 and compute the log-decay -exp(w) themselves;
* are not recurrent: time is cut into blocks of BLOCK tokens, one program per block of
  one (batch element, head), and a program takes its block's pairs with every other block
  as matrix products (tl.dot), walking the blocks left and right of it without a state
  carried from token to token (`wkv_bi_triton_kernels.py` has the math): T / BLOCK times
  more programs than (batch, head) pairs, no barrier per token, both directions at once,
  no flipped copies;
* write y (float32) and each of dr, dk, dv (in its input's dtype) once, as final values.
  dw needs a running sum over the whole sequence (every pair that straddles a step
  contributes to it): the dr and dk kernels leave each token's two float32 terms of it in
  a scratch buffer and a small kernel sums them along time. The bonus gradient du, a sum
  over batch and time, is summed per block into a [B * H, blocks, N] float32 buffer and
  then by one small sum in a fixed order, so du is the same on every run (atomics would
  not be).

Five kernels: forward; backward dr, dk (which adds its terms of dw to dr's), dv, then dw.
Their launch settings below were chosen with benchmarks/kernel_static.py (compiled for
sm_90 on a CPU, read back from the machine code); none has been timed on a GPU yet.

The kernels themselves are in `wkv_bi_triton_kernels.py`, imported on first use so that
importing the model imports no Triton and TRITON_INTERPRET=1 set before that first use
runs them under Triton's interpreter on CPU tensors (how they are checked without a GPU).
The forward is one custom op (`open_alip::wkv_bi_triton`) with its backward a second one,
with fake kernels, so torch.compile keeps each as one opaque node and FakeTensors pass.
"""

from __future__ import annotations

from types import ModuleType

import torch

from .triton_env import constant_under_compile, device_guard, kernel_problem

Tensor = torch.Tensor


BLOCK = (
    16  # tokens per program: tl.dot's smallest tile; the pairs inside a block cost more per token as it grows
)
LEVELS = BLOCK.bit_length() - 1  # levels of the in-block pair hierarchy (log2 BLOCK)
# Channels a kernel works on at a time (tl.dot's smallest side): an exact float32 product holds,
# in each thread, its rows' share of both operands' whole reduced dimension, and 64-channel
# operands made the dr and dk kernels spill at two warps.
CHANNELS = 16
# Chunks a head may have: the kernels' scans over several tiles at once have combine functions
# for up to 8 (heads of up to 128 channels).
MAX_CHUNKS = 8
# The matrix products in exact float32 (FMA). tf32 would round the decayed factors to 10 bits,
# and tf32x3 (three tf32 products), compiled, came out slower here than FMA at these 16-row tiles.
DOT_PRECISION = "ieee"
# Two warps a program: more programs share an SM and hide each other's latency (5 or 6 at these
# kernels' registers); at four the registers a thread hardly fell and only two programs fit an SM.
NUM_WARPS = 2
# No software pipelining: a loop step's loads are a few rows, and the pipeliner's shared-memory
# stages cost more instructions than the latency they hide.
STAGES = 1
DW_ROWS, DW_COLS, DW_WARPS = 64, 32, 4  # the dlogd kernel: tokens per step, channels and warps per program


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


def channel_chunks(size: int) -> int:
    """Chunks of CHANNELS channels that the kernels cover a head of `size` with (the last one's
    lanes past `size` masked): 5 for 80, 4 for 64."""
    if size < 1:
        raise ValueError(f"head size must be positive, got {size}")
    chunks = -(-size // CHANNELS)
    if chunks > MAX_CHUNKS:
        raise ValueError(
            f"bi_triton takes heads of up to {MAX_CHUNKS * CHANNELS} channels, got {size}; "
            "use --wkv-impl fla or chunked"
        )
    return chunks


def blocks(time: int) -> int:
    """Programs per (batch element, head): blocks of BLOCK tokens."""
    return max(1, -(-time // BLOCK))


def _block_constants(heads: int, size: int) -> dict[str, object]:
    """The compile-time constants of the blocked kernels (forward, dr, dk, dv) at `heads` heads of
    `size` channels: what a launch passes and what `static_launches` compiles."""
    return dict(
        H=heads,
        N=size,
        CW=CHANNELS,
        NC=channel_chunks(size),
        BLOCK=BLOCK,
        LEVELS=LEVELS,
        DOT=DOT_PRECISION,
    )


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
    if batch * heads * time:  # an empty grid does not launch
        nblk = blocks(time)
        with device_guard(r):
            _kernels().wkv_bi_forward_kernel[(batch * heads * nblk,)](
                r, k, v, w, u, y, time, nblk, w_max,
                **_block_constants(heads, size), num_warps=NUM_WARPS, num_stages=STAGES,
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
    nblk = blocks(time)
    du_part = torch.zeros(batch * heads, nblk, size, dtype=torch.float32, device=r.device)
    if batch * heads * time:
        # Each token's two terms of the log-decay gradient, summed over the sequence by the dw kernel.
        terms = torch.empty((2, *r.shape), dtype=torch.float32, device=r.device)
        with device_guard(r):
            grid = (batch * heads * nblk,)
            meta = {**_block_constants(heads, size), "num_stages": STAGES}
            _kernels().wkv_bi_backward_dr_kernel[grid](
                k, v, w, u, grad, r, dr, terms[0], terms[1], time, nblk, w_max, num_warps=NUM_WARPS, **meta
            )  # fmt: skip
            _kernels().wkv_bi_backward_dk_kernel[grid](
                r, k, v, w, u, grad, dk, terms[0], terms[1], time, nblk, w_max, num_warps=NUM_WARPS, **meta
            )  # fmt: skip
            _kernels().wkv_bi_backward_dv_kernel[grid](
                r, k, v, w, u, grad, dv, du_part, time, nblk, w_max, num_warps=NUM_WARPS, **meta
            )  # fmt: skip
            channels = heads * size
            _kernels().wkv_bi_dw_kernel[(batch, -(-channels // DW_COLS))](
                w, terms[0], terms[1], dw, time, channels, w_max,
                ROWS=DW_ROWS, COLS=DW_COLS, num_warps=DW_WARPS,
            )  # fmt: skip
    # A fixed order over batch and blocks: du is the same on every run (atomics would not be).
    du = du_part.reshape(batch, heads, nblk, size).sum((0, 2))
    return dr, dk, dv, dw, du.to(u.dtype)


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
    """Bytes the bi_triton forward and backward kernels load plus store, by part.

    For r, k, v, u of `itemsize` bytes and w of `w_itemsize` (the gradients have their
    input's size), y and its gradient float32. Each program reads its own block's rows once
    (the kernels read them again, chunk by chunk and level by level, from L1: not counted again)
    and every other block's rows of the same head once (blocks - 1 times each in all):
    those re-reads are of one head's rows, a few tens of KB that the head's programs read
    while they run together, so they are mostly L2 hits, but every load is counted, so this
    is an upper bound on DRAM traffic. w is read twice where a kernel needs it shifted by a
    row both ways. B * H * N terms (u, du) are included.
    """
    e = batch * time * heads * size
    others = e * (blocks(time) - 1)  # elements of other blocks a kernel's programs read, per tensor
    per_head = batch * heads * size
    isz, wsz = itemsize, w_itemsize
    return {
        "forward/own rows: r k v, w twice": e * (3 * isz + 2 * wsz) + per_head * isz,
        "forward/other blocks: k v, w twice": others * (2 * isz + 2 * wsz),
        "forward/y": 4 * e,
        "backward/dr: own rows g k v r, w twice; other blocks v k, w twice": e * (4 + 3 * isz + 2 * wsz)
        + others * (2 * isz + 2 * wsz),
        "backward/dr: dr, and its float32 terms of dlogd": e * (isz + 8),
        "backward/dk: own rows r v k g, w twice; other blocks r g, w twice": e * (4 + 3 * isz + 2 * wsz)
        + others * (isz + 4 + 2 * wsz),
        "backward/dk: dk, its terms of dlogd added to dr's (read and written)": e * (isz + 16),
        "backward/dv: own rows r k v g, w twice; other blocks r g, w twice": e * (4 + 3 * isz + 2 * wsz)
        + others * (isz + 4 + 2 * wsz),
        "backward/dv and du (per block and head, summed over batch and blocks)": e * isz
        + 2 * 4 * per_head * blocks(time)
        + _cast(heads * size, isz),
        "backward/dw: the terms read, w read, dw written": e * (8 + 2 * wsz),
    }


def _cast(n: int, itemsize: int) -> int:
    """The float32 sum of n elements written, and converted to `itemsize` bytes if not float32."""
    return 4 * n + (0 if itemsize == 4 else (4 + itemsize) * n)


def static_launches(batch: int, time: int, heads: int, size: int, dtype: str, w_dtype: str) -> list[tuple]:
    """The kernels one forward and backward launch at these shapes, for benchmarks/kernel_static.py:
    (name, pass, kernel, {argument: (Triton type, value)}, warps, stages, programs, trips of each loop
    of the compiled code, tokens one program walks in them). `dtype` is the Triton type of r, k, v and
    their gradients ("bf16"), `w_dtype` that of w, u and theirs."""
    k = _kernels()
    nblk = blocks(time)
    const = {name: ("constexpr", value) for name, value in _block_constants(heads, size).items()}
    # u is a parameter next to w: float32 where w is (the image tower), else in r's dtype.
    inputs = {name: (f"*{dtype}", None) for name in ("r", "k", "v")} | {
        n: (f"*{w_dtype}", None) for n in ("w", "u")
    }
    scalars = {"T": ("i32", time), "NBLK": ("i32", nblk), "w_max": ("fp32", 1.0)}
    forward = inputs | {"y": ("*fp32", None)} | scalars | const
    grads = {"gy": ("*fp32", None), "xs": ("*fp32", None), "ys": ("*fp32", None)}
    backward_dr = inputs | grads | {"dr": (f"*{dtype}", None)} | scalars | const
    backward_dk = inputs | grads | {"dk": (f"*{dtype}", None)} | scalars | const
    backward_dv = (
        inputs
        | {"gy": ("*fp32", None), "dv": (f"*{dtype}", None), "du_part": ("*fp32", None)}
        | scalars
        | const
    )
    channels = heads * size
    dw = {
        "w": (f"*{w_dtype}", None),
        "xs": ("*fp32", None),
        "ys": ("*fp32", None),
        "dw": (f"*{w_dtype}", None),
        "T": ("i32", time),
        "C": ("i32", channels),
        "w_max": ("fp32", 1.0),
    } | {"ROWS": ("constexpr", DW_ROWS), "COLS": ("constexpr", DW_COLS)}
    programs = batch * heads * nblk
    # A program walks the other blocks: on the left in one loop, on the right in the other; on
    # average half of them each (every program walks nblk - 1 blocks in all).
    half = (nblk - 1) / 2
    walked = (nblk - 1) * BLOCK
    return [
        (
            "forward",
            "fwd",
            k.wkv_bi_forward_kernel,
            forward,
            NUM_WARPS,
            STAGES,
            programs,
            [half, half],
            walked,
        ),
        (
            "backward_dr",
            "bwd",
            k.wkv_bi_backward_dr_kernel,
            backward_dr,
            NUM_WARPS,
            STAGES,
            programs,
            [half, half],
            walked,
        ),
        (
            "backward_dk",
            "bwd",
            k.wkv_bi_backward_dk_kernel,
            backward_dk,
            NUM_WARPS,
            STAGES,
            programs,
            [half, half],
            walked,
        ),
        (
            "backward_dv",
            "bwd",
            k.wkv_bi_backward_dv_kernel,
            backward_dv,
            NUM_WARPS,
            STAGES,
            programs,
            [half, half],
            walked,
        ),
        (
            "backward_dw",
            "bwd",
            k.wkv_bi_dw_kernel,
            dw,
            DW_WARPS,
            3,
            batch * -(-channels // DW_COLS),
            [-(-time // DW_ROWS)],
            time,
        ),
    ]
