"""The Triton kernels of the `bi_triton` WKV (the binding and the math are in `wkv_bi_triton.py`).

Imported on first use only: Triton decides at decoration time whether a kernel is
interpreted (TRITON_INTERPRET=1), and importing the model must not import Triton.

Blocked, not recurrent. Time is cut into blocks of BLOCK tokens and one program owns one
block of one (batch element, head). With D(s, t) the product of the decays strictly between
s and t, its rows t get

    y_t = sum_{s != t} (r_t * k_s * D(s, t)) . v_s  +  (r_t * u * k_t) . v_t

from every source block in turn: a BLOCK x BLOCK matrix of pair weights times the source
block's values, both as matrix products (tl.dot). Nothing is carried from step to step but
a vector of log-decay sums, so a program walks the other blocks without a barrier per token,
and there are T / BLOCK times more programs than (batch, head) pairs.

Every decay is the exponential of a sum of log-decays over an interval, never of a difference
of prefix sums (which would cancel, or overflow once factored): for a source block j left of
the target block i,

    log D(s, t) = suffix_j(s) + gap + prefix_i(t)

with suffix_j(s) the log-decays after s to the end of block j, gap those of the blocks between,
prefix_i(t) those from the start of block i to before t: each a sum of terms of one sign, and
each factor exp(.) <= 1, so the pair weight factors into (r_t e^{prefix_i(t)}) . (k_s
e^{suffix_j(s) + gap}), one matrix product. Sources right of the target mirror this. In-block
prefix and suffix sums are scans of the log-decays loaded one row shifted (a scan of row t - 1
is the sum strictly before t), so no subtraction enters them.

Pairs inside one block are split the same way at a hierarchy of midpoints: at level `half`
(BLOCK / 2, then BLOCK / 4, ..., 1) the block falls into segments of 2 * half rows, and the
level takes the pairs of one segment on either side of its middle m, for which
log D(s, t) = E_t + E_s with E_x the log-decays between x and m (running sums inside half a
segment, again of rows loaded one row shifted). One [BLOCK, BLOCK] product per level, masked
to its pairs; every pair of distinct rows belongs to exactly one level.

The head size N is held as two power-of-two parts NA + NB >= N, each at least 16 (80 = 64 + 16,
64 = 32 + 32); lanes at or past N are masked to zero. The products are exact float32
(input_precision "ieee"): the decayed factors are float32 values that tf32 would round.

The backward is four kernels: dr (its rows as targets), dk (as sources), dv, then dw, a running
sum along time of per-token terms that the dr and dk kernels leave in float32 (see
`wkv_bi_backward_dk_kernel`). Every kernel stores its outputs once, as final values. Each
kernel walks the other blocks before the pairs inside its own, and reads its own rows where it
uses them: what its loops leave live is a few accumulators, not everything the in-block pairs
need.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_env import interpreter_requested

# The helpers below are inlined into the kernels when compiled. Triton's interpreter instead
# re-patches triton.language on every call of a jitted function (about a millisecond each), so
# there they are plain functions, run by the interpreted kernel with the language already patched.
_helper = (lambda fn: fn) if interpreter_requested() else triton.jit
# tl.sum is such a jitted function too; its plain function does the same reduction. tl.cumsum
# stays jitted: its plain function calls builtins that need the language patched, which a
# helper called at the top of a kernel (before any jitted call) does not have yet.
_sum = tl.sum.fn if interpreter_requested() else tl.sum
_cumsum = tl.cumsum


@_helper
def _program(T, NBLK, H: tl.constexpr, N: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr):
    """This program's (batch * H + head) index, its block, the offset of the head's t = 0 row,
    the row stride, the two parts' channel offsets and masks, and the block's rows."""
    pid = tl.program_id(0)
    block = pid % NBLK
    bh = pid // NBLK
    row = H * N
    base = (bh // H).to(tl.int64) * T * row + (bh % H) * N
    oa = tl.arange(0, NA)
    ob = NA + tl.arange(0, NB)
    rows = block * BLOCK + tl.arange(0, BLOCK)
    if NA + NB == N:  # both parts full (80 = 64 + 16, 64 = 32 + 32): constant masks, folded away
        return bh, block, base, row, oa, ob, tl.full([NA], 1, tl.int1), tl.full([NB], 1, tl.int1), rows
    return bh, block, base, row, oa, ob, oa < N, ob < N, rows


@_helper
def _rows(ptr, base, row, rows, ok, oa, ob, ma, mb):
    """Rows `rows` (where `ok`) of one head as its two channel parts, in float32. Offsets inside
    one sequence are 32-bit (T * H * N < 2^31); `base`, the sequence's, is 64-bit."""
    at = ptr + base
    line = rows[:, None] * row
    a = tl.load(at + (line + oa[None, :]), mask=ok[:, None] & ma[None, :], other=0.0).to(tl.float32)
    b = tl.load(at + (line + ob[None, :]), mask=ok[:, None] & mb[None, :], other=0.0).to(tl.float32)
    return a, b


@_helper
def _store_rows(ptr, base, row, rows, ok, oa, ob, ma, mb, a, b):
    at = ptr + base
    line = rows[:, None] * row
    tl.store(at + (line + oa[None, :]), a.to(ptr.dtype.element_ty), mask=ok[:, None] & ma[None, :])
    tl.store(at + (line + ob[None, :]), b.to(ptr.dtype.element_ty), mask=ok[:, None] & mb[None, :])


@_helper
def _log_decay(w, w_max):
    # exp(-exp(w)) is 0 in float32 beyond w_max, and so is its gradient there.
    return -tl.exp(tl.minimum(w, w_max))


@_helper
def _log_decays(w, base, row, rows, ok, oa, ob, ma, mb, w_max):
    """The log-decays of rows `rows`, 0 where not `ok` (a decay of 1: no effect on any sum)."""
    wa, wb = _rows(w, base, row, rows, ok, oa, ob, ma, mb)
    la = tl.where(ok[:, None] & ma[None, :], _log_decay(wa, w_max), 0.0)
    lb = tl.where(ok[:, None] & mb[None, :], _log_decay(wb, w_max), 0.0)
    return la, lb


@_helper
def _pair_dot(xa, xb, ya, yb, DOT: tl.constexpr):
    """[rows of x, rows of y]: sum over channels of x * y, from their two parts."""
    out = tl.dot(xa, tl.trans(ya), input_precision=DOT)
    return tl.dot(xb, tl.trans(yb), acc=out, input_precision=DOT)


@_helper
def _shifted(w, base, row, rows, step: tl.constexpr, first, end, oa, ob, ma, mb, w_max):
    """The log-decays of rows `rows + step`, 0 outside [first, end) (both parts)."""
    at = rows + step
    return _log_decays(w, base, row, at, (at >= first) & (at < end), oa, ob, ma, mb, w_max)


@_helper
def _segmented(x, SEG: tl.constexpr, REVERSE: tl.constexpr):
    """Running sums of x down its rows (up them with REVERSE), restarting every SEG rows."""
    rows: tl.constexpr = x.shape[0]
    cols: tl.constexpr = x.shape[1]
    if SEG == rows:
        return _cumsum(x, 0, reverse=REVERSE)
    seg = _cumsum(tl.reshape(x, [rows // SEG, SEG, cols]), 1, reverse=REVERSE)
    return tl.reshape(seg, [rows, cols])


@_helper
def _level(half: tl.constexpr, prev_a, prev_b, next_a, next_b, BLOCK: tl.constexpr):
    """One level of the in-block hierarchy: (exp(E) by part, the level's pairs [t, s]).

    Rows fall into segments of 2 * half; a segment's middle m is its start + half. The level's
    pairs are those of one segment on either side of m, and for them log D(s, t) = E_t + E_s
    with E_x the log-decays between x and m: from m to before x for x >= m (a running sum of
    the log-decays one row back, restarting at m), after x to before m for x < m (one row
    ahead, summed upwards, restarting before m). Halving `half` from BLOCK / 2 down to 1 gives
    every pair of distinct rows once. prev / next: the block's log-decays one row back / ahead,
    0 across the block's edges.
    """
    t = tl.arange(0, BLOCK)
    s = tl.arange(0, BLOCK)[None, :]
    upper = (t // half) % 2 == 1
    pairs = ((t[:, None] // (2 * half)) == (s // (2 * half))) & (upper[:, None] != ((s // half) % 2 == 1))
    if half == 1:
        return tl.full(prev_a.shape, 1.0, tl.float32), tl.full(prev_b.shape, 1.0, tl.float32), pairs
    starts = (t % half != 0)[:, None]  # a row past its half-segment's first: a step back stays inside
    ends = ((t + 1) % half != 0)[:, None]  # a row before its half-segment's last
    ua = _segmented(tl.where(starts, prev_a, 0.0), half, False)
    ub = _segmented(tl.where(starts, prev_b, 0.0), half, False)
    la = _segmented(tl.where(ends, next_a, 0.0), half, True)
    lb = _segmented(tl.where(ends, next_b, 0.0), half, True)
    return tl.exp(tl.where(upper[:, None], ua, la)), tl.exp(tl.where(upper[:, None], ub, lb)), pairs


@_helper
def _sources_left(w, base, row, j0, offs, oa, ob, ma, mb, w_max, gap_a, gap_b):
    """A block left of the program's block (rows j0 + offs, all inside the sequence): its rows,
    which are inside the sequence, exp(log-decays after each row to the block's end + gap), and
    gap grown by the block."""
    src = j0 + offs
    fa, fb = _shifted(w, base, row, src, 1, j0, j0 + offs.shape[0], oa, ob, ma, mb, w_max)
    fa = tl.exp(_cumsum(fa, 0, reverse=True) + gap_a[None, :])
    fb = tl.exp(_cumsum(fb, 0, reverse=True) + gap_b[None, :])
    la, lb = _log_decays(w, base, row, src, src >= 0, oa, ob, ma, mb, w_max)
    return src, src >= 0, fa, fb, gap_a + _sum(la, 0), gap_b + _sum(lb, 0)


@_helper
def _sources_right(w, base, row, j0, offs, T, oa, ob, ma, mb, w_max, gap_a, gap_b):
    """A block right of the program's block: its rows, which are inside the sequence,
    exp(log-decays from the block's start to before each row + gap), and gap grown by the block."""
    src = j0 + offs
    inside = src < T
    fa, fb = _shifted(w, base, row, src, -1, j0, tl.minimum(j0 + offs.shape[0], T), oa, ob, ma, mb, w_max)
    fa = tl.exp(_cumsum(fa, 0) + gap_a[None, :])
    fb = tl.exp(_cumsum(fb, 0) + gap_b[None, :])
    la, lb = _log_decays(w, base, row, src, inside, oa, ob, ma, mb, w_max)
    return src, inside, fa, fb, gap_a + _sum(la, 0), gap_b + _sum(lb, 0)


@_helper
def _edges(w, base, row, rows, first, end, oa, ob, ma, mb, w_max):
    """exp of the log-decays from the block's start to before each row, and from after each row
    to the block's end (the factors of this block's rows against other blocks)."""
    pa, pb = _shifted(w, base, row, rows, -1, first, end, oa, ob, ma, mb, w_max)
    na, nb = _shifted(w, base, row, rows, 1, first, end, oa, ob, ma, mb, w_max)
    return (tl.exp(_cumsum(pa, 0)), tl.exp(_cumsum(pb, 0)),
            tl.exp(_cumsum(na, 0, reverse=True)), tl.exp(_cumsum(nb, 0, reverse=True)))


@triton.jit
def wkv_bi_forward_kernel(
    r, k, v, w, u, y,  # r, k, v, w: [B, T, H*N] in any float dtype; u: [H, N]; y: [B, T, H*N] float32
    T, NBLK, w_max,
    H: tl.constexpr, N: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr,
    LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    bh, i, base, row, oa, ob, ma, mb, rows = _program(T, NBLK, H, N, NA, NB, BLOCK)
    first = i * BLOCK
    end = tl.minimum(first + BLOCK, T)
    ok = rows < T
    offs = tl.arange(0, BLOCK)
    pa, pb, sa, sb = _edges(w, base, row, rows, first, end, oa, ob, ma, mb, w_max)
    ya = tl.zeros([BLOCK, NA], dtype=tl.float32)
    yb = tl.zeros([BLOCK, NB], dtype=tl.float32)

    # Sources left of the block: log D = (after s, to its block's end) + gap + (block start to before t).
    # The pair weights come out as [s, t], the block's own rows the loop-invariant second operand:
    # Triton keeps that in shared memory and loads its operand layout in each step, where as the
    # first operand each thread would hold its rows' 64 channels across the loop.
    ra, rb = _rows(r, base, row, rows, ok, oa, ob, ma, mb)
    xa, xb = ra * pa, rb * pb
    gap_a = tl.zeros([NA], dtype=tl.float32)  # the log-decays of the blocks in between
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for back in range(0, i):
        src, inside, fa, fb, gap_a, gap_b = _sources_left(w, base, row, (i - 1 - back) * BLOCK, offs,
                                                          oa, ob, ma, mb, w_max, gap_a, gap_b)
        oka, okb = _rows(k, base, row, src, inside, oa, ob, ma, mb)
        ova, ovb = _rows(v, base, row, src, inside, oa, ob, ma, mb)
        pair = tl.trans(_pair_dot(oka * fa, okb * fb, xa, xb, DOT))
        ya = tl.dot(pair, ova, acc=ya, input_precision=DOT)
        yb = tl.dot(pair, ovb, acc=yb, input_precision=DOT)

    # Sources right of the block: log D = (after t, to the block's end) + gap + (its block start to before s).
    xa, xb = ra * sa, rb * sb
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for j in range(i + 1, NBLK):
        src, inside, fa, fb, gap_a, gap_b = _sources_right(w, base, row, j * BLOCK, offs, T,
                                                           oa, ob, ma, mb, w_max, gap_a, gap_b)
        oka, okb = _rows(k, base, row, src, inside, oa, ob, ma, mb)
        ova, ovb = _rows(v, base, row, src, inside, oa, ob, ma, mb)
        pair = tl.trans(_pair_dot(oka * fa, okb * fb, xa, xb, DOT))
        ya = tl.dot(pair, ova, acc=ya, input_precision=DOT)
        yb = tl.dot(pair, ovb, acc=yb, input_precision=DOT)

    # Pairs inside the block, level by level, and the bonus u on the token itself.
    ka, kb = _rows(k, base, row, rows, ok, oa, ob, ma, mb)
    va, vb = _rows(v, base, row, rows, ok, oa, ob, ma, mb)
    prev_a, prev_b = _shifted(w, base, row, rows, -1, first, end, oa, ob, ma, mb, w_max)
    next_a, next_b = _shifted(w, base, row, rows, 1, first, end, oa, ob, ma, mb, w_max)
    pair = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for level in tl.static_range(LEVELS):
        ea, eb, pairs = _level(BLOCK >> (level + 1), prev_a, prev_b, next_a, next_b, BLOCK)
        pair += tl.where(pairs, _pair_dot(ra * ea, rb * eb, ka * ea, kb * eb, DOT), 0.0)
    ya = tl.dot(pair, va, acc=ya, input_precision=DOT)
    yb = tl.dot(pair, vb, acc=yb, input_precision=DOT)
    ua = tl.load(u + (bh % H) * N + oa, mask=ma, other=0.0).to(tl.float32)
    ub = tl.load(u + (bh % H) * N + ob, mask=mb, other=0.0).to(tl.float32)
    ruk = _sum(ra * ua[None, :] * ka, 1) + _sum(rb * ub[None, :] * kb, 1)
    _store_rows(y, base, row, rows, ok, oa, ob, ma, mb, ya + ruk[:, None] * va, yb + ruk[:, None] * vb)


@triton.jit
def wkv_bi_backward_dr_kernel(
    k, v, w, u, gy,  # inputs as in the forward; gy: the output gradient [B, T, H*N]
    r, dr,  # r and its gradient (r's dtype)
    xs, ys,  # [B, T, H*N] float32: the terms r drR and r drL of the log-decay gradient
    T, NBLK, w_max,
    H: tl.constexpr, N: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr,
    LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """dr of one block, its rows as targets (the math: `wkv_bi_backward_dk_kernel`)."""
    bh, i, base, row, oa, ob, ma, mb, rows = _program(T, NBLK, H, N, NA, NB, BLOCK)
    first = i * BLOCK
    end = tl.minimum(first + BLOCK, T)
    ok = rows < T
    offs = tl.arange(0, BLOCK)

    # Sources in the other blocks: dr_t = e^{in-block sum to t} * sum_s dA[t, s] k_s e^{...}, with
    # dA = g v^T taken as [s, t] (this block's g the loop-invariant second operand; see the forward).
    ga, gb = _rows(gy, base, row, rows, ok, oa, ob, ma, mb)
    acc_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for back in range(0, i):
        src, inside, fa, fb, gap_a, gap_b = _sources_left(w, base, row, (i - 1 - back) * BLOCK, offs,
                                                          oa, ob, ma, mb, w_max, gap_a, gap_b)
        ova, ovb = _rows(v, base, row, src, inside, oa, ob, ma, mb)
        oka, okb = _rows(k, base, row, src, inside, oa, ob, ma, mb)
        d_in = tl.trans(_pair_dot(ova, ovb, ga, gb, DOT))  # dA[t in block, s in j]
        acc_a = tl.dot(d_in, oka * fa, acc=acc_a, input_precision=DOT)
        acc_b = tl.dot(d_in, okb * fb, acc=acc_b, input_precision=DOT)
    left_a, left_b = acc_a, acc_b
    acc_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for j in range(i + 1, NBLK):
        src, inside, fa, fb, gap_a, gap_b = _sources_right(w, base, row, j * BLOCK, offs, T,
                                                           oa, ob, ma, mb, w_max, gap_a, gap_b)
        ova, ovb = _rows(v, base, row, src, inside, oa, ob, ma, mb)
        oka, okb = _rows(k, base, row, src, inside, oa, ob, ma, mb)
        d_in = tl.trans(_pair_dot(ova, ovb, ga, gb, DOT))
        acc_a = tl.dot(d_in, oka * fa, acc=acc_a, input_precision=DOT)
        acc_b = tl.dot(d_in, okb * fb, acc=acc_b, input_precision=DOT)
    pa, pb, sa, sb = _edges(w, base, row, rows, first, end, oa, ob, ma, mb, w_max)
    drl_a, drl_b = left_a * pa, left_b * pb
    drr_a, drr_b = acc_a * sa, acc_b * sb

    # Pairs inside the block, level by level: drL from sources s < t, drR from s > t.
    ka, kb = _rows(k, base, row, rows, ok, oa, ob, ma, mb)
    va, vb = _rows(v, base, row, rows, ok, oa, ob, ma, mb)
    prev_a, prev_b = _shifted(w, base, row, rows, -1, first, end, oa, ob, ma, mb, w_max)
    next_a, next_b = _shifted(w, base, row, rows, 1, first, end, oa, ob, ma, mb, w_max)
    d_in = _pair_dot(ga, gb, va, vb, DOT)  # dA[t, s]
    later = offs[:, None] > offs[None, :]
    for level in tl.static_range(LEVELS):
        ea, eb, pairs = _level(BLOCK >> (level + 1), prev_a, prev_b, next_a, next_b, BLOCK)
        kxa, kxb = ka * ea, kb * eb
        left = tl.where(pairs & later, d_in, 0.0)
        right = tl.where(pairs & ~later, d_in, 0.0)
        drl_a += ea * tl.dot(left, kxa, input_precision=DOT)
        drl_b += eb * tl.dot(left, kxb, input_precision=DOT)
        drr_a += ea * tl.dot(right, kxa, input_precision=DOT)
        drr_b += eb * tl.dot(right, kxb, input_precision=DOT)

    ra, rb = _rows(r, base, row, rows, ok, oa, ob, ma, mb)
    _store_rows(xs, base, row, rows, ok, oa, ob, ma, mb, ra * drr_a, rb * drr_b)
    _store_rows(ys, base, row, rows, ok, oa, ob, ma, mb, ra * drl_a, rb * drl_b)
    ua = tl.load(u + (bh % H) * N + oa, mask=ma, other=0.0).to(tl.float32)
    ub = tl.load(u + (bh % H) * N + ob, mask=mb, other=0.0).to(tl.float32)
    vg = _sum(va * ga, 1) + _sum(vb * gb, 1)
    _store_rows(dr, base, row, rows, ok, oa, ob, ma, mb,
                drl_a + drr_a + ua[None, :] * ka * vg[:, None], drl_b + drr_b + ub[None, :] * kb * vg[:, None])


@triton.jit
def wkv_bi_backward_dk_kernel(
    r, k, v, w, u, gy,  # inputs as in the forward; gy: the output gradient [B, T, H*N]
    dk,  # k's gradient, in k's dtype
    xs, ys,  # [B, T, H*N] float32: the dr kernel's terms, to which k dkR and k dkL are added
    T, NBLK, w_max,
    H: tl.constexpr, N: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr,
    LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """dk of one block, its rows as sources, and the rest of the terms of dlogd.

    With dA[t, s] = g_t . v_s and A[t, s] the forward's pair weight (the bonus on t == s),

        dr_t = sum_{s != t} dA[t, s] D(s, t) k_s + u k_t (v_t . g_t)
        dk_s = sum_{t != s} dA[t, s] D(s, t) r_t + u r_s (v_s . g_s)
        dv_s = sum_t A[t, s] g_t

    each of the first two split by side: drL_t over sources s < t, drR_t over s > t (the dr
    kernel), dkR_s over targets t > s, dkL_s over t < s (this one). The log-decay of step l
    enters every pair that straddles it, and because both sides count every pair once,

        dlogd_l = sum_{m < l} x_m - sum_{m <= l} y_m,   x = k dkR + r drR,  y = r drL + k dkL

    (what the recurrent kernel and fla compute, from the same two kinds of terms). The dr kernel
    leaves r drR and r drL in the float32 buffers xs and ys, this kernel adds k dkR and k dkL,
    and `wkv_bi_dw_kernel` takes the running sum over the sequence.
    """
    bh, i, base, row, oa, ob, ma, mb, rows = _program(T, NBLK, H, N, NA, NB, BLOCK)
    first = i * BLOCK
    end = tl.minimum(first + BLOCK, T)
    ok = rows < T
    offs = tl.arange(0, BLOCK)
    pa, pb, sa, sb = _edges(w, base, row, rows, first, end, oa, ob, ma, mb, w_max)

    # Targets in the other blocks: dk_s = e^{in-block sum to s} * sum_t dA[t, s] r_t e^{...}, dA
    # taken as [s, t] (this block's v the loop-invariant second operand; see the forward kernel).
    va, vb = _rows(v, base, row, rows, ok, oa, ob, ma, mb)
    acc_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for back in range(0, i):
        src, inside, fa, fb, gap_a, gap_b = _sources_left(w, base, row, (i - 1 - back) * BLOCK, offs,
                                                          oa, ob, ma, mb, w_max, gap_a, gap_b)
        ora, orb = _rows(r, base, row, src, inside, oa, ob, ma, mb)
        oga, ogb = _rows(gy, base, row, src, inside, oa, ob, ma, mb)
        d_out = tl.trans(_pair_dot(oga, ogb, va, vb, DOT))  # dA[t in j, s in block], as [s, t]
        acc_a = tl.dot(d_out, ora * fa, acc=acc_a, input_precision=DOT)
        acc_b = tl.dot(d_out, orb * fb, acc=acc_b, input_precision=DOT)
    left_a, left_b = acc_a, acc_b
    acc_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for j in range(i + 1, NBLK):
        src, inside, fa, fb, gap_a, gap_b = _sources_right(w, base, row, j * BLOCK, offs, T,
                                                           oa, ob, ma, mb, w_max, gap_a, gap_b)
        ora, orb = _rows(r, base, row, src, inside, oa, ob, ma, mb)
        oga, ogb = _rows(gy, base, row, src, inside, oa, ob, ma, mb)
        d_out = tl.trans(_pair_dot(oga, ogb, va, vb, DOT))
        acc_a = tl.dot(d_out, ora * fa, acc=acc_a, input_precision=DOT)
        acc_b = tl.dot(d_out, orb * fb, acc=acc_b, input_precision=DOT)
    dkl_a, dkl_b = left_a * pa, left_b * pb
    dkr_a, dkr_b = acc_a * sa, acc_b * sb

    # Pairs inside the block, level by level: dkR from targets t > s, dkL from t < s.
    ra, rb = _rows(r, base, row, rows, ok, oa, ob, ma, mb)
    ga, gb = _rows(gy, base, row, rows, ok, oa, ob, ma, mb)
    prev_a, prev_b = _shifted(w, base, row, rows, -1, first, end, oa, ob, ma, mb, w_max)
    next_a, next_b = _shifted(w, base, row, rows, 1, first, end, oa, ob, ma, mb, w_max)
    d_in = _pair_dot(va, vb, ga, gb, DOT)  # dA[t, s] as [s, t]
    later = offs[:, None] < offs[None, :]  # [s, t]: t > s
    for level in tl.static_range(LEVELS):
        ea, eb, pairs = _level(BLOCK >> (level + 1), prev_a, prev_b, next_a, next_b, BLOCK)
        rxa, rxb = ra * ea, rb * eb
        left = tl.where(pairs & later, d_in, 0.0)
        right = tl.where(pairs & ~later, d_in, 0.0)
        dkr_a += ea * tl.dot(left, rxa, input_precision=DOT)
        dkr_b += eb * tl.dot(left, rxb, input_precision=DOT)
        dkl_a += ea * tl.dot(right, rxa, input_precision=DOT)
        dkl_b += eb * tl.dot(right, rxb, input_precision=DOT)

    ka, kb = _rows(k, base, row, rows, ok, oa, ob, ma, mb)
    xa, xb = _rows(xs, base, row, rows, ok, oa, ob, ma, mb)
    _store_rows(xs, base, row, rows, ok, oa, ob, ma, mb, xa + ka * dkr_a, xb + kb * dkr_b)
    xa, xb = _rows(ys, base, row, rows, ok, oa, ob, ma, mb)
    _store_rows(ys, base, row, rows, ok, oa, ob, ma, mb, xa + ka * dkl_a, xb + kb * dkl_b)
    ua = tl.load(u + (bh % H) * N + oa, mask=ma, other=0.0).to(tl.float32)
    ub = tl.load(u + (bh % H) * N + ob, mask=mb, other=0.0).to(tl.float32)
    vg = _sum(va * ga, 1) + _sum(vb * gb, 1)
    _store_rows(dk, base, row, rows, ok, oa, ob, ma, mb,
                dkl_a + dkr_a + ua[None, :] * ra * vg[:, None], dkl_b + dkr_b + ub[None, :] * rb * vg[:, None])


@triton.jit
def wkv_bi_backward_dv_kernel(
    r, k, v, w, u, gy,  # inputs as in the forward; gy: the output gradient [B, T, H*N]
    dv,  # v's gradient, in v's dtype
    du_part,  # [B * H, NBLK, N] float32: this block's sum of the bonus gradient
    T, NBLK, w_max,
    H: tl.constexpr, N: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr,
    LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """dv_s = sum_t A[t, s] g_t of one block, its rows as sources, and its share of du (see
    `wkv_bi_backward_dk_kernel`)."""
    bh, i, base, row, oa, ob, ma, mb, rows = _program(T, NBLK, H, N, NA, NB, BLOCK)
    first = i * BLOCK
    end = tl.minimum(first + BLOCK, T)
    ok = rows < T
    offs = tl.arange(0, BLOCK)
    pa, pb, sa, sb = _edges(w, base, row, rows, first, end, oa, ob, ma, mb, w_max)
    dva = tl.zeros([BLOCK, NA], dtype=tl.float32)
    dvb = tl.zeros([BLOCK, NB], dtype=tl.float32)

    # Targets in the other blocks, A taken as [s, t] (this block's k, decayed to the block's edge,
    # the loop-invariant second operand; see the forward kernel).
    ka, kb = _rows(k, base, row, rows, ok, oa, ob, ma, mb)
    kxa, kxb = ka * pa, kb * pb
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for back in range(0, i):
        src, inside, fa, fb, gap_a, gap_b = _sources_left(w, base, row, (i - 1 - back) * BLOCK, offs,
                                                          oa, ob, ma, mb, w_max, gap_a, gap_b)
        ora, orb = _rows(r, base, row, src, inside, oa, ob, ma, mb)
        oga, ogb = _rows(gy, base, row, src, inside, oa, ob, ma, mb)
        a_out = tl.trans(_pair_dot(ora * fa, orb * fb, kxa, kxb, DOT))  # A[t in j, s in block], as [s, t]
        dva = tl.dot(a_out, oga, acc=dva, input_precision=DOT)
        dvb = tl.dot(a_out, ogb, acc=dvb, input_precision=DOT)
    kxa, kxb = ka * sa, kb * sb
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for j in range(i + 1, NBLK):
        src, inside, fa, fb, gap_a, gap_b = _sources_right(w, base, row, j * BLOCK, offs, T,
                                                           oa, ob, ma, mb, w_max, gap_a, gap_b)
        ora, orb = _rows(r, base, row, src, inside, oa, ob, ma, mb)
        oga, ogb = _rows(gy, base, row, src, inside, oa, ob, ma, mb)
        a_out = tl.trans(_pair_dot(ora * fa, orb * fb, kxa, kxb, DOT))
        dva = tl.dot(a_out, oga, acc=dva, input_precision=DOT)
        dvb = tl.dot(a_out, ogb, acc=dvb, input_precision=DOT)

    # Pairs inside the block, level by level, then the bonus u on each token.
    ra, rb = _rows(r, base, row, rows, ok, oa, ob, ma, mb)
    ga, gb = _rows(gy, base, row, rows, ok, oa, ob, ma, mb)
    prev_a, prev_b = _shifted(w, base, row, rows, -1, first, end, oa, ob, ma, mb, w_max)
    next_a, next_b = _shifted(w, base, row, rows, 1, first, end, oa, ob, ma, mb, w_max)
    pair = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)  # A as [s, t]
    for level in tl.static_range(LEVELS):
        ea, eb, pairs = _level(BLOCK >> (level + 1), prev_a, prev_b, next_a, next_b, BLOCK)
        pair += tl.where(pairs, _pair_dot(ka * ea, kb * eb, ra * ea, rb * eb, DOT), 0.0)
    dva = tl.dot(pair, ga, acc=dva, input_precision=DOT)
    dvb = tl.dot(pair, gb, acc=dvb, input_precision=DOT)

    va, vb = _rows(v, base, row, rows, ok, oa, ob, ma, mb)
    ua = tl.load(u + (bh % H) * N + oa, mask=ma, other=0.0).to(tl.float32)
    ub = tl.load(u + (bh % H) * N + ob, mask=mb, other=0.0).to(tl.float32)
    vg = _sum(va * ga, 1) + _sum(vb * gb, 1)
    ruk = _sum(ra * ua[None, :] * ka, 1) + _sum(rb * ub[None, :] * kb, 1)
    _store_rows(dv, base, row, rows, ok, oa, ob, ma, mb, dva + ruk[:, None] * ga, dvb + ruk[:, None] * gb)
    part = du_part + (bh * NBLK + i) * N
    tl.store(part + oa, _sum(ra * ka * vg[:, None], 0), mask=ma)
    tl.store(part + ob, _sum(rb * kb * vg[:, None], 0), mask=mb)


@triton.jit
def wkv_bi_dw_kernel(
    w, xs, ys, dw,  # w, dw: [B, T, C] in w's dtype; xs, ys: the backward kernel's terms (float32)
    T, C, w_max,
    ROWS: tl.constexpr, COLS: tl.constexpr,
):  # fmt: skip
    """dw = dlogd * logd, dlogd_l = sum_{m <= l} (x_{m-1} - y_m), by blocks of ROWS tokens.

    The running sum is dlogd itself, grown by each step's difference of terms, as the recurrent
    kernel kept it: two separate sums would grow with l and lose more to rounding.
    """
    cols = tl.program_id(1) * COLS + tl.arange(0, COLS)
    col_ok = cols < C
    base = tl.program_id(0).to(tl.int64) * T * C
    carry = tl.zeros([COLS], dtype=tl.float32)
    for start in range(0, T, ROWS):
        rows = start + tl.arange(0, ROWS)
        ok = (rows < T)[:, None] & col_ok[None, :]
        at = base + rows[:, None].to(tl.int64) * C + cols[None, :]
        before = tl.load(xs + at - C, mask=ok & (rows >= 1)[:, None], other=0.0)
        steps = before - tl.load(ys + at, mask=ok, other=0.0)
        dlogd = carry[None, :] + _cumsum(steps, 0)
        wt = tl.load(w + at, mask=ok, other=0.0).to(tl.float32)
        # d logd / d w = logd where w is below the clamp, 0 above it.
        grad = tl.where(wt <= w_max, dlogd * _log_decay(wt, w_max), 0.0)
        tl.store(dw + at, grad.to(dw.dtype.element_ty), mask=ok)
        carry += _sum(steps, 0)
