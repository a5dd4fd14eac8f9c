"""The token-shift mixes, fused (`mix_impl="triton"`): one Triton kernel pair per mix site.

Every RWKV block blends each token with its shifted neighbour before its linears:

    time mix       xxx = x + (xs - x) * maa_x, then five mixes x + (xs - x) * (maa_j + m_j)
                   (m: the data-dependent LoRA term, bf16 under autocast)
    channel mix    text: x + (xs - x) * maa_{k,r};   image: x * mix + xs * (1 - mix),
                   that is xs + (x - xs) * mix

All are `a + (b - a) * (coef_j + m_j)` for K mixes sharing a and b, which is what
`fused_mixes` computes. Run eagerly, each site costs a handful of float32 element-wise
kernels, each reading and writing the whole activation, plus autocast's cast of every
result to bf16 before its linear; their backward again. Fused, the forward reads a and
b once (and m), and writes the K results directly in the autocast dtype (what the linears
read); the backward reads the K gradients, a, b and m once and writes da, db and dm,
with the coefficients' gradients summed over rows inside each program (a float32 row of
K x C per 256 rows, summed in a fixed order afterwards: the same on every run).

The arithmetic is float32 as in eager mode; only the results' rounding to the autocast
dtype moves into the kernel, so the values the linears see are the same up to float32
rounding order. The shift itself stays `rwkv6.shift_channels` (copies).

The kernels are in `mix_triton_kernels.py`, imported on first use (see wkv_bi_triton.py
for why); under TRITON_INTERPRET=1 they run on CPU tensors, which is how they are
tested. `mix_impl="torch"` (the default) keeps the eager expressions in the modules.
"""

from __future__ import annotations

from types import ModuleType

import torch

from .choices import MIX_IMPLS
from .triton_env import constant_under_compile, device_guard, kernel_problem

Tensor = torch.Tensor

MAX_MIXES = 5  # the most any mix site has (the time mix's five); the kernels take that many pointers
# A program: 64 channels over up to 16 x 16 rows, 4 warps. Chosen by register use when compiled
# for sm_90 (tests/_mix_compile.py): the backward of the five mixes needs 138 registers a thread
# (255, the limit, at 32 rows), the forward 64. Not yet timed on a GPU.
_BLOCK_R, _BLOCK_C, _MAX_SPANS, NUM_WARPS = 16, 64, 16, 4

_problems: dict[str, str | None] = {}


def _kernels() -> ModuleType:
    from . import mix_triton_kernels

    return mix_triton_kernels


@constant_under_compile
def _problem_for(device_type: str) -> str | None:
    if device_type not in _problems:
        _problems[device_type] = kernel_problem(
            device_type,
            lambda: _kernels().mix_forward_kernel,
            needs="the triton package",
            package="triton",
            module="src.open_alip.mix_triton_kernels",
        )
    return _problems[device_type]


def mix_problem(device: torch.device | str) -> str | None:
    """Why the fused mixes cannot run on `device` now, or None when they can."""
    return _problem_for(torch.device(device).type)


def _check(device: torch.device) -> None:
    problem = mix_problem(device)
    if problem is not None:
        raise ValueError(f"mix implementation 'triton' cannot run on {device}: {problem}")


def _launch(rows: int, channels: int) -> tuple[tuple[int, int], int]:
    """(grid, spans of _BLOCK_R rows per program)."""
    spans = max(1, min(_MAX_SPANS, -(-rows // _BLOCK_R)))
    return (-(-rows // (_BLOCK_R * spans)), -(-channels // _BLOCK_C)), spans


def _shape(a: Tensor, b: Tensor, coef: Tensor, m: Tensor | None) -> tuple[int, int, int]:
    channels = a.shape[-1]
    rows = a.numel() // max(channels, 1)
    mixes = coef.shape[0]
    if not 1 <= mixes <= MAX_MIXES:
        raise ValueError(f"{mixes} mixes: the kernels take 1 to {MAX_MIXES}")
    if b.shape != a.shape or coef.dim() != 2 or coef.shape[1] != channels:
        raise ValueError(
            f"mixes of a {tuple(a.shape)}, b {tuple(b.shape)}: coef must be [K, {channels}], "
            f"got {tuple(coef.shape)}"
        )
    if m is not None and m.shape != (mixes, *a.shape):
        raise ValueError(f"m must be [{mixes}, {', '.join(map(str, a.shape))}], got {tuple(m.shape)}")
    if mixes * rows * channels >= 2**31:  # the kernels address m and dm with 32-bit offsets
        raise ValueError(
            f"{mixes} mixes of {rows} x {channels} values exceed the kernels' 2^31 elements; "
            "use a smaller micro-batch or --mix-impl torch"
        )
    return mixes, rows, channels


def _pointers(tensors: list[Tensor]) -> list[Tensor]:
    """`tensors` padded to MAX_MIXES with the first (the kernels never touch the padding)."""
    return tensors + tensors[:1] * (MAX_MIXES - len(tensors))


@torch.library.custom_op("open_alip::token_mix", mutates_args=())
def token_mix_op(
    a: Tensor, b: Tensor, coef: Tensor, m: Tensor | None, out_dtype: torch.dtype
) -> list[Tensor]:
    """The K mixes a + (b - a) * (coef[j] + m[j]), each a tensor of a's shape in `out_dtype`;
    coef `[K, C]`, m `[K, *a.shape]` or None. K separate outputs, so that autograd hands their
    gradients back as they are (one stacked output would have them stacked into a copy)."""
    mixes, rows, channels = _shape(a, b, coef, m)
    _check(a.device)
    a, b, coef = a.contiguous(), b.contiguous(), coef.contiguous()
    m = m.contiguous() if m is not None else None
    outs = [torch.empty(a.shape, dtype=out_dtype, device=a.device) for _ in range(mixes)]
    if rows * channels:
        grid, spans = _launch(rows, channels)
        with device_guard(a):
            _kernels().mix_forward_kernel[grid](
                a, b, coef, a if m is None else m, *_pointers(outs), rows, channels,
                K=mixes, HAS_M=m is not None, BLOCK_R=_BLOCK_R, BLOCK_C=_BLOCK_C, SPANS=spans,
                num_warps=NUM_WARPS,
            )  # fmt: skip
    return outs


@token_mix_op.register_fake
def _(a: Tensor, b: Tensor, coef: Tensor, m: Tensor | None, out_dtype: torch.dtype) -> list[Tensor]:
    _shape(a, b, coef, m)  # shapes the kernels refuse fail here too (FakeTensors, torch.compile)
    return [a.new_empty(a.shape, dtype=out_dtype) for _ in range(coef.shape[0])]


@torch.library.custom_op("open_alip::token_mix_backward", mutates_args=())
def token_mix_backward_op(
    grads: list[Tensor], a: Tensor, b: Tensor, coef: Tensor, m: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(da, db, dcoef, dm) of `token_mix_op`, each in its input's dtype; dm is empty when m is None."""
    mixes, rows, channels = _shape(a, b, coef, m)
    _check(a.device)
    grads = [g.contiguous() for g in grads]
    a, b, coef = a.contiguous(), b.contiguous(), coef.contiguous()
    m = m.contiguous() if m is not None else None
    da, db = torch.empty_like(a), torch.empty_like(b)
    dm = torch.empty_like(m) if m is not None else a.new_empty(0)
    grid, spans = _launch(rows, channels)
    part = torch.zeros((grid[0], mixes, channels), dtype=torch.float32, device=a.device)
    if rows * channels:
        with device_guard(a):
            _kernels().mix_backward_kernel[grid](
                *_pointers(grads), a, b, coef, a if m is None else m, da, db, a if m is None else dm, part,
                rows, channels, K=mixes, K_PAD=1 << (mixes - 1).bit_length(), HAS_M=m is not None,
                BLOCK_R=_BLOCK_R, BLOCK_C=_BLOCK_C, SPANS=spans, num_warps=NUM_WARPS,
            )  # fmt: skip
    return da, db, part.sum(0).to(coef.dtype), dm


@token_mix_backward_op.register_fake
def _(grads: list[Tensor], a: Tensor, b: Tensor, coef: Tensor, m: Tensor | None):
    _shape(a, b, coef, m)
    dm = torch.empty_like(m) if m is not None else a.new_empty(0)
    return torch.empty_like(a), torch.empty_like(b), torch.empty_like(coef), dm


def _setup_context(ctx, inputs, output) -> None:
    a, b, coef, m, out_dtype = inputs
    ctx.has_m, ctx.out_dtype = m is not None, out_dtype
    ctx.save_for_backward(a, b, coef, m)


def _backward(ctx, grads: list[Tensor | None]):
    a, b, coef, m = ctx.saved_tensors
    # A mix nothing used has no gradient; the kernels read one of zeros for it.
    grads = [torch.zeros(a.shape, dtype=ctx.out_dtype, device=a.device) if g is None else g for g in grads]
    da, db, dcoef, dm = token_mix_backward_op(grads, a, b, coef, m)
    return da, db, dcoef, (dm if ctx.has_m else None), None


token_mix_op.register_autograd(_backward, setup_context=_setup_context)


def fused_mixes(a: Tensor, b: Tensor, coefs: list[Tensor], m: Tensor | None = None) -> tuple[Tensor, ...]:
    """The K mixes a + (b - a) * (coef_j + m_j) of `[..., C]` a and b, each coef_j of C
    elements (any shape, e.g. a `[1, 1, C]` parameter), m `[K, *a.shape]` or None.

    Under autocast the results come in its dtype (the linears' input), else in a's.
    Raises ValueError where the kernels cannot run (see `mix_problem`).
    """
    coef = torch.stack([c.reshape(-1) for c in coefs])
    device_type = a.device.type
    try:
        autocast = torch.is_autocast_enabled(device_type)
    except RuntimeError:  # a device type without autocast (meta)
        autocast = False
    out_dtype = torch.get_autocast_dtype(device_type) if autocast else a.dtype
    return tuple(token_mix_op(a, b, coef, m, out_dtype))


def check_mix_impl(impl: str) -> None:
    if impl not in MIX_IMPLS:
        raise ValueError(f"unknown mix implementation {impl!r}; choose one of {', '.join(MIX_IMPLS)}")
