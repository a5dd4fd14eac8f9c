"""The forward-only WKV (wkv_inference.py): the pair formula's numbers, in memory linear in tokens.

`wkv_chunked` answers with it whenever no gradient is wanted; these tests call it directly and
through that dispatch, against the float64 pair formula and the autograd form."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from src.open_alip import wkv_inference
from src.open_alip.wkv import wkv, wkv_chunked, wkv_chunked_autograd
from src.open_alip.wkv_inference import wkv_chunked_inference
from tests._model_reference import naive_wkv


def _inputs(batch, time, heads, size, dtype=torch.float64, seed=0, decay=(-3.0, 1.0)):
    g = torch.Generator().manual_seed(seed)
    channels = heads * size
    r, k, v = (torch.randn(batch, time, channels, generator=g, dtype=dtype) for _ in range(3))
    lo, hi = decay
    w = torch.rand(batch, time, channels, generator=g, dtype=dtype) * (hi - lo) + lo
    u = torch.randn(heads, size, generator=g, dtype=dtype)
    return r, k, v, w, u


@pytest.mark.parametrize("time", [1, 2, 3, 13, 49, 70])
@pytest.mark.parametrize("chunk", [None, 1, 2, 5, 16])
def test_matches_the_pair_formula_in_float64(time, chunk):
    inputs = _inputs(2, time, 2, 4, seed=time)
    torch.testing.assert_close(
        wkv_chunked_inference(*inputs, chunk=chunk), naive_wkv(*inputs), rtol=0, atol=1e-12
    )


@pytest.mark.parametrize("decay", [(-60.0, -20.0), (5.0, 40.0), (-40.0, 40.0), (0.5, 3.0)])
def test_any_decay_logit_gives_the_pair_formula(decay):
    # Strong decays put chunks out of the factored form's bounds: they shorten the chunks and
    # the rest take the exact element-wise scores.
    inputs = _inputs(1, 37, 2, 4, seed=5, decay=decay)
    torch.testing.assert_close(wkv_chunked_inference(*inputs), naive_wkv(*inputs), rtol=0, atol=1e-11)
    torch.testing.assert_close(
        wkv_chunked_inference(*inputs, chunk=16), naive_wkv(*inputs), rtol=0, atol=1e-11
    )


def test_out_of_bounds_chunks_take_the_exact_scores(monkeypatch):
    r, k, v, w, u = _inputs(1, 48, 2, 4, seed=3, decay=(-6.0, -1.0))
    w[:, 20:26] = 3.0  # log-decay -20 over six steps of one chunk: its inner sum is below -2 * EXP_CAP
    calls = []
    exact = wkv_inference._exact_scores

    def spy(r, k, logd, lower):
        calls.append(r.shape[0])
        return exact(r, k, logd, lower)

    monkeypatch.setattr(wkv_inference, "_exact_scores", spy)
    torch.testing.assert_close(
        wkv_chunked_inference(r, k, v, w, u, chunk=16), naive_wkv(r, k, v, w, u), rtol=0, atol=1e-11
    )
    assert calls == [2]  # the one chunk with those steps, in each of the two heads


def test_chunks_are_long_for_moderate_decays_and_shorten_for_strong_ones():
    def length(decay, time):
        logd = -torch.exp(_inputs(2, time, 8, 80, dtype=torch.float32, decay=decay)[3])
        return wkv_inference._choose_length(logd.reshape(2, time, 8, 80).transpose(1, 2), time, None)

    assert length((-6.0, 0.0), 49) == 49  # B/32 at 224 px: one chunk, no boundary work
    assert length((-6.0, 0.0), 196) == 49  # 4 x 49
    assert length((-6.0, 0.0), 1024) == wkv_inference.MAX_CHUNK
    assert wkv_inference.MIN_CHUNK <= length((0.5, 3.0), 196) < 49


@pytest.mark.parametrize("time", [49, 196])
def test_float32_equals_the_autograd_form_at_model_shapes(time):
    # B/32's image tower: 8 heads of 80 channels; 196 tokens are four chunks with boundary states.
    inputs = _inputs(2, time, 8, 80, dtype=torch.float32, seed=time, decay=(-6.0, 1.0))
    want = wkv_chunked_autograd(*(t.double() for t in inputs))
    got = wkv_chunked_inference(*inputs)
    scale = want.abs().max()
    assert (got.double() - want).abs().max() <= 2e-6 * scale  # float32 rounding: about 5e-7 seen
    old = wkv_chunked_autograd(*inputs)
    assert (got - old).abs().max() <= 1e-5 * scale.float()


def test_wkv_chunked_takes_the_inference_form_only_without_gradients(monkeypatch):
    from src.open_alip import wkv as wkv_module

    seen = []
    monkeypatch.setattr(
        wkv_module,
        "wkv_chunked_inference",
        lambda *a, **k: seen.append("inference") or wkv_chunked_inference(*a, **k),
    )
    inputs = _inputs(1, 10, 2, 4)
    wkv_chunked(*inputs)  # nothing requires grad
    with torch.no_grad():
        wkv(*[t.clone().requires_grad_() for t in inputs])
    assert seen == ["inference", "inference"]
    leaves = [t.clone().requires_grad_() for t in inputs]
    wkv(*leaves).sum().backward()  # the autograd form, gradients and all
    assert seen == ["inference", "inference"] and all(t.grad is not None for t in leaves[:3])


class _Recorder(TorchDispatchMode):
    """Every op's name and the element count of its largest output."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [
            t.numel()
            for t in (out if isinstance(out, (tuple, list)) else [out])
            if isinstance(t, torch.Tensor)
        ]
        self.ops.append((str(func.overloadpacket.__name__), max(sizes, default=0)))
        return out


def _record(time: int) -> list[tuple[str, int]]:
    inputs = _inputs(1, time, 1, 8, dtype=torch.float32, seed=1, decay=(-6.0, 0.0))
    with torch.no_grad(), _Recorder() as rec:
        wkv_chunked(*inputs)
    return rec.ops


def test_intermediates_grow_linearly_in_tokens_and_nothing_is_flipped():
    small, large = _record(256), _record(1024)
    # At T=1024 an [L, L, N] tensor per chunk would hold 1024 * 64 * 8 values, a T x T one 1M.
    assert max(n for _, n in large) <= 4 * max(n for _, n in small)
    assert max(n for _, n in large) <= 1024 * wkv_inference.MAX_CHUNK  # never T x T
    assert not {name for name, _ in small + large} & {"flip", "cat"}
