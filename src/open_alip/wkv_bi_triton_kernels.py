"""The Triton kernels of the `bi_triton` WKV (the binding and the math are in `wkv_bi_triton.py`).

Imported on first use only: Triton decides at decoration time whether a kernel is
interpreted (TRITON_INTERPRET=1), and importing the model must not import Triton.

One program owns one (batch element, head) and its whole N x N state, so every
reduction (over key channels for y and dv, over value channels for dr and dk) ends
inside the program: nothing is written as a partial per tile and summed later.
The head size N is split into two power-of-two parts, NA + NB >= N (80 = 64 + 16,
64 = 32 + 32, both exact), and every N x N matrix is held as its four blocks
[NA, NA], [NA, NB], [NB, NA], [NB, NB]; lanes at or past N are masked to zero.
Triton tiles must be powers of two, and one 128-wide tile for N = 80 would carry
2.56 times the state and arithmetic of the four exact blocks.

Both directions run in one program, one after the other, with t stepped by index
arithmetic (no flipped copies). The first pass writes its half of each result into
the final buffer and the second pass reads it back, adds its own half and writes
the result; a barrier between the passes makes the first pass's stores visible to
every thread of the program, and one per step of the second pass keeps a thread from
overwriting a row that another has not read yet.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_env import interpreter_requested

# The helpers below are inlined into the kernels when compiled. Triton's interpreter
# instead re-patches triton.language on every call of a jitted function (about a
# millisecond each, dozens of calls per time step), so there they are plain functions,
# run by the interpreted kernel with the language already patched.
_helper = (lambda fn: fn) if interpreter_requested() else triton.jit
# tl.sum is such a jitted function too; its plain function does the same reduction.
_sum = tl.sum.fn if interpreter_requested() else tl.sum


@_helper
def _load2(ptr, oa, ob, ma, mb):
    """One row of N channels as its two parts, in float32."""
    a = tl.load(ptr + oa, mask=ma, other=0.0).to(tl.float32)
    b = tl.load(ptr + ob, mask=mb, other=0.0).to(tl.float32)
    return a, b


@_helper
def _store2(ptr, oa, ob, ma, mb, a, b):
    tl.store(ptr + oa, a.to(ptr.dtype.element_ty), mask=ma)
    tl.store(ptr + ob, b.to(ptr.dtype.element_ty), mask=mb)


@_helper
def _vec_mat(xa, xb, maa, mab, mba, mbb):
    """sum_j x[j] M[j, i], by parts of i."""
    ya = _sum(xa[:, None] * maa, 0) + _sum(xb[:, None] * mba, 0)
    yb = _sum(xa[:, None] * mab, 0) + _sum(xb[:, None] * mbb, 0)
    return ya, yb


@_helper
def _mat_vec(maa, mab, mba, mbb, xa, xb):
    """sum_i M[j, i] x[i], by parts of j."""
    ya = _sum(maa * xa[None, :], 1) + _sum(mab * xb[None, :], 1)
    yb = _sum(mba * xa[None, :], 1) + _sum(mbb * xb[None, :], 1)
    return ya, yb


@_helper
def _decay_add(maa, mab, mba, mbb, da, db, pa, pb, qa, qb):
    """diag(d) M + p q^T."""
    return (
        maa * da[:, None] + pa[:, None] * qa[None, :],
        mab * da[:, None] + pa[:, None] * qb[None, :],
        mba * db[:, None] + pb[:, None] * qa[None, :],
        mbb * db[:, None] + pb[:, None] * qb[None, :],
    )


@_helper
def _program(T, H: tl.constexpr, N: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr):
    """This program's (batch, head) index, the offset of its t = 0 row, the elements per
    step and the two parts' channel offsets and masks."""
    pid = tl.program_id(0)
    row = H * N
    base = (pid // H).to(tl.int64) * T * row + (pid % H) * N
    oa = tl.arange(0, NA)
    ob = NA + tl.arange(0, NB)
    return pid, base, row, oa, ob, oa < N, ob < N


@_helper
def _zero_state(NA: tl.constexpr, NB: tl.constexpr):
    return (
        tl.zeros([NA, NA], dtype=tl.float32),
        tl.zeros([NA, NB], dtype=tl.float32),
        tl.zeros([NB, NA], dtype=tl.float32),
        tl.zeros([NB, NB], dtype=tl.float32),
    )


@_helper
def _load_step(r, k, v, w, off, oa, ob, ma, mb):
    """Row t of r, k, v and w, by parts."""
    ra, rb = _load2(r + off, oa, ob, ma, mb)
    ka, kb = _load2(k + off, oa, ob, ma, mb)
    va, vb = _load2(v + off, oa, ob, ma, mb)
    wa, wb = _load2(w + off, oa, ob, ma, mb)
    return ra, rb, ka, kb, va, vb, wa, wb


@_helper
def _log_decay(w, w_max):
    # exp(-exp(w)) is 0 in float32 beyond w_max, and so is its gradient there.
    return -tl.exp(tl.minimum(w, w_max))


@triton.jit
def wkv_bi_forward_kernel(
    r, k, v, w, u, y,  # r, k, v, w: [B, T, H*N] in any float dtype; u: [H, N]; y: [B, T, H*N] float32
    T, w_max,
    H: tl.constexpr, N: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr,
):  # fmt: skip
    pid, base, row, oa, ob, ma, mb = _program(T, H, N, NA, NB)
    ua, ub = _load2(u + (pid % H) * N, oa, ob, ma, mb)

    # Right to left, no bonus: y_t = r_t^T S_t with S_t = sum_{s>t} D(s, t) k_s v_s^T.
    saa, sab, sba, sbb = _zero_state(NA, NB)
    for step in range(T):
        off = base + (T - 1 - step) * row
        ra, rb, ka, kb, va, vb, wa, wb = _load_step(r, k, v, w, off, oa, ob, ma, mb)
        ya, yb = _vec_mat(ra, rb, saa, sab, sba, sbb)
        _store2(y + off, oa, ob, ma, mb, ya, yb)
        da, db = tl.exp(_log_decay(wa, w_max)), tl.exp(_log_decay(wb, w_max))
        saa, sab, sba, sbb = _decay_add(saa, sab, sba, sbb, da, db, ka, kb, va, vb)

    tl.debug_barrier()

    # Left to right with the bonus u on the current token, added to the first half.
    saa, sab, sba, sbb = _zero_state(NA, NB)
    for t in range(T):
        off = base + t * row
        ra, rb, ka, kb, va, vb, wa, wb = _load_step(r, k, v, w, off, oa, ob, ma, mb)
        ya, yb = _vec_mat(ra, rb, saa, sab, sba, sbb)
        ruk = _sum(ra * ua * ka, 0) + _sum(rb * ub * kb, 0)
        pa, pb = _load2(y + off, oa, ob, ma, mb)
        tl.debug_barrier()  # every thread has read row t before any overwrites it
        _store2(y + off, oa, ob, ma, mb, ya + ruk * va + pa, yb + ruk * vb + pb)
        da, db = tl.exp(_log_decay(wa, w_max)), tl.exp(_log_decay(wb, w_max))
        saa, sab, sba, sbb = _decay_add(saa, sab, sba, sbb, da, db, ka, kb, va, vb)


@triton.jit
def wkv_bi_backward_kernel(
    r, k, v, w, u, gy,  # inputs as in the forward; gy: the output gradient [B, T, H*N]
    dr, dk, dv, dw,  # gradients, each in its input's dtype
    carry,  # [B, T, H*N] float32, may be dw itself: the first pass's terms of dlogd
    du_part,  # [B, H, N] float32: this program's sum over time of the bonus gradient
    T, w_max,
    H: tl.constexpr, N: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr,
):  # fmt: skip
    """Gradients of the forward kernel.

    With A_t / B_t the key-value states from the left / right (A_t = sum_{s<t} D(s,t) k_s v_s^T)
    and GA_t / GB_t the receptance-gradient states from the right / left
    (GA_s = sum_{t>s} D(s,t) r_t g_t^T, GB_s = sum_{t<s} D(t,s) r_t g_t^T):

        dr_t = (A_t + B_t) g_t + u k_t (v_t . g_t)
        dk_t = (GA_t + GB_t) v_t + u r_t (v_t . g_t)
        dv_t = (GA_t + GB_t)^T k_t + (r_t . u k_t) g_t

    The right-to-left pass carries B and GA and writes its halves of dr, dk, dv; the
    left-to-right pass carries A and GB, reads those halves back and writes the sums.

    The log-decay of step l enters every pair (s, t) that straddles it. With pair sums
    rA_t = r_t * (A_t g_t), kA_s = k_s * (GA_s v_s) and likewise for B, and because the
    totals over all steps of r*(A g) and k*(GA v) are equal (both are the sum over
    all left-to-right pairs), that gradient is a difference of two running sums:

        dlogd_l = sum_{t<l} (kA_t + rB_t) - sum_{t<=l} (rA_t + kB_t)

    (fla computes the same difference, from two sums). The second pass keeps dlogd_l
    itself and adds each step's difference of terms, which stays as small as the result
    where the decays are fast; two separate sums would grow with l and lose more to
    rounding (a third of the error at T = 196). The terms kA + rB come from the first
    pass and reach the second through `carry` in float32, not re-read from the rounded
    halves of dk and dr: a bf16 rounding there would be carried along the whole sum
    (and then multiplied by exp(w)).
    """
    pid, base, row, oa, ob, ma, mb = _program(T, H, N, NA, NB)
    ua, ub = _load2(u + (pid % H) * N, oa, ob, ma, mb)

    # Right to left: B (keys and values from the right) and GA (r g^T from the right).
    baa, bab, bba, bbb = _zero_state(NA, NB)
    gaa, gab, gba, gbb = _zero_state(NA, NB)
    for step in range(T):
        off = base + (T - 1 - step) * row
        ra, rb, ka, kb, va, vb, wa, wb = _load_step(r, k, v, w, off, oa, ob, ma, mb)
        ga, gb = _load2(gy + off, oa, ob, ma, mb)
        drb_a, drb_b = _mat_vec(baa, bab, bba, bbb, ga, gb)
        _store2(dr + off, oa, ob, ma, mb, drb_a, drb_b)
        dka_a, dka_b = _mat_vec(gaa, gab, gba, gbb, va, vb)
        _store2(dk + off, oa, ob, ma, mb, dka_a, dka_b)
        xa, xb = _vec_mat(ka, kb, gaa, gab, gba, gbb)
        _store2(dv + off, oa, ob, ma, mb, xa, xb)
        _store2(carry + off, oa, ob, ma, mb, ka * dka_a + ra * drb_a, kb * dka_b + rb * drb_b)
        da, db = tl.exp(_log_decay(wa, w_max)), tl.exp(_log_decay(wb, w_max))
        baa, bab, bba, bbb = _decay_add(baa, bab, bba, bbb, da, db, ka, kb, va, vb)
        gaa, gab, gba, gbb = _decay_add(gaa, gab, gba, gbb, da, db, ra, rb, ga, gb)

    tl.debug_barrier()

    # Left to right: A (keys and values from the left) and GB (r g^T from the left).
    aaa, aab, aba, abb = _zero_state(NA, NB)
    gaa, gab, gba, gbb = _zero_state(NA, NB)
    # dlogd_l itself, updated by the difference of one step's terms: the two sums are
    # never held apart, so their size (up to l times a term) costs no rounding.
    dlogd_a = tl.zeros([NA], dtype=tl.float32)
    dlogd_b = tl.zeros([NB], dtype=tl.float32)
    prev_a = tl.zeros([NA], dtype=tl.float32)  # kA + rB of the step before
    prev_b = tl.zeros([NB], dtype=tl.float32)
    du_a = tl.zeros([NA], dtype=tl.float32)
    du_b = tl.zeros([NB], dtype=tl.float32)
    for t in range(T):
        off = base + t * row
        ra, rb, ka, kb, va, vb, wa, wb = _load_step(r, k, v, w, off, oa, ob, ma, mb)
        ga, gb = _load2(gy + off, oa, ob, ma, mb)
        # The right-to-left halves.
        drb_a, drb_b = _load2(dr + off, oa, ob, ma, mb)
        dka_a, dka_b = _load2(dk + off, oa, ob, ma, mb)
        dva_a, dva_b = _load2(dv + off, oa, ob, ma, mb)
        xa, xb = _load2(carry + off, oa, ob, ma, mb)
        # Every thread has read row t before any overwrites it (threads may hold copies
        # of the same element, and `carry` may be dw).
        tl.debug_barrier()

        dra_a, dra_b = _mat_vec(aaa, aab, aba, abb, ga, gb)
        dkb_a, dkb_b = _mat_vec(gaa, gab, gba, gbb, va, vb)
        dvb_a, dvb_b = _vec_mat(ka, kb, gaa, gab, gba, gbb)
        vg = _sum(va * ga, 0) + _sum(vb * gb, 0)
        ruk = _sum(ra * ua * ka, 0) + _sum(rb * ub * kb, 0)
        _store2(dr + off, oa, ob, ma, mb, dra_a + drb_a + ua * ka * vg, dra_b + drb_b + ub * kb * vg)
        _store2(dk + off, oa, ob, ma, mb, dka_a + dkb_a + ua * ra * vg, dka_b + dkb_b + ub * rb * vg)
        _store2(dv + off, oa, ob, ma, mb, dva_a + dvb_a + ruk * ga, dva_b + dvb_b + ruk * gb)
        du_a += ra * ka * vg
        du_b += rb * kb * vg

        dlogd_a += prev_a - (ra * dra_a + ka * dkb_a)
        dlogd_b += prev_b - (rb * dra_b + kb * dkb_b)
        la, lb = _log_decay(wa, w_max), _log_decay(wb, w_max)
        # d logd / d w = logd where w is below the clamp, 0 above it.
        dwa = tl.where(wa <= w_max, dlogd_a * la, 0.0)
        dwb = tl.where(wb <= w_max, dlogd_b * lb, 0.0)
        _store2(dw + off, oa, ob, ma, mb, dwa, dwb)
        prev_a, prev_b = xa, xb

        da, db = tl.exp(la), tl.exp(lb)
        aaa, aab, aba, abb = _decay_add(aaa, aab, aba, abb, da, db, ka, kb, va, vb)
        gaa, gab, gba, gbb = _decay_add(gaa, gab, gba, gbb, da, db, ra, rb, ga, gb)

    _store2(du_part + pid * N, oa, ob, ma, mb, du_a, du_b)
