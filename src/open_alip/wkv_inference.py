"""The bidirectional WKV for inference: the chunked form with its in-chunk decays factored into matmuls.

`wkv.wkv_chunked` answers with this function whenever no gradient is wanted (evaluation under
`torch.no_grad()`, `torch.inference_mode()`). It computes the same numbers as the autograd form,
in fewer and larger operations:

* In a chunk of L tokens the decay between s < t is exp(c_{t-1} - c_s), with c the running sum
  of log-decays inside the chunk (leaving out its first token, which lies between no two tokens
  of the chunk). Split at the chunk's midpoint m, it is exp(c_{t-1} - m) * exp(m - c_s): the pair
  scores become two [L, N] x [N, L] matmuls (pairs s < t and s > t), not an [L, L, N] element-wise
  product. The autograd form builds that [L, L, N] tensor, several times per chunk: it was most of
  the operator's time and grew faster than the tokens.
* Both factors lie in [exp(-R/2), exp(R/2)] for a chunk whose log-decays sum to -R, so they
  neither overflow nor underflow while R <= 2 * EXP_CAP. The chunk length is halved until every
  chunk's sum is inside that bound (released models' decays fit 32-token chunks); a chunk still
  outside it at MIN_CHUNK tokens gets its pair scores from the autograd form's exact element-wise
  product instead, so any decay logit gives the right answer.
* The factored product rounds its exponents once each: the relative error of a pair's decay is
  about float eps * R, at most 60 eps. The autograd form sums each interval separately (eps times
  the interval's own sum); the two forms agree to float32 rounding.
* Across chunks nothing changes: one N x N state per chunk boundary and direction, decayed by
  each chunk's product. The right-to-left states are built by a loop that runs backwards, with no
  flipped copies. Every prefix, suffix and whole-chunk product is the exponential of a sum of
  same-sign log-decays (a matmul with a 0/1 mask), never a difference of running sums.
"""

from __future__ import annotations

import functools

import torch

Tensor = torch.Tensor

# The factors are exp(x) with |x| <= EXP_CAP: e^30 ~ 1e13 keeps r * k * e^30 * e^30 far from
# float32's 3e38, and e^-30 far from its smallest normal number (1e-38).
EXP_CAP = 30.0
MAX_CHUNK = 32  # larger chunks: bigger matmuls and fewer boundary steps, but more chunks out of bounds
MIN_CHUNK = 4  # below this the boundary loop dominates; chunks still out of bounds go exact


def chunk_length(time: int, chunk: int) -> int:
    """As few chunks as `chunk` allows, then as short as possible: T=49 -> 2 x 25, not 32 + 17."""
    n_chunks = -(-time // chunk)
    return -(-time // n_chunks)


@functools.lru_cache(maxsize=32)
def _masks(length: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(sums, lower): `sums @ logd` gives, stacked over the chunk's rows t,

    [0]  c_{t-1} = sum_{1 <= l < t} logd_l     (c_{-1} = c_0 = 0: the first token is left out)
    [1]  c_t     = sum_{1 <= l <= t} logd_l
    [2]  sum_{l < t} logd_l                    (prefix: the chunk's start up to t)
    [3]  sum_{l > t} logd_l                    (suffix: after t to the chunk's end)
    [4]  sum_l logd_l                          (the whole chunk; one row)

    and `lower[t, s]` is s < t. Every row sums same-sign terms: no cancellation.
    """
    with torch.inference_mode(False):  # a cached tensor must be usable outside inference mode too
        return _build_masks(length, device, dtype)


def _build_masks(length: int, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    idx = torch.arange(length, device=device)
    t, l = idx.view(-1, 1), idx.view(1, -1)
    rows = [
        (l >= 1) & (l < t),
        (l >= 1) & (l <= t),
        l < t,
        l > t,
        torch.ones(1, length, dtype=torch.bool, device=device),
    ]
    return torch.cat(rows).to(dtype), (l < t)


def _carry_left(kv: Tensor, carry: Tensor) -> Tensor:
    """States entering each chunk from the left: S_0 = 0, S_{c+1} = carry_c * S_c + kv_c (dim -3)."""
    states = torch.empty_like(kv)
    states[..., 0, :, :] = 0
    for c in range(kv.shape[-3] - 1):
        torch.addcmul(kv[..., c, :, :], states[..., c, :, :], carry[..., c, :, None], out=states[..., c + 1, :, :])
    return states


def _carry_right(kv: Tensor, carry: Tensor) -> Tensor:
    """States entering each chunk from the right: S_last = 0, S_{c-1} = carry_c * S_c + kv_c."""
    states = torch.empty_like(kv)
    last = kv.shape[-3] - 1
    states[..., last, :, :] = 0
    for c in range(last, 0, -1):
        torch.addcmul(kv[..., c, :, :], states[..., c, :, :], carry[..., c, :, None], out=states[..., c - 1, :, :])
    return states


def _exact_scores(r: Tensor, k: Tensor, logd: Tensor, lower: Tensor) -> Tensor:
    """The pair scores of some chunks ([n, L, N] each) as the autograd form computes them:
    sum_j r_t k_s exp(sum of logd strictly between s and t), one [L, L, N] product."""
    length = logd.shape[-2]
    # between[t, s, l]: s < l < t, summed by matmul (same-sign terms only)
    idx = torch.arange(length, device=logd.device)
    between = ((idx.view(1, -1, 1) < idx.view(1, 1, -1)) & (idx.view(1, 1, -1) < idx.view(-1, 1, 1)))
    sums = (between.to(logd.dtype).reshape(length * length, length) @ logd).reshape(-1, length, length, logd.shape[-1])
    decay = torch.exp(sums) * lower.unsqueeze(-1)
    decay = decay + decay.transpose(-2, -3)
    return (r.unsqueeze(-2) * k.unsqueeze(-3) * decay).sum(-1)


def _choose_length(logd: Tensor, time: int, chunk: int | None) -> int:
    """The longest chunk (at most MAX_CHUNK, or `chunk`) whose log-decay sums stay in bounds."""
    length = chunk_length(time, min(chunk or MAX_CHUNK, max(time, 1)))
    if chunk is not None:
        return length
    while length > MIN_CHUNK:
        n_chunks = -(-time // length)
        pad = n_chunks * length - time
        padded = torch.nn.functional.pad(logd, (0, 0, 0, pad)) if pad else logd
        sums = padded.reshape(*logd.shape[:-2], n_chunks, length, logd.shape[-1]).sum(-2)
        if bool(sums.min() >= -2 * EXP_CAP):
            break
        length = chunk_length(time, length // 2)
    return length


def wkv_chunked_inference(
    r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor, *, w_max: float, chunk: int | None = None
) -> Tensor:
    """Forward only: `wkv.wkv_chunked`'s numbers with the in-chunk decays factored (module docstring).

    r, k, v, w `[B, T, C]`, u `[H, N]`, all of one floating dtype; w is clamped at `w_max` as the
    autograd form clamps it. `chunk` fixes the chunk length (default: chosen from the decays).
    """
    heads, size = u.shape
    batch, time, channels = r.shape
    if time == 0:
        return r.new_empty(batch, 0, channels)
    # [B, H, T, N], one copy each; the log-decay -exp(w) computed in place on its copy.
    r, k, v, w = (t.reshape(batch, time, heads, size).transpose(1, 2) for t in (r, k, v, w))
    logd = w.clamp(max=w_max).exp_().neg_().contiguous()
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

    r, k, v, logd = chunks(r), chunks(k), chunks(v), chunks(logd)
    sums_mask, lower = _masks(length, r.device, r.dtype)
    sums = sums_mask @ logd  # [M, 4L + 1, N], M = B * H * chunks
    inner_prev, inner, before, after = sums[:, :-1].split(length, dim=1)
    total = sums[:, -1]

    # In-chunk pairs: exp(c_{t-1} - c_s) = exp(c_{t-1} - m) exp(m - c_s) for s < t, and with t and s
    # swapped for s > t. m = c_{L-2} / 2 centres both factors (c_{L-1} enters no pair).
    mid = inner[:, max(length - 2, 0)].unsqueeze(1) * 0.5
    grow = (inner_prev - mid).clamp_(-EXP_CAP, EXP_CAP).exp_()  # exp(c_{t-1} - m)
    shrink = (mid - inner).clamp_(-EXP_CAP, EXP_CAP).exp_()  # exp(m - c_t)
    scores = torch.where(lower, (r * grow) @ (k * shrink).transpose(1, 2), (r * shrink) @ (k * grow).transpose(1, 2))
    bonus = (r * k).view(batch, heads, n_chunks * length, size).mul_(u.view(1, heads, 1, size)).sum(-1)
    scores.diagonal(dim1=1, dim2=2).copy_(bonus.view(-1, length))
    out_of_bounds = (inner[:, max(length - 2, 0)].amin(-1) < -2 * EXP_CAP).nonzero().squeeze(1)
    if out_of_bounds.numel():
        picked = [t.index_select(0, out_of_bounds) for t in (r, k, logd)]
        exact = _exact_scores(*picked, lower)
        exact.diagonal(dim1=1, dim2=2).copy_(scores.index_select(0, out_of_bounds).diagonal(dim1=1, dim2=2))
        scores.index_copy_(0, out_of_bounds, exact)
    y = scores @ v

    # Across chunks: from the left, token t sees the state entering its chunk decayed by the chunk's
    # prefix before t; a source s enters the next state decayed by the suffix after s. From the
    # right, prefix and suffix swap.
    prefix, suffix, carry = before.exp(), after.exp(), total.exp()
    grid = (batch * heads, n_chunks)
    from_left = _carry_left(((k * suffix).transpose(1, 2) @ v).view(*grid, size, size), carry.view(*grid, size))
    from_right = _carry_right(((k * prefix).transpose(1, 2) @ v).view(*grid, size, size), carry.view(*grid, size))
    y = torch.baddbmm(y, r * prefix, from_left.view(-1, size, size))
    y = torch.baddbmm(y, r * suffix, from_right.view(-1, size, size))
    y = y.view(batch, heads, n_chunks * length, size)[:, :, :time]
    return y.transpose(1, 2).reshape(batch, time, channels)
