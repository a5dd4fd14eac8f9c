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

Channels in chunks. A head's N channels are handled CW at a time (NC = ceil(N / CW) chunks,
lanes at or past N masked to zero), each chunk a [BLOCK, CW] tile, and a row's several chunks
a tuple of tiles. Everything but the sums over channels (the pair weights, v . g, r u k) is
per channel, so a kernel walks the chunks one after another (tl.static_range) and keeps live
only the chunk it works on and its accumulators. This is for registers: an exact float32
product (FMA) holds, in every thread, its output rows' share of the whole reduced dimension of
both operands, so a 64-channel operand costs four times the registers of a 16-channel one.
The products are exact float32 (input_precision "ieee"): the decayed factors are float32
values that tf32 would round.

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
# What a masked load of w reads: its log-decay -exp(-inf) is -0, a decay of 1.
_NO_DECAY = tl.constexpr(float("-inf"))


@_helper
def _program(T, NBLK, H: tl.constexpr, N: tl.constexpr, BLOCK: tl.constexpr):
    """This program's (batch * H + head) index, its block, the offset of the head's t = 0 row,
    the row stride and the block's rows."""
    pid = tl.program_id(0)
    block = pid % NBLK
    bh = pid // NBLK
    row = H * N
    base = (bh // H).to(tl.int64) * T * row + (bh % H) * N
    return bh, block, base, row, block * BLOCK + tl.arange(0, BLOCK)


# ------------------------------------------------------------------ tiles: a row's channels in chunks


@_helper
def _live(c: tl.constexpr, N: tl.constexpr, CW: tl.constexpr):
    """Which of chunk c's CW lanes are inside the head."""
    if (c + 1) * CW <= N:  # a full chunk (all of them at 80 and 64): a constant mask, folded away
        return tl.full([CW], 1, tl.int1)
    return c * CW + tl.arange(0, CW) < N


@_helper
def _at(ptr, base, row, rows, c: tl.constexpr, CW: tl.constexpr):
    """Addresses of chunk c of rows `rows`: the chunk's first lane as a scalar (one for the whole
    program), plus offsets that are the same for every chunk and every input, so the compiler
    keeps one set of them. Offsets inside one sequence are 32-bit (T * H * N < 2^31); `base`,
    the sequence's, is 64-bit."""
    return (ptr + (base + c * CW)) + (rows[:, None] * row + tl.arange(0, CW)[None, :])


@_helper
def _tile(ptr, base, row, rows, ok, c: tl.constexpr, N: tl.constexpr, CW: tl.constexpr, other=0.0):
    """Chunk c of rows `rows` (where `ok`) of one head, a float32 tile [rows, CW]."""
    x = tl.load(_at(ptr, base, row, rows, c, CW), mask=ok[:, None] & _live(c, N, CW)[None, :], other=other)
    return x.to(tl.float32)


@_helper
def _tiles(ptr, base, row, rows, ok, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, other=0.0):
    """Rows `rows` (where `ok`) of one head as NC tiles (`_tile`)."""
    out = ()
    for c in tl.static_range(NC):
        out = out + (_tile(ptr, base, row, rows, ok, c, N, CW, other),)
    return out


@_helper
def _store_tile(ptr, base, row, rows, ok, c: tl.constexpr, N: tl.constexpr, CW: tl.constexpr, x):
    tl.store(
        _at(ptr, base, row, rows, c, CW),
        x.to(ptr.dtype.element_ty),
        mask=ok[:, None] & _live(c, N, CW)[None, :],
    )


@_helper
def _store_tiles(ptr, base, row, rows, ok, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, x):
    for c in tl.static_range(NC):
        _store_tile(ptr, base, row, rows, ok, c, N, CW, x[c])


@_helper
def _u(u, bh, H: tl.constexpr, c: tl.constexpr, N: tl.constexpr, CW: tl.constexpr):
    """Chunk c of this head's bonus u."""
    return tl.load(u + ((bh % H) * N + c * CW) + tl.arange(0, CW), mask=_live(c, N, CW), other=0.0).to(
        tl.float32
    )


@_helper
def _bonus(a, u, b, bh, H: tl.constexpr, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr):
    """sum over channels of a * u * b, per row: the bonus u's weight of each token on itself."""
    out = tl.zeros([a[0].shape[0]], dtype=tl.float32)
    for c in tl.static_range(NC):
        uc = _u(u, bh, H, c, N, CW)
        out += _sum(a[c] * uc[None, :] * b[c], 1)
    return out


@_helper
def _times(a, b, NC: tl.constexpr):
    out = ()
    for c in tl.static_range(NC):
        out = out + (a[c] * b[c],)
    return out


@_helper
def _plus(a, b, NC: tl.constexpr):
    out = ()
    for c in tl.static_range(NC):
        out = out + (a[c] + b[c],)
    return out


@_helper
def _exp(x, NC: tl.constexpr):
    out = ()
    for c in tl.static_range(NC):
        out = out + (tl.exp(x[c]),)
    return out


@_helper
def _zeros(NC: tl.constexpr, ROWS: tl.constexpr, CW: tl.constexpr):
    out = ()
    for _ in tl.static_range(NC):
        out = out + (tl.zeros([ROWS, CW], dtype=tl.float32),)
    return out


@_helper
def _zero_lanes(NC: tl.constexpr, CW: tl.constexpr):
    out = ()
    for _ in tl.static_range(NC):
        out = out + (tl.zeros([CW], dtype=tl.float32),)
    return out


@_helper
def _dot_rows(a, b, NC: tl.constexpr):
    """sum over channels of a * b, per row."""
    out = _sum(a[0] * b[0], 1)
    for c in tl.static_range(1, NC):
        out += _sum(a[c] * b[c], 1)
    return out


@_helper
def _pair(a, b, NC: tl.constexpr, DOT: tl.constexpr):
    """[rows of a, rows of b]: sum over channels of a * b, one product per chunk."""
    out = tl.dot(a[0], tl.trans(b[0]), input_precision=DOT)
    for c in tl.static_range(1, NC):
        out = tl.dot(a[c], tl.trans(b[c]), acc=out, input_precision=DOT)
    return out


@_helper
def _spread(pair, b, acc, NC: tl.constexpr, DOT: tl.constexpr):
    """acc + pair @ b, tile by tile."""
    out = ()
    for c in tl.static_range(NC):
        out = out + (tl.dot(pair, b[c], acc=acc[c], input_precision=DOT),)
    return out


@_helper
def _spread_apart(pair, b, acc, NC: tl.constexpr, DOT: tl.constexpr):
    """acc + pair @ b, tile by tile, each product behind a barrier.

    For the loops over other blocks. Unrolled without barriers, the compiler starts every
    chunk's product at once (each thread's share of both operands of all of them live) and
    the dr and dk kernels spilled; a barrier, which no load or shared-memory access crosses,
    keeps one chunk's product live at a time, for one barrier per chunk and block walked
    (about NC / BLOCK more per token walked)."""
    out = ()
    for c in tl.static_range(NC):
        tl.debug_barrier()
        out = out + (tl.dot(pair, b[c], acc=acc[c], input_precision=DOT),)
    return out


# Sums along the rows of several tiles at once. Compiled, one scan or reduction of a tuple of
# tiles crosses the program's warps once for all of them (one exchange through shared memory,
# one barrier) where a scan per tile crosses them once per tile; its combine function takes two
# groups of as many scalars as there are tiles, hence one function per count (head sizes up to
# 8 chunks). Triton's interpreter runs such a combine function element by element in Python, so
# there each tile is summed on its own, by numpy: the same sums.
@triton.jit
def _add1(a0, b0):
    return a0 + b0


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _add3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def _add4(a0, a1, a2, a3, b0, b1, b2, b3):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3


@triton.jit
def _add5(a0, a1, a2, a3, a4, b0, b1, b2, b3, b4):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4


@triton.jit
def _add6(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5


@triton.jit
def _add7(a0, a1, a2, a3, a4, a5, a6, b0, b1, b2, b3, b4, b5, b6):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6


@triton.jit
def _add8(a0, a1, a2, a3, a4, a5, a6, a7, b0, b1, b2, b3, b4, b5, b6, b7):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5, a6 + b6, a7 + b7


@triton.jit
def _scan_all(x, NC: tl.constexpr, AXIS: tl.constexpr, REVERSE: tl.constexpr):
    tl.static_assert(NC <= 8, "a head of more than 8 chunks (wkv_bi_triton.MAX_CHUNKS)")
    if NC == 1:
        return tl.associative_scan(x, AXIS, _add1, reverse=REVERSE)
    elif NC == 2:
        return tl.associative_scan(x, AXIS, _add2, reverse=REVERSE)
    elif NC == 3:
        return tl.associative_scan(x, AXIS, _add3, reverse=REVERSE)
    elif NC == 4:
        return tl.associative_scan(x, AXIS, _add4, reverse=REVERSE)
    elif NC == 5:
        return tl.associative_scan(x, AXIS, _add5, reverse=REVERSE)
    elif NC == 6:
        return tl.associative_scan(x, AXIS, _add6, reverse=REVERSE)
    elif NC == 7:
        return tl.associative_scan(x, AXIS, _add7, reverse=REVERSE)
    else:
        return tl.associative_scan(x, AXIS, _add8, reverse=REVERSE)


@triton.jit
def _reduce_all(x, NC: tl.constexpr):
    if NC == 1:
        return tl.reduce(x, 0, _add1)
    elif NC == 2:
        return tl.reduce(x, 0, _add2)
    elif NC == 3:
        return tl.reduce(x, 0, _add3)
    elif NC == 4:
        return tl.reduce(x, 0, _add4)
    elif NC == 5:
        return tl.reduce(x, 0, _add5)
    elif NC == 6:
        return tl.reduce(x, 0, _add6)
    elif NC == 7:
        return tl.reduce(x, 0, _add7)
    else:
        return tl.reduce(x, 0, _add8)


def _scan_rows_interpreted(x, NC, SEG, REVERSE):
    return tuple(_segmented(t, SEG, REVERSE) for t in x)


def _sum_rows_interpreted(x, NC):
    return tuple(_sum(t, 0) for t in x)


@triton.jit
def _scan_rows_compiled(x, NC: tl.constexpr, SEG: tl.constexpr, REVERSE: tl.constexpr):
    rows: tl.constexpr = x[0].shape[0]
    cols: tl.constexpr = x[0].shape[1]
    if SEG == rows:
        return _scan_all(x, NC, 0, REVERSE)
    split = ()
    for c in tl.static_range(NC):
        split = split + (tl.reshape(x[c], [rows // SEG, SEG, cols]),)
    split = _scan_all(split, NC, 1, REVERSE)
    out = ()
    for c in tl.static_range(NC):
        out = out + (tl.reshape(split[c], [rows, cols]),)
    return out


@triton.jit
def _sum_rows_compiled(x, NC: tl.constexpr):
    return _reduce_all(x, NC)


@_helper
def _segmented(x, SEG: tl.constexpr, REVERSE: tl.constexpr):
    """Running sums of x down its rows (up them with REVERSE), restarting every SEG rows."""
    rows: tl.constexpr = x.shape[0]
    cols: tl.constexpr = x.shape[1]
    if SEG == rows:
        return _cumsum(x, 0, reverse=REVERSE)
    seg = _cumsum(tl.reshape(x, [rows // SEG, SEG, cols]), 1, reverse=REVERSE)
    return tl.reshape(seg, [rows, cols])


# _scan_rows(tiles, NC, SEG, REVERSE): running sums down each tile's rows (up with REVERSE),
# restarting every SEG rows; _sum_rows(tiles, NC): each tile's column sums.
_scan_rows = _scan_rows_interpreted if interpreter_requested() else _scan_rows_compiled
_sum_rows = _sum_rows_interpreted if interpreter_requested() else _sum_rows_compiled


# ------------------------------------------------------------------ decays


@_helper
def _log_decay(w, w_max):
    # exp(-exp(w)) is 0 in float32 beyond w_max, and so is its gradient there.
    return -tl.exp(tl.minimum(w, w_max))


@_helper
def _decays(w, base, row, rows, ok, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, w_max):
    """The log-decays of rows `rows` as tiles, -0 where not `ok` (a decay of 1: no effect on any
    sum): masked lanes load as -inf, whose log-decay -exp(-inf) is -0."""
    x = _tiles(w, base, row, rows, ok, N, CW, NC, _NO_DECAY)
    out = ()
    for c in tl.static_range(NC):
        out = out + (_log_decay(x[c], w_max),)
    return out


@_helper
def _shifted(
    w,
    base,
    row,
    rows,
    step: tl.constexpr,
    first,
    end,
    N: tl.constexpr,
    CW: tl.constexpr,
    NC: tl.constexpr,
    w_max,
):
    """The log-decays of rows `rows + step`, 0 outside [first, end)."""
    at = rows + step
    return _decays(w, base, row, at, (at >= first) & (at < end), N, CW, NC, w_max)


@_helper
def _edge(
    w,
    base,
    row,
    rows,
    first,
    end,
    step: tl.constexpr,
    N: tl.constexpr,
    CW: tl.constexpr,
    NC: tl.constexpr,
    w_max,
):
    """exp of the log-decays from the block's start to before each row (step -1), or from after
    each row to the block's end (step 1): this block's rows' factors against other blocks."""
    x = _shifted(w, base, row, rows, step, first, end, N, CW, NC, w_max)
    return _exp(_scan_rows(x, NC, rows.shape[0], step == 1), NC)


@_helper
def _left(w, base, row, j0, offs, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, w_max, gap):
    """A block left of the program's block (rows j0 + offs, all inside the sequence): exp(log-decays
    after each row to the block's end + gap), and gap grown by the block."""
    src = j0 + offs
    after = _scan_rows(
        _shifted(w, base, row, src, 1, j0, j0 + offs.shape[0], N, CW, NC, w_max), NC, offs.shape[0], True
    )
    f = ()
    for c in tl.static_range(NC):
        f = f + (tl.exp(after[c] + gap[c][None, :]),)
    grown = _sum_rows(_decays(w, base, row, src, src >= 0, N, CW, NC, w_max), NC)
    return f, _plus(gap, grown, NC)


@_helper
def _right(w, base, row, j0, offs, T, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, w_max, gap):
    """A block right of the program's block (rows j0 + offs, those < T inside the sequence):
    exp(log-decays from the block's start to before each row + gap), and gap grown by the block."""
    src = j0 + offs
    inside = src < T
    before = _scan_rows(
        _shifted(w, base, row, src, -1, j0, tl.minimum(j0 + offs.shape[0], T), N, CW, NC, w_max),
        NC,
        offs.shape[0],
        False,
    )
    f = ()
    for c in tl.static_range(NC):
        f = f + (tl.exp(before[c] + gap[c][None, :]),)
    grown = _sum_rows(_decays(w, base, row, src, inside, N, CW, NC, w_max), NC)
    return f, _plus(gap, grown, NC)


@_helper
def _after(w, base, row, j0, offs, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, w_max):
    """exp(log-decays after each row to the end of the block at j0), a block left of the program's."""
    x = _shifted(w, base, row, j0 + offs, 1, j0, j0 + offs.shape[0], N, CW, NC, w_max)
    return _exp(_scan_rows(x, NC, offs.shape[0], True), NC)


@_helper
def _before(w, base, row, j0, offs, T, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, w_max):
    """exp(log-decays from the start of the block at j0 to before each row), a block right of the
    program's."""
    x = _shifted(w, base, row, j0 + offs, -1, j0, tl.minimum(j0 + offs.shape[0], T), N, CW, NC, w_max)
    return _exp(_scan_rows(x, NC, offs.shape[0], False), NC)


@_helper
def _through(w, base, row, src, ok, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, w_max):
    """exp of each channel's log-decays summed over rows `src` (where `ok`): the decay through a block."""
    return _exp(_sum_rows(_decays(w, base, row, src, ok, N, CW, NC, w_max), NC), NC)


@_helper
def _decayed(acc, through, NC: tl.constexpr):
    out = ()
    for c in tl.static_range(NC):
        out = out + (acc[c] * through[c][None, :],)
    return out


# ------------------------------------------------------------------ the pairs inside a block


@_helper
def _level_pairs(half: tl.constexpr, BLOCK: tl.constexpr):
    """The pairs of one level of the in-block hierarchy, a symmetric [BLOCK, BLOCK] mask.

    Rows fall into segments of 2 * half; a segment's middle m is its start + half. The level's
    pairs are those of one segment on either side of m. Halving `half` from BLOCK / 2 down to 1
    gives every pair of distinct rows once.
    """
    t = tl.arange(0, BLOCK)[:, None]
    s = tl.arange(0, BLOCK)[None, :]
    return ((t // (2 * half)) == (s // (2 * half))) & (((t // half) % 2 == 1) != ((s // half) % 2 == 1))


@_helper
def _level_factor(
    half: tl.constexpr,
    w,
    base,
    row,
    rows,
    first,
    end,
    c: tl.constexpr,
    N: tl.constexpr,
    CW: tl.constexpr,
    w_max,
):
    """exp(E) of chunk c of the block's rows at one level: for the level's pairs log D(s, t) =
    E_t + E_s with E_x the log-decays between x and the middle m of x's segment: from m to before
    x for x >= m (a running sum of the log-decays one row back, restarting at m), after x to
    before m for x < m (one row ahead, summed upwards, restarting before m).

    Chunk by chunk, and the shifted log-decays read for each level with its masks (zero where a
    step back or ahead leaves the half-segment): held across chunks and levels they would take
    as many registers as the kernels' accumulators. The running sums stay inside half a block,
    which one warp holds: no barrier.
    """
    BLOCK: tl.constexpr = rows.shape[0]
    if half == 1:  # pairs of neighbours: nothing between them
        return tl.full([BLOCK, CW], 1.0, tl.float32)
    t = tl.arange(0, BLOCK)
    at = rows - 1
    up = _tile(w, base, row, at, (at >= first) & (at < end) & (t % half != 0), c, N, CW, _NO_DECAY)
    at = rows + 1
    down = _tile(w, base, row, at, (at >= first) & (at < end) & ((t + 1) % half != 0), c, N, CW, _NO_DECAY)
    up = _segmented(_log_decay(up, w_max), half, False)
    down = _segmented(_log_decay(down, w_max), half, True)
    return tl.exp(tl.where(((t // half) % 2 == 1)[:, None], up, down))


@_helper
def _own_pair_weights(
    ap,
    bp,
    w,
    base,
    row,
    rows,
    ok,
    first,
    end,
    N: tl.constexpr,
    CW: tl.constexpr,
    NC: tl.constexpr,
    w_max,
    LEVELS: tl.constexpr,
    DOT: tl.constexpr,
):
    """[rows, rows]: sum over channels of a_x D(x, y) b_y for the block's distinct rows x, y
    (a, b its rows of `ap` and `bp`), level by level, each level's product masked to its pairs."""
    BLOCK: tl.constexpr = rows.shape[0]
    out = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
    for level in tl.static_range(LEVELS):
        weights = tl.zeros([BLOCK, BLOCK], dtype=tl.float32)
        for c in tl.static_range(NC):
            # One chunk's product live at a time (see _spread_apart): else the forward spilled.
            tl.debug_barrier()
            e = _level_factor(BLOCK >> (level + 1), w, base, row, rows, first, end, c, N, CW, w_max)
            a = _tile(ap, base, row, rows, ok, c, N, CW) * e
            b = _tile(bp, base, row, rows, ok, c, N, CW) * e
            weights = tl.dot(a, tl.trans(b), acc=weights, input_precision=DOT)
        out += tl.where(_level_pairs(BLOCK >> (level + 1), BLOCK), weights, 0.0)
    return out


if interpreter_requested():

    def _opaque(x):
        return x
else:

    @triton.jit
    def _opaque(x):
        """x, through a copy the compiler may not merge with another: a value derived from it is
        computed again where it is used instead of once and held (in registers) in between."""
        return tl.inline_asm_elementwise(
            "mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=False, pack=1
        )


@_helper
def _own_sides(
    d,
    x,
    w,
    base,
    row,
    rows,
    first,
    end,
    c: tl.constexpr,
    N: tl.constexpr,
    CW: tl.constexpr,
    w_max,
    below,
    above,
    LEVELS: tl.constexpr,
    DOT: tl.constexpr,
):
    """Chunk c: below + sum over the block's rows y < row of d[row, y] D(row, y) x_y, and above +
    the same over y > row, level by level (x: the block's tile c of some input).

    At every level a row's partners are all on one side of it: the other half of its segment,
    below it for a row in the upper half. So each level is one product, its rows added to
    `below` or to `above` by their half.
    """
    BLOCK: tl.constexpr = rows.shape[0]
    offs = tl.arange(0, BLOCK)
    for level in tl.static_range(LEVELS):
        tl.debug_barrier()
        e = _level_factor(BLOCK >> (level + 1), w, base, row, rows, first, end, c, N, CW, w_max)
        pairs = tl.where(_level_pairs(BLOCK >> (level + 1), BLOCK), _opaque(d), 0.0)
        q = e * tl.dot(pairs, x * e, input_precision=DOT)
        upper = ((offs // (BLOCK >> (level + 1))) % 2 == 1)[:, None]
        below += tl.where(upper, q, 0.0)
        above += tl.where(upper, 0.0, q)
    return below, above


# ------------------------------------------------------------------ the kernels


@triton.jit
def wkv_bi_forward_kernel(
    r, k, v, w, u, y,  # r, k, v, w: [B, T, H*N] in any float dtype; u: [H, N]; y: [B, T, H*N] float32
    T, NBLK, w_max,
    H: tl.constexpr, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, BLOCK: tl.constexpr,
    LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    bh, i, base, row, rows = _program(T, NBLK, H, N, BLOCK)
    first = i * BLOCK
    end = tl.minimum(first + BLOCK, T)
    ok = rows < T
    offs = tl.arange(0, BLOCK)
    acc = _zeros(NC, BLOCK, CW)

    # Sources left of the block: log D = (after s, to its block's end) + gap + (block start to before t).
    # The pair weights come out as [s, t], the block's own rows the loop-invariant second operand:
    # Triton keeps that in shared memory and loads its operand layout in each step, where as the
    # first operand each thread would hold its rows' channels across the loop.
    x = _times(
        _tiles(r, base, row, rows, ok, N, CW, NC),
        _edge(w, base, row, rows, first, end, -1, N, CW, NC, w_max),
        NC,
    )
    gap = _zero_lanes(NC, CW)  # the log-decays of the blocks in between
    for back in range(0, i):
        j0 = (i - 1 - back) * BLOCK
        src = j0 + offs
        f, gap = _left(w, base, row, j0, offs, N, CW, NC, w_max, gap)
        pair = tl.trans(_pair(_times(_tiles(k, base, row, src, src >= 0, N, CW, NC), f, NC), x, NC, DOT))
        acc = _spread_apart(pair, _tiles(v, base, row, src, src >= 0, N, CW, NC), acc, NC, DOT)

    # Sources right of the block: log D = (after t, to the block's end) + gap + (its block start to before s).
    x = _times(
        _tiles(r, base, row, rows, ok, N, CW, NC),
        _edge(w, base, row, rows, first, end, 1, N, CW, NC, w_max),
        NC,
    )
    gap = _zero_lanes(NC, CW)
    for j in range(i + 1, NBLK):
        src = j * BLOCK + offs
        inside = src < T
        f, gap = _right(w, base, row, j * BLOCK, offs, T, N, CW, NC, w_max, gap)
        pair = tl.trans(_pair(_times(_tiles(k, base, row, src, inside, N, CW, NC), f, NC), x, NC, DOT))
        acc = _spread_apart(pair, _tiles(v, base, row, src, inside, N, CW, NC), acc, NC, DOT)

    # Pairs inside the block, and the bonus u on the token itself.
    pair = _own_pair_weights(r, k, w, base, row, rows, ok, first, end, N, CW, NC, w_max, LEVELS, DOT)
    rt = _tiles(r, base, row, rows, ok, N, CW, NC)
    kt = _tiles(k, base, row, rows, ok, N, CW, NC)
    ruk = _bonus(rt, u, kt, bh, H, N, CW, NC)
    vt = _tiles(v, base, row, rows, ok, N, CW, NC)
    acc = _spread(pair, vt, acc, NC, DOT)
    out = ()
    for c in tl.static_range(NC):
        out = out + (acc[c] + ruk[:, None] * vt[c],)
    _store_tiles(y, base, row, rows, ok, N, CW, NC, out)


@triton.jit
def wkv_bi_backward_dr_kernel(
    k, v, w, u, gy,  # inputs as in the forward; gy: the output gradient [B, T, H*N]
    r, dr,  # r and its gradient (r's dtype)
    xs, ys,  # [B, T, H*N] float32: the terms r drR and r drL of the log-decay gradient
    T, NBLK, w_max,
    H: tl.constexpr, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, BLOCK: tl.constexpr,
    LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """dr of one block, its rows as targets (the math: `wkv_bi_backward_dk_kernel`)."""
    bh, i, base, row, rows = _program(T, NBLK, H, N, BLOCK)
    first = i * BLOCK
    end = tl.minimum(first + BLOCK, T)
    ok = rows < T
    offs = tl.arange(0, BLOCK)

    # The block's own g, the loop-invariant operand below; dA[t, s] = g_t . v_s of the block's
    # own pairs and v_t . g_t for the bonus, taken first so the loops leave only accumulators live.
    gt = _tiles(gy, base, row, rows, ok, N, CW, NC)

    # Sources in the other blocks: dr_t = e^{in-block sum to t} * sum_s dA[t, s] k_s e^{...}, with
    # dA = g v^T taken as [s, t] (this block's g the loop-invariant second operand; see the forward).
    # The blocks are walked from the farthest in: the sum so far is decayed through each block it
    # passes (a factor per channel, which the products leave alone), so no sum of the log-decays
    # between is carried along.
    left = _zeros(NC, BLOCK, CW)
    for j in range(0, i):
        src = j * BLOCK + offs
        d_in = tl.trans(
            _pair(_tiles(v, base, row, src, src >= 0, N, CW, NC), gt, NC, DOT)
        )  # dA[t in block, s in j]
        left = _decayed(left, _through(w, base, row, src, src >= 0, N, CW, NC, w_max), NC)
        ks = _times(
            _tiles(k, base, row, src, src >= 0, N, CW, NC),
            _after(w, base, row, j * BLOCK, offs, N, CW, NC, w_max),
            NC,
        )
        left = _spread_apart(d_in, ks, left, NC, DOT)
    right = _zeros(NC, BLOCK, CW)
    for back in range(0, NBLK - 1 - i):
        j0 = (NBLK - 1 - back) * BLOCK
        src = j0 + offs
        inside = src < T
        d_in = tl.trans(_pair(_tiles(v, base, row, src, inside, N, CW, NC), gt, NC, DOT))
        right = _decayed(right, _through(w, base, row, src, inside, N, CW, NC, w_max), NC)
        ks = _times(
            _tiles(k, base, row, src, inside, N, CW, NC),
            _before(w, base, row, j0, offs, T, N, CW, NC, w_max),
            NC,
        )
        right = _spread_apart(d_in, ks, right, NC, DOT)

    # The other blocks' sums decayed to each row, then the pairs inside the block: drL from
    # sources s < t, drR from s > t.
    vt = _tiles(v, base, row, rows, ok, N, CW, NC)
    gt = _tiles(
        gy, base, row, rows, ok, N, CW, NC
    )  # read again: held, it would take registers across the loops
    d_own = _pair(gt, vt, NC, DOT)
    vg = _dot_rows(vt, gt, NC)
    drl = _times(left, _edge(w, base, row, rows, first, end, -1, N, CW, NC, w_max), NC)
    drr = _times(right, _edge(w, base, row, rows, first, end, 1, N, CW, NC, w_max), NC)
    # Chunk by chunk, each behind a barrier: the compiler would otherwise load the next chunks'
    # product operands early and run out of registers.
    for c in tl.static_range(NC):
        tl.debug_barrier()
        kc = _tile(k, base, row, rows, ok, c, N, CW)
        lo, hi = _own_sides(
            d_own, kc, w, base, row, rows, first, end, c, N, CW, w_max, drl[c], drr[c], LEVELS, DOT
        )
        rc = _tile(r, base, row, rows, ok, c, N, CW)
        _store_tile(xs, base, row, rows, ok, c, N, CW, rc * hi)
        _store_tile(ys, base, row, rows, ok, c, N, CW, rc * lo)
        uc = _u(u, bh, H, c, N, CW)
        _store_tile(dr, base, row, rows, ok, c, N, CW, lo + hi + uc[None, :] * kc * vg[:, None])


@triton.jit
def wkv_bi_backward_dk_kernel(
    r, k, v, w, u, gy,  # inputs as in the forward; gy: the output gradient [B, T, H*N]
    dk,  # k's gradient, in k's dtype
    xs, ys,  # [B, T, H*N] float32: the dr kernel's terms, to which k dkR and k dkL are added
    T, NBLK, w_max,
    H: tl.constexpr, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, BLOCK: tl.constexpr,
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
    bh, i, base, row, rows = _program(T, NBLK, H, N, BLOCK)
    first = i * BLOCK
    end = tl.minimum(first + BLOCK, T)
    ok = rows < T
    offs = tl.arange(0, BLOCK)

    # The block's own v, the loop-invariant operand below; dA of the block's own pairs as [s, t]
    # and v_s . g_s for the bonus, taken first.
    vt = _tiles(v, base, row, rows, ok, N, CW, NC)

    # Targets in the other blocks: dk_s = e^{in-block sum to s} * sum_t dA[t, s] r_t e^{...}, dA
    # taken as [s, t] (this block's v the loop-invariant second operand; see the forward kernel).
    left = _zeros(NC, BLOCK, CW)
    for j in range(0, i):  # from the farthest in, as in the dr kernel
        src = j * BLOCK + offs
        d_out = tl.trans(
            _pair(_tiles(gy, base, row, src, src >= 0, N, CW, NC), vt, NC, DOT)
        )  # dA[t in j, s], as [s, t]
        left = _decayed(left, _through(w, base, row, src, src >= 0, N, CW, NC, w_max), NC)
        rs = _times(
            _tiles(r, base, row, src, src >= 0, N, CW, NC),
            _after(w, base, row, j * BLOCK, offs, N, CW, NC, w_max),
            NC,
        )
        left = _spread_apart(d_out, rs, left, NC, DOT)
    right = _zeros(NC, BLOCK, CW)
    for back in range(0, NBLK - 1 - i):
        j0 = (NBLK - 1 - back) * BLOCK
        src = j0 + offs
        inside = src < T
        d_out = tl.trans(_pair(_tiles(gy, base, row, src, inside, N, CW, NC), vt, NC, DOT))
        right = _decayed(right, _through(w, base, row, src, inside, N, CW, NC, w_max), NC)
        rs = _times(
            _tiles(r, base, row, src, inside, N, CW, NC),
            _before(w, base, row, j0, offs, T, N, CW, NC, w_max),
            NC,
        )
        right = _spread_apart(d_out, rs, right, NC, DOT)

    # As in the dr kernel: dkL from targets t < s, dkR from t > s.
    gt = _tiles(gy, base, row, rows, ok, N, CW, NC)
    vt = _tiles(
        v, base, row, rows, ok, N, CW, NC
    )  # read again: held, it would take registers across the loops
    d_own = _pair(vt, gt, NC, DOT)
    vg = _dot_rows(vt, gt, NC)
    dkl = _times(left, _edge(w, base, row, rows, first, end, -1, N, CW, NC, w_max), NC)
    dkr = _times(right, _edge(w, base, row, rows, first, end, 1, N, CW, NC, w_max), NC)
    for c in tl.static_range(NC):  # chunk by chunk, as in the dr kernel
        tl.debug_barrier()
        rc = _tile(r, base, row, rows, ok, c, N, CW)
        lo, hi = _own_sides(
            d_own, rc, w, base, row, rows, first, end, c, N, CW, w_max, dkl[c], dkr[c], LEVELS, DOT
        )
        kc = _tile(k, base, row, rows, ok, c, N, CW)
        _store_tile(xs, base, row, rows, ok, c, N, CW, _tile(xs, base, row, rows, ok, c, N, CW) + kc * hi)
        _store_tile(ys, base, row, rows, ok, c, N, CW, _tile(ys, base, row, rows, ok, c, N, CW) + kc * lo)
        uc = _u(u, bh, H, c, N, CW)
        _store_tile(dk, base, row, rows, ok, c, N, CW, lo + hi + uc[None, :] * rc * vg[:, None])


@triton.jit
def wkv_bi_backward_dv_kernel(
    r, k, v, w, u, gy,  # inputs as in the forward; gy: the output gradient [B, T, H*N]
    dv,  # v's gradient, in v's dtype
    du_part,  # [B * H, NBLK, N] float32: this block's sum of the bonus gradient
    T, NBLK, w_max,
    H: tl.constexpr, N: tl.constexpr, CW: tl.constexpr, NC: tl.constexpr, BLOCK: tl.constexpr,
    LEVELS: tl.constexpr, DOT: tl.constexpr,
):  # fmt: skip
    """dv_s = sum_t A[t, s] g_t of one block, its rows as sources, and its share of du (see
    `wkv_bi_backward_dk_kernel`)."""
    bh, i, base, row, rows = _program(T, NBLK, H, N, BLOCK)
    first = i * BLOCK
    end = tl.minimum(first + BLOCK, T)
    ok = rows < T
    offs = tl.arange(0, BLOCK)
    acc = _zeros(NC, BLOCK, CW)

    # Targets in the other blocks, A taken as [s, t] (this block's k, decayed to the block's edge,
    # the loop-invariant second operand; see the forward kernel).
    x = _times(
        _tiles(k, base, row, rows, ok, N, CW, NC),
        _edge(w, base, row, rows, first, end, -1, N, CW, NC, w_max),
        NC,
    )
    gap = _zero_lanes(NC, CW)
    for back in range(0, i):
        j0 = (i - 1 - back) * BLOCK
        src = j0 + offs
        f, gap = _left(w, base, row, j0, offs, N, CW, NC, w_max, gap)
        a_out = tl.trans(
            _pair(_times(_tiles(r, base, row, src, src >= 0, N, CW, NC), f, NC), x, NC, DOT)
        )  # A[t in j, s], as [s, t]
        acc = _spread_apart(a_out, _tiles(gy, base, row, src, src >= 0, N, CW, NC), acc, NC, DOT)
    x = _times(
        _tiles(k, base, row, rows, ok, N, CW, NC),
        _edge(w, base, row, rows, first, end, 1, N, CW, NC, w_max),
        NC,
    )
    gap = _zero_lanes(NC, CW)
    for j in range(i + 1, NBLK):
        src = j * BLOCK + offs
        inside = src < T
        f, gap = _right(w, base, row, j * BLOCK, offs, T, N, CW, NC, w_max, gap)
        a_out = tl.trans(_pair(_times(_tiles(r, base, row, src, inside, N, CW, NC), f, NC), x, NC, DOT))
        acc = _spread_apart(a_out, _tiles(gy, base, row, src, inside, N, CW, NC), acc, NC, DOT)

    # Pairs inside the block (A as [s, t]), then the bonus u on each token.
    pair = _own_pair_weights(k, r, w, base, row, rows, ok, first, end, N, CW, NC, w_max, LEVELS, DOT)
    rt = _tiles(r, base, row, rows, ok, N, CW, NC)
    kt = _tiles(k, base, row, rows, ok, N, CW, NC)
    ruk = _bonus(rt, u, kt, bh, H, N, CW, NC)
    gt = _tiles(gy, base, row, rows, ok, N, CW, NC)
    vg = _dot_rows(_tiles(v, base, row, rows, ok, N, CW, NC), gt, NC)
    acc = _spread(pair, gt, acc, NC, DOT)
    out = ()
    rkg = ()
    for c in tl.static_range(NC):
        out = out + (acc[c] + ruk[:, None] * gt[c],)
        rkg = rkg + (rt[c] * kt[c] * vg[:, None],)
    _store_tiles(dv, base, row, rows, ok, N, CW, NC, out)
    du = _sum_rows(rkg, NC)
    part = du_part + (bh * NBLK + i) * N
    for c in tl.static_range(NC):
        tl.store(part + c * CW + tl.arange(0, CW), du[c], mask=_live(c, N, CW))


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
