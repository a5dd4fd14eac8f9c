"""The Triton kernels of the fused token-shift mixes (the binding and the math are in `mix.py`).

Imported on first use only, as `wkv_bi_triton_kernels.py` is: Triton decides at decoration
time whether a kernel is interpreted (TRITON_INTERPRET=1).

Both kernels see `a` and `b` as `[R, C]` rows (R = batch * time), the LoRA term m and its
gradient as `[K, R, C]`, and the K mixes and their gradients as K tensors of `[R, C]` each.
One program owns a block of channels over a span of rows: it reads a and b once for all K
mixes, and in the backward sums each coefficient's gradient over its rows in registers, so
the only partial buffer is one float32 row of K x C per span of rows.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_env import interpreter_requested


@triton.jit
def _rounded_native(x, dtype: tl.constexpr):
    """x in `dtype`; a GPU rounds a float32 downcast to nearest even, as torch does."""
    return x.to(dtype)


def _rounded_interpreted(x, dtype):
    """The same under the interpreter, which truncates a float32 -> bf16 downcast: bf16 is
    rounded to nearest even on the bits (finite values; fp16 stays truncated there)."""
    if dtype != tl.bfloat16:
        return x.to(dtype)
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


_rounded = _rounded_interpreted if interpreter_requested() else _rounded_native
# Helpers are inlined when compiled; the interpreter runs them as plain functions (it would re-patch
# triton.language on every call of a jitted one, as wkv_bi_triton_kernels.py explains).
_helper = (lambda fn: fn) if interpreter_requested() else triton.jit


@_helper
def _span(a_ptr, b_ptr, rows, cols, col_ok, R, C):
    """A block of rows: its mask, element offsets, a and b - a in float32."""
    ok = (rows < R)[:, None] & col_ok[None, :]
    at = rows[:, None] * C + cols[None, :]
    a = tl.load(a_ptr + at, mask=ok, other=0.0).to(tl.float32)
    diff = tl.load(b_ptr + at, mask=ok, other=0.0).to(tl.float32) - a
    return ok, at, a, diff


@_helper
def _coefficient(coef_ptr, m_ptr, j, cols, col_ok, at, ok, R, C, HAS_M: tl.constexpr):
    """coef[j] (+ m[j] where there is one) over the block, in float32."""
    c = tl.load(coef_ptr + j * C + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_M:
        c = c + tl.load(m_ptr + j * R * C + at, mask=ok, other=0.0).to(tl.float32)
    return c


@_helper
def _pick(j: tl.constexpr, p0, p1, p2, p3, p4):
    """The j-th of the mixes' own tensors (up to five, one pointer each)."""
    if j == 0:
        return p0
    elif j == 1:
        return p1
    elif j == 2:
        return p2
    elif j == 3:
        return p3
    else:
        return p4


@triton.jit
def mix_forward_kernel(
    a_ptr, b_ptr, coef_ptr, m_ptr, out0_ptr, out1_ptr, out2_ptr, out3_ptr, out4_ptr, R, C,
    K: tl.constexpr, HAS_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, SPANS: tl.constexpr,
):  # fmt: skip
    """out_j = a + (b - a) * (coef[j] + m[j]) for j < K, computed in float32, stored in out_j's dtype."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    first_row = tl.program_id(0) * BLOCK_R * SPANS
    for s in range(SPANS):
        ok, at, a, diff = _span(
            a_ptr, b_ptr, first_row + s * BLOCK_R + tl.arange(0, BLOCK_R), cols, col_ok, R, C
        )
        for j in tl.static_range(K):
            c = _coefficient(coef_ptr, m_ptr, j, cols, col_ok, at, ok, R, C, HAS_M)
            out_ptr = _pick(j, out0_ptr, out1_ptr, out2_ptr, out3_ptr, out4_ptr)
            tl.store(out_ptr + at, _rounded(a + diff * c, out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def mix_backward_kernel(
    g0_ptr, g1_ptr, g2_ptr, g3_ptr, g4_ptr, a_ptr, b_ptr, coef_ptr, m_ptr,
    da_ptr, db_ptr, dm_ptr, dcoef_ptr, R, C,
    K: tl.constexpr, K_PAD: tl.constexpr, HAS_M: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
    SPANS: tl.constexpr,
):  # fmt: skip
    """da = sum_j g_j (1 - c_j), db = sum_j g_j c_j, dm_j = g_j (b - a), and this span's
    sum over rows of g_j (b - a) into dcoef_part[program row, j], with c_j = coef_j + m_j."""
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < C
    first_row = tl.program_id(0) * BLOCK_R * SPANS
    mixes = tl.arange(0, K_PAD)
    dcoef = tl.zeros((K_PAD, BLOCK_C), dtype=tl.float32)  # the span's coefficient gradients
    for s in range(SPANS):
        ok, at, a, diff = _span(
            a_ptr, b_ptr, first_row + s * BLOCK_R + tl.arange(0, BLOCK_R), cols, col_ok, R, C
        )
        g_sum = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
        db = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
        for j in tl.static_range(K):
            g = tl.load(_pick(j, g0_ptr, g1_ptr, g2_ptr, g3_ptr, g4_ptr) + at, mask=ok, other=0.0).to(
                tl.float32
            )
            c = _coefficient(coef_ptr, m_ptr, j, cols, col_ok, at, ok, R, C, HAS_M)
            g_sum += g
            db += g * c
            dc = g * diff
            if HAS_M:
                tl.store(dm_ptr + j * R * C + at, _rounded(dc, dm_ptr.dtype.element_ty), mask=ok)
            dcoef += tl.where((mixes == j)[:, None], tl.sum(dc, 0)[None, :], 0.0)
        tl.store(da_ptr + at, _rounded(g_sum - db, da_ptr.dtype.element_ty), mask=ok)
        tl.store(db_ptr + at, _rounded(db, db_ptr.dtype.element_ty), mask=ok)
    out = dcoef_ptr + tl.program_id(0) * K * C + mixes[:, None] * C + cols[None, :]
    tl.store(out, dcoef, mask=(mixes < K)[:, None] & col_ok[None, :])
