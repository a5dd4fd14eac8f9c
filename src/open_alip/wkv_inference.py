"""The bidirectional WKV for inference: the chunked form with its in-chunk decays factored into matmuls.

`wkv.wkv_chunked` answers with this function whenever no gradient is wanted (evaluation under
`torch.no_grad()` or `torch.inference_mode()`). It computes the same numbers as the autograd form,
in fewer and larger operations:

* In a chunk of L tokens the decay between s < t is exp(c_{t-1} - c_s), with c the running sum of
  log-decays inside the chunk (leaving out its first token, which lies between no two tokens of the
  chunk). Split at the chunk's midpoint m, it is exp(c_{t-1} - m) * exp(m - c_s): the pair scores
  become two [L, N] x [N, L] matmuls (pairs s < t and s > t), not an [L, L, N] element-wise product.
  The autograd form builds that [L, L, N] tensor, several times per chunk: it was most of the
  operator's time and grew faster than the tokens.
* Both factors lie in [exp(-R/2), exp(R/2)] for a chunk whose inner log-decays sum to -R, so they
  neither overflow nor underflow while R <= 2 * EXP_CAP. Chunks are up to MAX_CHUNK tokens (one
  chunk, no boundary work, up to ONE_CHUNK tokens: B/32 images at 224 px, texts); the length is halved
  while more than MAX_EXACT_SHARE of the chunks are out of bounds, and a chunk still out of bounds
  gets its pair scores from the autograd form's exact element-wise product: any decay logit gives
  the right answer, strong decays only cost time. A single step's log-decay is floored at
  STEP_FLOOR (see there), which changes no value either dtype can hold.
* The exponents carry the rounding of running sums of magnitude up to R, so a pair's decay has a
  relative error of a few float eps times R, where the autograd form sums each interval on its own.
  Both agree with the float64 reference to float32 rounding (about 5e-7 of the output's largest
  value; tests/open_alip/test_wkv.py).
* Across chunks nothing changes: one N x N state per chunk boundary and direction, decayed by each
  chunk's product. The right-to-left states are built by a loop that runs backwards, with no
  flipped copies. Every prefix, suffix and whole-chunk product is the exponential of a sum of
  same-sign log-decays, never a difference of running sums.
"""

from __future__ import annotations

import functools

import torch

Tensor = torch.Tensor

# The factors are exp(x) with |x| <= EXP_CAP: e^30 ~ 1e13 keeps r * k * e^30 * e^30 far from
# float32's 3e38, and e^-30 far from its smallest normal number (1e-38).
EXP_CAP = 30.0
MAX_CHUNK = 64  # longer chunks: fewer boundary steps, but more chunks out of bounds
# Up to this many tokens the whole sequence is one chunk: no boundary states at all. Texts (77 tokens)
# and B/32 images at 224 px (49) take 1.5-2x less WKV time so than in two chunks.
ONE_CHUNK = 80
MIN_CHUNK = 4  # below this the boundary loop dominates; chunks still out of bounds go exact
MAX_EXACT_SHARE = 1 / 16  # chunks allowed the exact scores (each costs about what the factored form saves 5x)
# A step's log-decay below this (d < 4e-18) is raised to it: any pair across such a step has a decay
# below 4e-18 either way, nothing float32 or float64 at these magnitudes can hold beside the pair's
# other terms, and one near-zero decay then no longer pushes its whole chunk out of bounds.
STEP_FLOOR = -40.0


def chunk_length(time: int, chunk: int) -> int:
    """As few chunks as `chunk` allows, then as short as possible: T=196, chunk 64 -> 4 x 49, not
    3 x 64 + 4."""
    n_chunks = -(-time // chunk)
    return -(-time // n_chunks)


@functools.lru_cache(maxsize=32)
def _masks(length: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(after, lower): `after @ logd` sums each chunk's log-decays after token t (after[t, l] = l > t:
    same-sign terms, no cancellation, where a running sum subtracted from the total would cancel);
    lower[t, s] is s < t."""
    with torch.inference_mode(False):  # a cached tensor must be usable outside inference mode too
        idx = torch.arange(length, device=device)
        row, col = idx.view(-1, 1), idx.view(1, -1)
        return (col > row).to(dtype), (col < row)


def _carry_left(kv: Tensor, carry: Tensor) -> Tensor:
    """States entering each chunk from the left: S_0 = 0, S_{c+1} = carry_c * S_c + kv_c (dim -3)."""
    states = torch.empty_like(kv)
    states[..., 0, :, :] = 0
    for c in range(kv.shape[-3] - 1):
        torch.addcmul(
            kv[..., c, :, :], states[..., c, :, :], carry[..., c, :, None], out=states[..., c + 1, :, :]
        )
    return states


def _carry_right(kv: Tensor, carry: Tensor) -> Tensor:
    """States entering each chunk from the right: S_last = 0, S_{c-1} = carry_c * S_c + kv_c."""
    states = torch.empty_like(kv)
    last = kv.shape[-3] - 1
    states[..., last, :, :] = 0
    for c in range(last, 0, -1):
        torch.addcmul(
            kv[..., c, :, :], states[..., c, :, :], carry[..., c, :, None], out=states[..., c - 1, :, :]
        )
    return states


def _exact_scores(r: Tensor, k: Tensor, logd: Tensor, lower: Tensor) -> Tensor:
    """The pair scores of some chunks ([n, L, N] each) as the autograd form computes them:
    sum_j r_t k_s exp(sum of logd strictly between s and t), one [L, L, N] product."""
    length = logd.shape[-2]
    # between[t, s, l]: s < l < t, summed by matmul (same-sign terms only)
    idx = torch.arange(length, device=logd.device)
    between = (idx.view(1, -1, 1) < idx.view(1, 1, -1)) & (idx.view(1, 1, -1) < idx.view(-1, 1, 1))
    sums = (between.to(logd.dtype).reshape(length * length, length) @ logd).reshape(
        -1, length, length, logd.shape[-1]
    )
    decay = torch.exp(sums) * lower.unsqueeze(-1)
    decay = decay + decay.transpose(-2, -3)
    return (r.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1)


def _share_out_of_bounds(logd: Tensor, time: int, length: int) -> float:
    """The share of chunks of `length` tokens whose inner log-decays (all but the first and last
    token's) sum below -2 * EXP_CAP in some channel."""
    n_chunks = -(-time // length)
    pad = n_chunks * length - time
    padded = torch.nn.functional.pad(logd, (0, 0, 0, pad)) if pad else logd
    inner = padded.reshape(*logd.shape[:-2], n_chunks, length, logd.shape[-1])[..., 1 : length - 1, :].sum(-2)
    return (inner.amin(-1) < -2 * EXP_CAP).float().mean().item()


def _choose_length(logd: Tensor, time: int, chunk: int | None) -> int:
    """`chunk` when given; else the longest length up to MAX_CHUNK (all `time` tokens up to ONE_CHUNK;
    halving down to MIN_CHUNK) at which at most MAX_EXACT_SHARE of the chunks need the exact scores."""
    length = chunk_length(time, min(chunk or (time if time <= ONE_CHUNK else MAX_CHUNK), time))
    if chunk is not None:
        return length
    while length > MIN_CHUNK and _share_out_of_bounds(logd, time, length) > MAX_EXACT_SHARE:
        length = chunk_length(time, length // 2)
    return length


def wkv_chunked_inference(
    r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor, chunk: int | None = None
) -> Tensor:
    """Forward only: `wkv.wkv_chunked`'s numbers with the in-chunk decays factored (module docstring).

    r, k, v, w `[B, T, C]`, u `[H, N]`, all of one floating dtype. `chunk` fixes the chunk length
    (default: chosen from the decays).
    """
    heads, size = u.shape
    batch, time, channels = r.shape
    if time == 0:
        return r.new_empty(batch, 0, channels)
    # [B, H, T, N], one copy each; the log-decay -exp(w) computed in place on its copy.
    r, k, v, w = (t.reshape(batch, time, heads, size).transpose(1, 2) for t in (r, k, v, w))
    logd = w.clone(memory_format=torch.contiguous_format).exp_().neg_().clamp_(min=STEP_FLOOR)
    length = _choose_length(logd, time, chunk)
    n_chunks = -(-time // length)
    pad = n_chunks * length - time

    def chunks(t: Tensor) -> Tensor:
        # Padding after the last token: k = 0 adds nothing, logd = 0 (d = 1) lies between no two
        # real tokens, r = 0 rows are cut off at the end.
        if not pad:
            return t.reshape(batch * heads * n_chunks, length, size)
        out = t.new_zeros(batch, heads, n_chunks * length, size)
        out[:, :, :time] = t
        return out.view(batch * heads * n_chunks, length, size)

    r, k, v, logd = chunks(r), chunks(k), chunks(v), chunks(logd)  # [M, L, N], M = B * H * chunks
    after, lower = _masks(length, r.device, r.dtype)

    # In-chunk pairs. c_t = sum_{1 <= l <= t} logd_l (the first token lies between no two tokens of
    # its chunk), c_{-1} = 0. For s < t the decay is exp(c_{t-1} - c_s) = exp(c_{t-1} - m) exp(m - c_s);
    # for s > t, t and s swap. m = c_{L-2} / 2 centres both factors (c_{L-1} enters no pair).
    inner = logd.clone()
    inner[:, 0] = 0
    inner.cumsum_(1)
    last = max(length - 2, 0)
    mid = inner[:, last : last + 1] * 0.5
    shrink = (mid - inner).clamp_(-EXP_CAP, EXP_CAP).exp_()  # exp(m - c_t)
    grow = torch.empty_like(inner)  # exp(c_{t-1} - m)
    grow[:, :1] = -mid
    torch.sub(inner[:, :-1], mid, out=grow[:, 1:])
    grow.clamp_(-EXP_CAP, EXP_CAP).exp_()
    scores = torch.where(
        lower, (r * grow) @ (k * shrink).transpose(1, 2), (r * shrink) @ (k * grow).transpose(1, 2)
    )
    del grow, shrink
    bonus = (r * k).view(batch, heads, n_chunks * length, size).mul_(u.view(1, heads, 1, size)).sum(-1)
    scores.diagonal(dim1=1, dim2=2).copy_(bonus.view(-1, length))
    out_of_bounds = (inner[:, last].amin(-1) < -2 * EXP_CAP).nonzero().squeeze(1)
    if out_of_bounds.numel():
        picked = [t.index_select(0, out_of_bounds) for t in (r, k, logd)]
        exact = _exact_scores(*picked, lower)
        exact.diagonal(dim1=1, dim2=2).copy_(scores.index_select(0, out_of_bounds).diagonal(dim1=1, dim2=2))
        scores.index_copy_(0, out_of_bounds, exact)
    y = scores @ v
    del scores
    if n_chunks == 1:
        return y.view(batch, heads, length, size)[:, :, :time].transpose(1, 2).reshape(batch, time, channels)

    # Across chunks: from the left, token t sees the state entering its chunk decayed by the chunk's
    # prefix before t; a source s enters the next state decayed by the suffix after s. From the
    # right, prefix and suffix swap. prefix_t = logd_0 + c_{t-1} and the whole chunk logd_0 + c_{L-1}
    # add same-sign terms; the suffix is summed by matmul.
    first = logd[:, :1]
    prefix = torch.empty_like(inner)
    prefix[:, :1] = 0
    torch.add(inner[:, :-1], first, out=prefix[:, 1:])
    prefix.exp_()
    suffix = (after @ logd).exp_()
    carry = (inner[:, -1] + first[:, 0]).exp_()
    del inner
    grid = (batch * heads, n_chunks)
    from_left = _carry_left(
        ((k * suffix).transpose(1, 2) @ v).view(*grid, size, size), carry.view(*grid, size)
    )
    y = torch.baddbmm(y, r * prefix, from_left.view(-1, size, size))
    del from_left
    from_right = _carry_right(
        ((k * prefix).transpose(1, 2) @ v).view(*grid, size, size), carry.view(*grid, size)
    )
    y = torch.baddbmm(y, r * suffix, from_right.view(-1, size, size))
    y = y.view(batch, heads, n_chunks * length, size)[:, :, :time]
    return y.transpose(1, 2).reshape(batch, time, channels)
