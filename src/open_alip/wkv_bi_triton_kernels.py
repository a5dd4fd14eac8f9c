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

Pairs inside one block have no boundary between them to factor at. There the interval sums
are differences of the block's prefix sums taken in float64 (exact to ~1e-16 of the block's
total, which is at most BLOCK x 105) and carried into float32 as a pair hi + lo, so the
[BLOCK, BLOCK, channels] differences are float32 additions; one exp per pair and channel.

The head size N is held as two power-of-two parts NA + NB >= N, each at least 16 (80 = 64 + 16,
64 = 32 + 32); lanes at or past N are masked to zero.

The backward's first kernel gives every program its block's dr, dk, dv in full (final values,
stored once in their inputs' dtypes) and the block's share of du; the gradient of the
log-decays needs a running sum over the whole sequence, which the second kernel takes (see
`wkv_bi_backward_kernel`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_env import interpreter_requested

# The helpers below are inlined into the kernels when compiled. Triton's interpreter instead
# re-patches triton.language on every call of a jitted function (about a millisecond each), so
# there they are plain functions, run by the interpreted kernel with the language already patched.
_helper = (lambda fn: fn) if interpreter_requested() else triton.jit
# tl.sum and tl.cumsum are such jitted functions too; their plain functions do the same.
_sum = tl.sum.fn if interpreter_requested() else tl.sum
_cumsum = tl.cumsum.fn if interpreter_requested() else tl.cumsum


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
    return bh, block, base, row, oa, ob, oa < N, ob < N, rows


@_helper
def _rows(ptr, base, row, rows, ok, oa, ob, ma, mb):
    """Rows `rows` (where `ok`) of one head as its two channel parts, in float32."""
    at = base + rows[:, None].to(tl.int64) * row
    a = tl.load(ptr + at + oa[None, :], mask=ok[:, None] & ma[None, :], other=0.0).to(tl.float32)
    b = tl.load(ptr + at + ob[None, :], mask=ok[:, None] & mb[None, :], other=0.0).to(tl.float32)
    return a, b


@_helper
def _store_rows(ptr, base, row, rows, ok, oa, ob, ma, mb, a, b):
    at = base + rows[:, None].to(tl.int64) * row
    tl.store(ptr + at + oa[None, :], a.to(ptr.dtype.element_ty), mask=ok[:, None] & ma[None, :])
    tl.store(ptr + at + ob[None, :], b.to(ptr.dtype.element_ty), mask=ok[:, None] & mb[None, :])


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
    ra, rb = _rows(r, base, row, rows, ok, oa, ob, ma, mb)
    ka, kb = _rows(k, base, row, rows, ok, oa, ob, ma, mb)
    va, vb = _rows(v, base, row, rows, ok, oa, ob, ma, mb)
    prev_a, prev_b = _shifted(w, base, row, rows, -1, first, end, oa, ob, ma, mb, w_max)
    next_a, next_b = _shifted(w, base, row, rows, 1, first, end, oa, ob, ma, mb, w_max)

    # Pairs inside the block, level by level, and the bonus u on the token itself.
    pair = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for level in tl.static_range(LEVELS):
        ea, eb, pairs = _level(BLOCK >> (level + 1), prev_a, prev_b, next_a, next_b, BLOCK)
        pair += tl.where(pairs, _pair_dot(ra * ea, rb * eb, ka * ea, kb * eb, DOT), 0.0)
    ya = tl.dot(pair, va, input_precision=DOT)
    yb = tl.dot(pair, vb, input_precision=DOT)
    ua = tl.load(u + (bh % H) * N + oa, mask=ma, other=0.0).to(tl.float32)
    ub = tl.load(u + (bh % H) * N + ob, mask=mb, other=0.0).to(tl.float32)
    ruk = _sum(ra * ua[None, :] * ka, 1) + _sum(rb * ub[None, :] * kb, 1)
    ya += ruk[:, None] * va
    yb += ruk[:, None] * vb

    # Sources left of the block: log D = (after s, to its block's end) + gap + (block start to before t).
    xa = ra * tl.exp(_cumsum(prev_a, 0))
    xb = rb * tl.exp(_cumsum(prev_b, 0))
    gap_a = tl.zeros([NA], dtype=tl.float32)  # the log-decays of the blocks in between
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for back in range(0, i):
        j0 = (i - 1 - back) * BLOCK
        src = j0 + tl.arange(0, BLOCK)
        full = src < T
        oka, okb = _rows(k, base, row, src, full, oa, ob, ma, mb)
        ova, ovb = _rows(v, base, row, src, full, oa, ob, ma, mb)
        fa, fb = _shifted(w, base, row, src, 1, j0, j0 + BLOCK, oa, ob, ma, mb, w_max)
        fa = _cumsum(fa, 0, reverse=True) + gap_a[None, :]
        fb = _cumsum(fb, 0, reverse=True) + gap_b[None, :]
        pair = tl.trans(_pair_dot(oka * tl.exp(fa), okb * tl.exp(fb), xa, xb, DOT))
        ya = tl.dot(pair, ova, acc=ya, input_precision=DOT)
        yb = tl.dot(pair, ovb, acc=yb, input_precision=DOT)
        ola, olb = _log_decays(w, base, row, src, full, oa, ob, ma, mb, w_max)
        gap_a += _sum(ola, 0)
        gap_b += _sum(olb, 0)

    # Sources right of the block: log D = (after t, to the block's end) + gap + (its block start to before s).
    xa = ra * tl.exp(_cumsum(next_a, 0, reverse=True))
    xb = rb * tl.exp(_cumsum(next_b, 0, reverse=True))
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for j in range(i + 1, NBLK):
        j0 = j * BLOCK
        src = j0 + tl.arange(0, BLOCK)
        inside = src < T
        oka, okb = _rows(k, base, row, src, inside, oa, ob, ma, mb)
        ova, ovb = _rows(v, base, row, src, inside, oa, ob, ma, mb)
        fa, fb = _shifted(w, base, row, src, -1, j0, tl.minimum(j0 + BLOCK, T), oa, ob, ma, mb, w_max)
        fa = _cumsum(fa, 0) + gap_a[None, :]
        fb = _cumsum(fb, 0) + gap_b[None, :]
        pair = tl.trans(_pair_dot(oka * tl.exp(fa), okb * tl.exp(fb), xa, xb, DOT))
        ya = tl.dot(pair, ova, acc=ya, input_precision=DOT)
        yb = tl.dot(pair, ovb, acc=yb, input_precision=DOT)
        ola, olb = _log_decays(w, base, row, src, inside, oa, ob, ma, mb, w_max)
        gap_a += _sum(ola, 0)
        gap_b += _sum(olb, 0)

    _store_rows(y, base, row, rows, ok, oa, ob, ma, mb, ya, yb)


@_helper
def _sources_left(w, base, row, j0, first_src, oa, ob, ma, mb, w_max, gap_a, gap_b):
    """A block left of the program's block (rows j0 + [0, BLOCK), all inside the sequence): its
    rows, exp(log-decays after each row to the block's end + gap), and gap grown by the block."""
    src = j0 + first_src
    fa, fb = _shifted(w, base, row, src, 1, j0, j0 + first_src.shape[0], oa, ob, ma, mb, w_max)
    fa = tl.exp(_cumsum(fa, 0, reverse=True) + gap_a[None, :])
    fb = tl.exp(_cumsum(fb, 0, reverse=True) + gap_b[None, :])
    la, lb = _log_decays(w, base, row, src, src >= 0, oa, ob, ma, mb, w_max)
    return src, fa, fb, gap_a + _sum(la, 0), gap_b + _sum(lb, 0)


@_helper
def _sources_right(w, base, row, j0, first_src, T, oa, ob, ma, mb, w_max, gap_a, gap_b):
    """A block right of the program's block: its rows, exp(log-decays from the block's start to
    before each row + gap), and gap grown by the block."""
    src = j0 + first_src
    inside = src < T
    fa, fb = _shifted(w, base, row, src, -1, j0, tl.minimum(j0 + first_src.shape[0], T), oa, ob, ma, mb, w_max)
    fa = tl.exp(_cumsum(fa, 0) + gap_a[None, :])
    fb = tl.exp(_cumsum(fb, 0) + gap_b[None, :])
    la, lb = _log_decays(w, base, row, src, inside, oa, ob, ma, mb, w_max)
    return src, inside, fa, fb, gap_a + _sum(la, 0), gap_b + _sum(lb, 0)


@triton.jit
def wkv_bi_backward_dr_kernel(
    k, v, w, u, gy,  # inputs as in the forward; gy: the output gradient [B, T, H*N]
    r, dr,  # r and its gradient (r's dtype)
    xs, ys,  # [B, T, H*N] float32: the terms r drR and r drL of the log-decay gradient
    T, NBLK, w_max,
    H: tl.constexpr, N: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr,
    LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """dr of one block, the block's rows as targets: see `wkv_bi_backward_dkv_kernel`."""
    bh, i, base, row, oa, ob, ma, mb, rows = _program(T, NBLK, H, N, NA, NB, BLOCK)
    first = i * BLOCK
    end = tl.minimum(first + BLOCK, T)
    ok = rows < T
    ka, kb = _rows(k, base, row, rows, ok, oa, ob, ma, mb)
    va, vb = _rows(v, base, row, rows, ok, oa, ob, ma, mb)
    ga, gb = _rows(gy, base, row, rows, ok, oa, ob, ma, mb)
    prev_a, prev_b = _shifted(w, base, row, rows, -1, first, end, oa, ob, ma, mb, w_max)
    next_a, next_b = _shifted(w, base, row, rows, 1, first, end, oa, ob, ma, mb, w_max)

    # Pairs inside the block, level by level: drL from sources s < t, drR from s > t.
    d_in = _pair_dot(ga, gb, va, vb, DOT)  # dA[t, s]
    later = tl.arange(0, BLOCK)[:, None] > tl.arange(0, BLOCK)[None, :]
    drl_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    drl_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    drr_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    drr_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    for level in tl.static_range(LEVELS):
        ea, eb, pairs = _level(BLOCK >> (level + 1), prev_a, prev_b, next_a, next_b, BLOCK)
        kxa, kxb = ka * ea, kb * eb
        left = tl.where(pairs & later, d_in, 0.0)
        right = tl.where(pairs & ~later, d_in, 0.0)
        drl_a += ea * tl.dot(left, kxa, input_precision=DOT)
        drl_b += eb * tl.dot(left, kxb, input_precision=DOT)
        drr_a += ea * tl.dot(right, kxa, input_precision=DOT)
        drr_b += eb * tl.dot(right, kxb, input_precision=DOT)

    # Sources in the other blocks: dr_t = e^{in-block sum up to t} (sum_s dA[t, s] k_s e^{...}).
    # The block's own rows (g) are the second operand of dA, read again in each step so that no
    # operand layout of them stays in registers across the loop.
    first_src = tl.arange(0, BLOCK)
    acc_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for back in range(0, i):
        src, fa, fb, gap_a, gap_b = _sources_left(w, base, row, (i - 1 - back) * BLOCK, first_src,
                                                  oa, ob, ma, mb, w_max, gap_a, gap_b)
        ova, ovb = _rows(v, base, row, src, src >= 0, oa, ob, ma, mb)
        oka, okb = _rows(k, base, row, src, src >= 0, oa, ob, ma, mb)
        tga, tgb = _rows(gy, base, row, rows, ok, oa, ob, ma, mb)
        d_in = tl.trans(_pair_dot(ova, ovb, tga, tgb, DOT))  # dA[t in block, s in j]
        acc_a = tl.dot(d_in, oka * fa, acc=acc_a, input_precision=DOT)
        acc_b = tl.dot(d_in, okb * fb, acc=acc_b, input_precision=DOT)
    drl_a += acc_a * tl.exp(_cumsum(prev_a, 0))
    drl_b += acc_b * tl.exp(_cumsum(prev_b, 0))
    acc_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for j in range(i + 1, NBLK):
        src, inside, fa, fb, gap_a, gap_b = _sources_right(w, base, row, j * BLOCK, first_src, T,
                                                           oa, ob, ma, mb, w_max, gap_a, gap_b)
        ova, ovb = _rows(v, base, row, src, inside, oa, ob, ma, mb)
        oka, okb = _rows(k, base, row, src, inside, oa, ob, ma, mb)
        tga, tgb = _rows(gy, base, row, rows, ok, oa, ob, ma, mb)
        d_in = tl.trans(_pair_dot(ova, ovb, tga, tgb, DOT))
        acc_a = tl.dot(d_in, oka * fa, acc=acc_a, input_precision=DOT)
        acc_b = tl.dot(d_in, okb * fb, acc=acc_b, input_precision=DOT)
    drr_a += acc_a * tl.exp(_cumsum(next_a, 0, reverse=True))
    drr_b += acc_b * tl.exp(_cumsum(next_b, 0, reverse=True))

    ra, rb = _rows(r, base, row, rows, ok, oa, ob, ma, mb)
    _store_rows(xs, base, row, rows, ok, oa, ob, ma, mb, ra * drr_a, rb * drr_b)
    _store_rows(ys, base, row, rows, ok, oa, ob, ma, mb, ra * drl_a, rb * drl_b)
    ua = tl.load(u + (bh % H) * N + oa, mask=ma, other=0.0).to(tl.float32)
    ub = tl.load(u + (bh % H) * N + ob, mask=mb, other=0.0).to(tl.float32)
    vg = _sum(va * ga, 1) + _sum(vb * gb, 1)
    _store_rows(dr, base, row, rows, ok, oa, ob, ma, mb,
                drl_a + drr_a + ua[None, :] * ka * vg[:, None], drl_b + drr_b + ub[None, :] * kb * vg[:, None])


@triton.jit
def wkv_bi_backward_dkv_kernel(
    r, k, v, w, u, gy,  # inputs as in the forward; gy: the output gradient [B, T, H*N]
    dk, dv,  # gradients, each in its input's dtype
    xs, ys,  # [B, T, H*N] float32: the dr kernel's terms, to which k dkR and k dkL are added
    du_part,  # [B * H, NBLK, N] float32: this block's sum of the bonus gradient
    T, NBLK, w_max,
    H: tl.constexpr, N: tl.constexpr, NA: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr,
    LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """dk and dv of one block, the block's rows as sources, and the terms of dlogd.

    With dA[t, s] = g_t . v_s and A[t, s] the forward's pair weight (the bonus on t == s),

        dr_t = sum_{s != t} dA[t, s] D(s, t) k_s + u k_t (v_t . g_t)
        dk_s = sum_{t != s} dA[t, s] D(s, t) r_t + u r_s (v_s . g_s)
        dv_s = sum_t A[t, s] g_t

    each sum split by side: drL_t over sources s < t, drR_t over s > t (the dr kernel), dkR_s
    over targets t > s, dkL_s over t < s. The log-decay of step l enters every pair that
    straddles it, and because both sides count every pair once,

        dlogd_l = sum_{m < l} x_m - sum_{m <= l} y_m,   x = k dkR + r drR,  y = r drL + k dkL

    (what the recurrent kernel and fla compute, from the same two kinds of terms). The dr kernel
    leaves r drR and r drL in the float32 buffers xs and ys, this kernel adds k dkR and k dkL,
    and `wkv_bi_dw_kernel` takes the running sum over the sequence.
    """
    bh, i, base, row, oa, ob, ma, mb, rows = _program(T, NBLK, H, N, NA, NB, BLOCK)
    first = i * BLOCK
    end = tl.minimum(first + BLOCK, T)
    ok = rows < T
    ra, rb = _rows(r, base, row, rows, ok, oa, ob, ma, mb)
    ka, kb = _rows(k, base, row, rows, ok, oa, ob, ma, mb)
    va, vb = _rows(v, base, row, rows, ok, oa, ob, ma, mb)
    ga, gb = _rows(gy, base, row, rows, ok, oa, ob, ma, mb)
    prev_a, prev_b = _shifted(w, base, row, rows, -1, first, end, oa, ob, ma, mb, w_max)
    next_a, next_b = _shifted(w, base, row, rows, 1, first, end, oa, ob, ma, mb, w_max)

    # Pairs inside the block, level by level: dkR from targets t > s, dkL from t < s; dv.
    d_in = _pair_dot(ga, gb, va, vb, DOT)  # dA[t, s]
    later = tl.arange(0, BLOCK)[:, None] > tl.arange(0, BLOCK)[None, :]
    pair = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    dkl_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    dkl_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    dkr_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    dkr_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    for level in tl.static_range(LEVELS):
        ea, eb, pairs = _level(BLOCK >> (level + 1), prev_a, prev_b, next_a, next_b, BLOCK)
        rxa, rxb = ra * ea, rb * eb
        pair += tl.where(pairs, _pair_dot(rxa, rxb, ka * ea, kb * eb, DOT), 0.0)
        left = tl.trans(tl.where(pairs & later, d_in, 0.0))
        right = tl.trans(tl.where(pairs & ~later, d_in, 0.0))
        dkr_a += ea * tl.dot(left, rxa, input_precision=DOT)
        dkr_b += eb * tl.dot(left, rxb, input_precision=DOT)
        dkl_a += ea * tl.dot(right, rxa, input_precision=DOT)
        dkl_b += eb * tl.dot(right, rxb, input_precision=DOT)
    dva = tl.dot(tl.trans(pair), ga, input_precision=DOT)
    dvb = tl.dot(tl.trans(pair), gb, input_precision=DOT)

    # Targets in the other blocks: dk_s = e^{in-block sum to s} (sum_t dA[t, s] r_t e^{...}),
    # dv_s += sum_t A[t, s] g_t. The block's own rows (v, k) are second operands, read again in
    # each step (see the dr kernel).
    first_src = tl.arange(0, BLOCK)
    ea, eb = tl.exp(_cumsum(prev_a, 0)), tl.exp(_cumsum(prev_b, 0))
    acc_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for back in range(0, i):
        src, fa, fb, gap_a, gap_b = _sources_left(w, base, row, (i - 1 - back) * BLOCK, first_src,
                                                  oa, ob, ma, mb, w_max, gap_a, gap_b)
        ora, orb = _rows(r, base, row, src, src >= 0, oa, ob, ma, mb)
        oga, ogb = _rows(gy, base, row, src, src >= 0, oa, ob, ma, mb)
        ora, orb = ora * fa, orb * fb
        tva, tvb = _rows(v, base, row, rows, ok, oa, ob, ma, mb)
        tka, tkb = _rows(k, base, row, rows, ok, oa, ob, ma, mb)
        d_out = tl.trans(_pair_dot(oga, ogb, tva, tvb, DOT))  # dA[t in j, s in block], transposed
        acc_a = tl.dot(d_out, ora, acc=acc_a, input_precision=DOT)
        acc_b = tl.dot(d_out, orb, acc=acc_b, input_precision=DOT)
        a_out = tl.trans(_pair_dot(ora, orb, tka * ea, tkb * eb, DOT))  # A[t in j, s in block], transposed
        dva = tl.dot(a_out, oga, acc=dva, input_precision=DOT)
        dvb = tl.dot(a_out, ogb, acc=dvb, input_precision=DOT)
    dkl_a += acc_a * ea
    dkl_b += acc_b * eb
    ea, eb = tl.exp(_cumsum(next_a, 0, reverse=True)), tl.exp(_cumsum(next_b, 0, reverse=True))
    acc_a = tl.zeros([BLOCK, NA], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK, NB], dtype=tl.float32)
    gap_a = tl.zeros([NA], dtype=tl.float32)
    gap_b = tl.zeros([NB], dtype=tl.float32)
    for j in range(i + 1, NBLK):
        src, inside, fa, fb, gap_a, gap_b = _sources_right(w, base, row, j * BLOCK, first_src, T,
                                                           oa, ob, ma, mb, w_max, gap_a, gap_b)
        ora, orb = _rows(r, base, row, src, inside, oa, ob, ma, mb)
        oga, ogb = _rows(gy, base, row, src, inside, oa, ob, ma, mb)
        ora, orb = ora * fa, orb * fb
        tva, tvb = _rows(v, base, row, rows, ok, oa, ob, ma, mb)
        tka, tkb = _rows(k, base, row, rows, ok, oa, ob, ma, mb)
        d_out = tl.trans(_pair_dot(oga, ogb, tva, tvb, DOT))
        acc_a = tl.dot(d_out, ora, acc=acc_a, input_precision=DOT)
        acc_b = tl.dot(d_out, orb, acc=acc_b, input_precision=DOT)
        a_out = tl.trans(_pair_dot(ora, orb, tka * ea, tkb * eb, DOT))
        dva = tl.dot(a_out, oga, acc=dva, input_precision=DOT)
        dvb = tl.dot(a_out, ogb, acc=dvb, input_precision=DOT)
    dkr_a += acc_a * ea
    dkr_b += acc_b * eb

    xa, xb = _rows(xs, base, row, rows, ok, oa, ob, ma, mb)
    _store_rows(xs, base, row, rows, ok, oa, ob, ma, mb, xa + ka * dkr_a, xb + kb * dkr_b)
    xa, xb = _rows(ys, base, row, rows, ok, oa, ob, ma, mb)
    _store_rows(ys, base, row, rows, ok, oa, ob, ma, mb, xa + ka * dkl_a, xb + kb * dkl_b)
    ua = tl.load(u + (bh % H) * N + oa, mask=ma, other=0.0).to(tl.float32)
    ub = tl.load(u + (bh % H) * N + ob, mask=mb, other=0.0).to(tl.float32)
    vg = _sum(va * ga, 1) + _sum(vb * gb, 1)
    ruk = _sum(ra * ua[None, :] * ka, 1) + _sum(rb * ub[None, :] * kb, 1)
    _store_rows(dk, base, row, rows, ok, oa, ob, ma, mb,
                dkl_a + dkr_a + ua[None, :] * ra * vg[:, None], dkl_b + dkr_b + ub[None, :] * rb * vg[:, None])
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
