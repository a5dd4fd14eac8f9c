"""The bidirectional WKV-6 operator of RWKV-CLIP.

For one batch element and one head, with key channel j and value channel i:

    y_t[i] = sum_j r_t[j] * ( sum_{s != t} D(s, t)[j] k_s[j] v_s[i]  +  u[j] k_t[j] v_t[i] )

where D(s, t) is the product of the per-step decays d_l = exp(-exp(w_l)) strictly
between s and t (both end points excluded). Inputs are `[B, T, C]` with channel
c = head * N + d; the bonus `u` is `[H, N]`.

Five implementations compute the same numbers:

* `wkv_reference`: the two recurrent scans of the original CUDA kernel, written in
  plain PyTorch. O(T) Python steps; memory for autograd grows with T * N * N.
* `wkv_chunked` (the default on CPU): splits time into chunks of L tokens. Without
  gradients it is the forward-only form of `wkv_inference.py` (the same chunks, with the
  in-chunk decays factored into matmuls); with them, the autograd form described here. Pairs inside a
  chunk are handled as a small masked L x L "attention" per channel; pairs across
  chunks go through one N x N state per chunk boundary and direction. The in-chunk
  part is a custom autograd Function whose backward recomputes the decays from the
  saved inputs: between forward and backward only [T, N]-sized tensors and the
  per-chunk N x N states stay alive.
  Memory is O(T * L * N + T / L * N * N) per head, never T * T * N. Every decay factor is the
  exponential of a sum of log-decays over a contiguous range (never a difference of
  prefix sums), so nothing cancels and nothing overflows for any decay logit.
* `wkv_fla`: flash-linear-attention's fused recurrent RWKV-6 Triton kernels, one pass per
  direction (`wkv_fla.py`). The fast path on CUDA; on CPU it runs under Triton's
  interpreter when TRITON_INTERPRET=1 is set, which is how it is checked without a GPU.
* `wkv_fla_chunk`: fla's chunked RWKV-6 kernels, CUDA only and never chosen by "auto"
  (see its docstring).
* `wkv_bi_triton`: Triton kernels of our own for both directions at once
  (`wkv_bi_triton.py`): blocks of 16 tokens as matrix products; reads r, k, v, w in the
  dtype they come in (bf16 under autocast), no float32 copies, flips or partial buffers.
  Selected by name only until a GPU measurement shows it faster than fla; checked like
  fla under the interpreter.

`wkv(..., impl="auto")` takes "fla" for CUDA tensors when fla imports and "chunked"
otherwise (never "bi_triton" until a GPU measurement shows it faster); `resolve_wkv_impl` says
which implementation a name means on a device, or why it cannot run there.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from . import wkv_bi_triton as _bi
from . import wkv_fla as _fla
from .choices import WKV_IMPL_CHOICES, WKV_IMPLEMENTATIONS
from .wkv_inference import chunk_length, wkv_chunked_inference

Tensor = torch.Tensor

# exp(-exp(20)) is exactly 0 in float32 and float64 alike, and so is the true
# gradient there; clamping keeps -exp(w) finite so autograd never meets inf * 0.
_W_MAX = 20.0
DEFAULT_CHUNK = 16


def _split_heads(x: Tensor, heads: int) -> Tensor:
    batch, time, channels = x.shape
    return x.reshape(batch, time, heads, channels // heads).transpose(1, 2)  # [B, H, T, N]


def _merge_heads(y: Tensor) -> Tensor:
    batch, heads, time, size = y.shape
    return y.transpose(1, 2).reshape(batch, time, heads * size)


def _check(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor) -> None:
    if r.dim() != 3 or not (r.shape == k.shape == v.shape == w.shape):
        raise ValueError(
            f"wkv expects r, k, v, w of one shape [B, T, C], got "
            f"{tuple(r.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, {tuple(w.shape)}"
        )
    if u.dim() != 2 or u.shape[0] * u.shape[1] != r.shape[2]:
        raise ValueError(f"wkv expects u of shape [H, C/H] for C={r.shape[2]}, got {tuple(u.shape)}")


def wkv_reference(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor) -> Tensor:
    """The kernel's two scans: right-to-left without bonus plus left-to-right with it."""
    _check(r, k, v, w, u)
    heads = u.shape[0]
    r, k, v, w = (_split_heads(t, heads) for t in (r, k, v, w))
    decay = torch.exp(-torch.exp(w))
    batch, _, time, size = r.shape
    bonus = u.reshape(1, heads, size, 1)

    state = r.new_zeros(batch, heads, size, size)  # [key j, value i]
    right_to_left: list[Tensor] = [r.new_zeros(0)] * time
    for t in reversed(range(time)):
        right_to_left[t] = torch.einsum("bhj,bhji->bhi", r[:, :, t], state)
        state = state * decay[:, :, t, :, None] + k[:, :, t, :, None] * v[:, :, t, None, :]

    state = r.new_zeros(batch, heads, size, size)
    left_to_right: list[Tensor] = []
    for t in range(time):
        kv = k[:, :, t, :, None] * v[:, :, t, None, :]
        left_to_right.append(torch.einsum("bhj,bhji->bhi", r[:, :, t], state + bonus * kv))
        state = state * decay[:, :, t, :, None] + kv

    y = torch.stack(left_to_right, dim=2) + torch.stack(right_to_left, dim=2)
    return _merge_heads(y)


def _interval_masks(
    length: int, device: torch.device, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """0/1 matrices that sum log-decays over index intervals by matmul.

    Summing with a matmul adds only same-sign terms (never a difference of prefix
    sums, which would cancel), and its backward is a matmul too (cumsum's backward
    flips, which is slow on CPU).
    """
    idx = torch.arange(length, device=device)
    t, s, mid = idx.view(-1, 1, 1), idx.view(1, -1, 1), idx.view(1, 1, -1)
    between = ((s < mid) & (mid < t)).to(dtype).reshape(length * length, length)  # [t*s, l]: s < l < t
    lower = (idx.view(1, -1) < idx.view(-1, 1)).to(dtype)  # [t, s]: s < t
    # As [t, l] matrices, `lower` also sums the prefix (l < t) inside a chunk and its
    # transpose the suffix (l > t).
    return between, lower, lower, lower.T


def _lower_decay(logd: Tensor, between: Tensor, lower_mask: Tensor) -> Tensor:
    """[..., t, s, N]: exp(sum_{s<l<t} logd_l) where s < t, else 0."""
    length, size = logd.shape[-2:]
    sums = (between @ logd).reshape(*logd.shape[:-2], length, length, size)
    return torch.exp(sums) * lower_mask.unsqueeze(-1)


class _IntraChunkScores(torch.autograd.Function):
    """scores[t, s] = sum_j r_t[j] k_s[j] decay[t, s, j] for the pairs inside each chunk.

    decay = lower + lower^T is symmetric (the interval between s and t is the same
    either way). The backward recomputes `lower` from the saved inputs instead of
    keeping three [L, L, N] tensors per chunk alive between forward and backward:
    the operator then holds only its inputs, like the original CUDA kernel.
    """

    @staticmethod
    def forward(ctx, r: Tensor, k: Tensor, logd: Tensor, between: Tensor, lower_mask: Tensor) -> Tensor:
        ctx.save_for_backward(r, k, logd, between, lower_mask)
        with torch.autocast(device_type=r.device.type, enabled=False):
            lower = _lower_decay(logd, between, lower_mask)
            return ((r.unsqueeze(-2) * k.unsqueeze(-3)) * (lower + lower.transpose(-2, -3))).sum(-1)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        # A backward() called inside an autocast region must not drop these to bf16.
        with torch.autocast(device_type=grad.device.type, enabled=False):
            return _IntraChunkScores._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad: Tensor):
        r, k, logd, between, lower_mask = ctx.saved_tensors
        lower = _lower_decay(logd, between, lower_mask)
        weighted = grad.unsqueeze(-1) * (lower + lower.transpose(-2, -3))  # g[t,s] decay[t,s,j]
        grad_r = (weighted * k.unsqueeze(-3)).sum(-2)
        grad_k = (weighted * r.unsqueeze(-2)).sum(-3)
        del weighted
        grad_decay = grad.unsqueeze(-1) * (r.unsqueeze(-2) * k.unsqueeze(-3))
        # decay[t,s] and decay[s,t] both read lower[t,s]; d lower / d sums = lower.
        grad_sums = (grad_decay + grad_decay.transpose(-2, -3)) * lower
        length, size = logd.shape[-2:]
        grad_logd = between.T @ grad_sums.reshape(*logd.shape[:-2], length * length, size)
        return grad_r, grad_k, grad_logd, None, None


def _carry(kv: Tensor, carry: Tensor) -> Tensor:
    """States entering each chunk: S_0 = 0, S_{c+1} = carry_c * S_c + kv_c (over dim -3)."""
    states = [torch.zeros_like(kv[..., 0, :, :])]
    for c in range(kv.shape[-3] - 1):
        states.append(states[-1] * carry[..., c, :, None] + kv[..., c, :, :])
    return torch.stack(states, dim=-3)


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def wkv_chunked(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor, chunk: int | None = None) -> Tensor:
    """Chunked parallel form of `wkv_reference` (same numbers, O(T * chunk * N) memory).

    When no gradient is wanted (no input requires one, or grad mode is off) this is the
    forward-only form of `wkv_inference.py`, matmuls instead of [L, L, N] products, 6-13x faster
    on CPU (`python -m benchmarks.inference --wkv`); otherwise the autograd form below. `chunk`
    fixes the chunk length (default: DEFAULT_CHUNK for the autograd form, chosen from the decays for
    the forward-only one).
    """
    _check(r, k, v, w, u)
    if not _needs_grad(r, k, v, w, u):
        return wkv_chunked_inference(r, k, v, w, u, chunk=chunk)
    return wkv_chunked_autograd(r, k, v, w, u, chunk=chunk or DEFAULT_CHUNK)


def wkv_chunked_autograd(
    r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor, chunk: int = DEFAULT_CHUNK
) -> Tensor:
    """The chunked form with its custom backward (what training runs), also without grad."""
    _check(r, k, v, w, u)
    heads, size = u.shape
    batch, time, _ = r.shape
    length = chunk_length(time, max(1, int(chunk)))  # T=49, chunk 16 -> 4 x 13, not 4 x 16
    n_chunks = -(-time // length)
    pad = n_chunks * length - time

    logd = -torch.exp(w.clamp(max=_W_MAX))
    # Padding sits after the last real token: k = 0 adds nothing, log-decay 0 (d = 1)
    # lies between no pair of real tokens, r = 0 rows are cut off below.
    r, k, v, logd = (
        torch.nn.functional.pad(_split_heads(t, heads), (0, 0, 0, pad)).reshape(
            batch, heads, n_chunks, length, size
        )
        for t in (r, k, v, logd)
    )
    between, lower_mask, before, after = _interval_masks(length, r.device, r.dtype)

    scores = _IntraChunkScores.apply(r, k, logd, between, lower_mask)
    scores = scores + torch.diag_embed((r * u.reshape(1, heads, 1, 1, size) * k).sum(-1))
    y = scores @ v

    # Across chunks, one N x N state per boundary and direction. From the left, token t
    # sees state_c decayed by the chunk prefix before t; a source s enters the next
    # state decayed by the chunk suffix after s. From the right, prefix and suffix swap.
    prefix = torch.exp(before @ logd)  # prod of d over [chunk start, t)
    suffix = torch.exp(after @ logd)  # prod of d over (t, chunk end]
    carry = torch.exp(logd.sum(-2))  # the whole chunk
    from_left = _carry((k * suffix).transpose(-1, -2) @ v, carry)
    from_right = _carry(((k * prefix).transpose(-1, -2) @ v).flip(-3), carry.flip(-2)).flip(-3)
    y = y + (r * prefix) @ from_left + (r * suffix) @ from_right

    y = y.reshape(batch, heads, n_chunks * length, size)[:, :, :time]
    return _merge_heads(y)


# exp(-exp(w)) is 0 in float32 once exp(w) > 104 (exp(-104) is below half the smallest
# subnormal). fla's gradient of the log-decay, like bi_triton's, is a difference of two
# running sums, so its rounding error is multiplied by dlogd/dw = -exp(w); clamping where
# float32 decays are already 0 changes no forward value and caps that factor at 105.
_F32_W_MAX = math.log(105.0)


def _log_decay_per_head(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor) -> list[Tensor]:
    """float32 `[B, T, H, N]` views of r, k, v and of the log-decay -exp(w), and u."""
    _check(r, k, v, w, u)
    heads, size = u.shape
    shape = (*r.shape[:2], heads, size)
    logd = -torch.exp(w.float().clamp(max=_F32_W_MAX))
    return [t.float().reshape(shape).contiguous() for t in (r, k, v, logd)] + [u.float().contiguous()]


def wkv_fla(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor) -> Tensor:
    """`wkv_reference` through fla's fused recurrent kernels; computes in float32.

    Forward and the gradients of r, k, v, u agree with the reference to float32
    rounding. The gradient of w carries fla's rounding error times exp(w) (at most
    105, see _F32_W_MAX): about 1e-4 of the largest w gradient when decay logits
    reach +4, about 1e-6 when they stay below 0.
    """
    problem = _fla.fla_problem(r.device)
    if problem:
        raise ValueError(f"wkv implementation 'fla' cannot run on {r.device.type}: {problem}")
    y = _fla.wkv_fla_op(*_log_decay_per_head(r, k, v, w, u))
    return y.reshape(r.shape).to(r.dtype)


def wkv_fla_chunk(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor) -> Tensor:
    """`wkv_reference` through fla's chunked RWKV-6 kernels (`chunk_rwkv6`); CUDA only.

    Not verified on CPU: Triton's interpreter cannot run these kernels (in fla-core
    0.6.0 `chunk_fwd_h` calls `.to()` on a loop index, which the interpreter hands over
    as a Python int). So "auto" never picks it; benchmarks/wkv.py reports its largest
    difference from "chunked" on a GPU. It calls fla's public autograd function, which
    fla marks torch.compiler.disable: under torch.compile it is a graph break.
    """
    if r.device.type != "cuda":
        raise ValueError(f"wkv implementation 'fla_chunk' cannot run on {r.device.type}: {_CHUNK_CPU}")
    problem = _fla.fla_problem(r.device)
    if problem:
        raise ValueError(f"wkv implementation 'fla_chunk' cannot run on cuda: {problem}")
    chunk_rwkv6 = _fla.chunk_rwkv6()
    r4, k4, v4, logd4, u = _log_decay_per_head(r, k, v, w, u)
    left, _ = chunk_rwkv6(r4, k4, v4, logd4, u, scale=1.0)
    flipped = [t.flip(1) for t in (r4, k4, v4, logd4)]
    right, _ = chunk_rwkv6(*flipped, torch.zeros_like(u), scale=1.0)
    return (left + right.flip(1)).reshape(r.shape).to(r.dtype)


def wkv_bi_triton(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor) -> Tensor:
    """`wkv_reference` through our own Triton kernel pair; float32 output.

    r, k, v, w and u are read in their own dtypes (float32, bf16 or fp16, not
    necessarily the same); float64 ones are computed in float32 and the output is then
    float64. Gradients come back in each input's dtype. As with fla, the gradient of w
    carries float32 rounding times exp(w), at most 105 (see _F32_W_MAX).
    """
    _check(r, k, v, w, u)
    problem = _bi.bi_triton_problem(r.device)
    if problem:
        raise ValueError(f"wkv implementation 'bi_triton' cannot run on {r.device.type}: {problem}")
    args = [t.float() if t.dtype == torch.float64 else t for t in (r, k, v, w, u)]
    return _bi.wkv_bi_triton_op(*args, _F32_W_MAX).to(
        torch.float64 if r.dtype == torch.float64 else torch.float32
    )


_CHUNK_CPU = "it runs only on CUDA tensors (Triton's interpreter cannot run fla's chunked kernels)"

IMPLEMENTATIONS: dict[str, Callable[..., Tensor]] = {
    "chunked": wkv_chunked,
    "reference": wkv_reference,
    "fla": wkv_fla,
    "fla_chunk": wkv_fla_chunk,
    "bi_triton": wkv_bi_triton,
}
# The names are choices.py's (what the CLIs offer without importing this module); they must be these.
if tuple(IMPLEMENTATIONS) != WKV_IMPLEMENTATIONS:
    raise ImportError(
        f"src/open_alip/choices.py names {WKV_IMPLEMENTATIONS}, wkv.py implements {tuple(IMPLEMENTATIONS)}"
    )
# Triton kernels: on CPU they run only under Triton's interpreter (for checks, slow).
TRITON_IMPLEMENTATIONS = frozenset({"fla", "fla_chunk", "bi_triton"})
# Implementations that take r, k, v, w, u in the dtypes they come in; `wkv` converts
# the inputs of the others to float32 (float64) first.
_OWN_DTYPES = frozenset({"bi_triton"})


def _unusable(impl: str, device: torch.device) -> str | None:
    """Why `impl` (a concrete name) cannot run on `device`, or None."""
    if impl == "fla_chunk" and device.type != "cuda":
        return _CHUNK_CPU
    if impl in ("fla", "fla_chunk"):
        return _fla.fla_problem(device)
    if impl == "bi_triton":
        return _bi.bi_triton_problem(device)
    return None


def resolve_wkv_impl(impl: str, device: torch.device | str = "cpu") -> str:
    """The implementation `impl` means for tensors on `device`.

    "auto" gives "fla" on CUDA when fla-core imports, "chunked" otherwise. A name
    that is unknown, or that cannot run on `device`, raises a one-line ValueError
    saying what to choose or how to enable it. Asking for "fla" imports fla.
    """
    device = torch.device(device)
    if impl == "auto":
        return "fla" if device.type == "cuda" and _fla.fla_problem(device) is None else "chunked"
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown wkv implementation {impl!r}; choose one of {', '.join(WKV_IMPL_CHOICES)}")
    problem = _unusable(impl, device)
    if problem:
        raise ValueError(f"wkv implementation {impl!r} cannot run on {device.type}: {problem}")
    return impl


def available_implementations(device: torch.device | str = "cpu") -> list[str]:
    """The concrete implementations that can run on `device` in this process."""
    device = torch.device(device)
    return [name for name in IMPLEMENTATIONS if _unusable(name, device) is None]


def wkv(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor, impl: str = "auto") -> Tensor:
    """WKV as the model uses it: float32 even under autocast, float64 when given float64.

    `w` is the decay logit (per-step decay exp(-exp(w))); `u` is the bonus `[H, N]`.
    Returns `[B, T, C]` in float32 (float64 for float64 inputs; the fla kernels still
    compute in float32). `impl` is a name from WKV_IMPL_CHOICES, resolved for r's device.
    """
    name = resolve_wkv_impl(impl, r.device)
    fn = IMPLEMENTATIONS[name]
    dtype = torch.float64 if r.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=r.device.type, enabled=False):
        if name in _OWN_DTYPES:
            return fn(r, k, v, w, u)
        return fn(*(t.to(dtype) for t in (r, k, v, w, u)))


def _converted(n: int, itemsize: int) -> int:
    """Bytes of converting n elements between `itemsize` and float32 (0 when float32 already)."""
    return 0 if itemsize == 4 else (itemsize + 4) * n


def wkv_traffic_bytes(
    impl: str,
    batch: int,
    time: int,
    heads: int,
    size: int,
    dtype: torch.dtype = torch.bfloat16,
    w_dtype: torch.dtype | None = None,
) -> dict[str, int]:
    """Bytes one forward plus backward of `wkv(..., impl=impl)` loads and stores in device memory.

    Counted from the launch shapes, by part: keys start with "forward/" or "backward/",
    and the values add up to the total. r, k, v and u arrive in `dtype`, w in `w_dtype`
    (default `dtype`; the image tower's w is float32 under bf16 autocast, the text
    tower's bf16). Every kernel pass counts what it reads and writes in full (an upper
    bound on DRAM traffic: nothing is assumed to stay in L2). Counted for "fla" and
    "bi_triton".
    """
    itemsize = torch.empty(0, dtype=dtype).element_size()
    w_itemsize = torch.empty(0, dtype=w_dtype or dtype).element_size()
    if impl == "bi_triton":
        return _bi.traffic_bytes(batch, time, heads, size, itemsize, w_itemsize)
    if impl != "fla":
        raise ValueError(f"wkv traffic is counted for 'fla' and 'bi_triton', not {impl!r}")
    n = batch * time * heads * size
    e = 4 * n  # one float32 [B, T, C] tensor
    converted = 3 * _converted(n, itemsize) + _converted(n, w_itemsize) + _converted(heads * size, itemsize)
    return {
        "forward/float32 copies of r k v w u": converted,
        "forward/log-decay -exp(clamp(w)), three element-wise ops": 3 * 2 * e,
        **_fla.traffic_bytes(batch, time, heads, size),
        # neg: grad in, out; exp: grad and result in, out; clamp: w and grad in, out
        "backward/log-decay backward": 2 * e + 3 * e + 3 * e,
        "backward/gradients of r k v w u back to their dtypes": converted,
    }
