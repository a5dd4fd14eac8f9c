"""Runs the fused token-shift mixes under Triton's interpreter and prints what it measured as JSON.

    TRITON_INTERPRET=1 python -m tests._mix_cases

tests/open_alip/test_mix.py starts it once (like tests/_wkv_bi_triton_cases.py) and checks
the numbers case by case.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from src.open_alip import create_model
from src.open_alip.mix import fused_mixes

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16

# name -> (batch, time, channels, mixes, with m). Rows (batch x time) and channels that
# the 32-row x 64-channel blocks do not divide, one row program and several (over 256 rows).
CASES: dict[str, tuple[int, int, int, int, bool]] = {
    "time_mix_xxx_K1": (2, 7, 80, 1, False),
    "time_mix_five_K5_lora": (2, 49, 96, 5, True),
    "channel_mix_K2": (3, 77, 64, 2, False),
    "rows_over_one_program_K2": (2, 150, 16, 2, True),
    "one_row_one_channel": (1, 1, 1, 2, True),
}


def _inputs(batch: int, time: int, channels: int, mixes: int, with_m: bool, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(batch, time, channels, generator=g, dtype=F64) for _ in range(2))
    coefs = [torch.rand(1, 1, channels, generator=g, dtype=F64) for _ in range(mixes)]
    m = [0.1 * torch.randn(mixes, batch, time, channels, generator=g, dtype=F64)] if with_m else []
    return [a, b, *coefs, *m]


def _reference(a, b, *rest, mixes: int):
    coefs, m = rest[:mixes], (rest[mixes] if len(rest) > mixes else None)
    return [a + (b - a) * (c + (m[j] if m is not None else 0)) for j, c in enumerate(coefs)]


def _grads(fn, leaves: list[torch.Tensor], weights: list[torch.Tensor]) -> tuple[list, list]:
    outs = fn(*leaves)
    sum((o.double() * w).sum() for o, w in zip(outs, weights)).backward()
    return [o.detach() for o in outs], [t.grad for t in leaves]


def _error(got: torch.Tensor, want: torch.Tensor) -> dict:
    return {
        "max_abs_err": float((got.double() - want).abs().max()),
        "max_abs_ref": float(want.abs().max()),
        "dtype": str(got.dtype),
    }


def check_case(shape: tuple[int, int, int, int, bool], seed: int) -> dict:
    """float32 a, b, coef and (bf16, as the LoRA matmul gives it) m against float64 on the
    same values; the bf16 output case under autocast against the float32 output rounded."""
    batch, time, channels, mixes, with_m = shape
    exact = _inputs(batch, time, channels, mixes, with_m, seed)
    # Inputs as the kernels get them, and the reference on exactly those values.
    given = [t.float() for t in exact]
    if with_m:
        given[-1] = given[-1].to(BF16)
    g = torch.Generator().manual_seed(seed + 100)
    weights = [torch.randn(batch, time, channels, generator=g, dtype=F64) for _ in range(mixes)]

    def fused(a, b, *rest):
        return fused_mixes(a, b, list(rest[:mixes]), rest[mixes] if with_m else None)

    ref_out, ref_grads = _grads(
        lambda *t: _reference(*t, mixes=mixes), [t.double().requires_grad_() for t in given], weights
    )
    out, grads = _grads(fused, [t.clone().requires_grad_() for t in given], weights)
    result = {f"out{j}": _error(o, r) for j, (o, r) in enumerate(zip(out, ref_out))}
    names = ["a", "b", *(f"coef{j}" for j in range(mixes)), *(["m"] if with_m else [])]
    result |= {f"d{n}": _error(gr, rg) for n, gr, rg in zip(names, grads, ref_grads)}
    result["grad_shapes_match"] = all(gr.shape == t.shape for gr, t in zip(grads, given))
    # Under bf16 autocast the outputs come in bf16: the float32 results, rounded once.
    with torch.autocast("cpu", dtype=BF16):
        low = fused(*given)
    result["autocast"] = {
        "dtype": str(low[0].dtype),
        "max_abs_diff_from_rounded_f32": max(
            float((lo.float() - o.to(BF16).float()).abs().max()) for lo, o in zip(low, out)
        ),
    }
    # The coefficients' gradients are summed in a fixed order: the same bits on every run.
    _, again = _grads(fused, [t.clone().requires_grad_() for t in given], weights)
    result["same_bits_twice"] = all(torch.equal(x, y) for x, y in zip(grads, again))
    return result


def live_tiny(**overrides) -> torch.nn.Module:
    """The tiny model with its zero-initialised projections drawn at random: a freshly built
    model's output weights are zero, which would hide every gradient behind them."""
    torch.manual_seed(0)
    model = create_model("RWKV_CLIP_tiny", wkv_impl="chunked", **overrides)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2 and not p.any():
                p.normal_(0.0, 0.02)
    return model.eval()


def _model_grads(model: torch.nn.Module, images, tokens, autocast: bool) -> list[torch.Tensor]:
    """Gradients of a fixed random projection of both towers' outputs."""
    model.zero_grad()
    with torch.autocast("cpu", dtype=BF16, enabled=autocast):
        image, text = model.encode_image(images), model.encode_text(tokens)
    g = torch.Generator().manual_seed(7)
    loss = (image.double() * torch.randn(image.shape, generator=g, dtype=F64)).sum()
    loss = loss + (text.double() * torch.randn(text.shape, generator=g, dtype=F64)).sum()
    loss.backward()
    return [image.detach().double(), text.detach().double()] + [
        p.grad.double() for p in model.parameters() if p.grad is not None
    ]


def check_model() -> dict:
    """The tiny model with fused mixes against its eager mixes: float32 (same values up to
    float32 rounding order) and bf16 autocast (each against the float64 model)."""
    base = live_tiny()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    tokens = torch.randint(1, 1000, (2, 77), generator=torch.Generator().manual_seed(2))
    fused = copy.deepcopy(base)
    fused.set_mix_impl("triton")
    eager32 = _model_grads(copy.deepcopy(base), images, tokens, autocast=False)
    fused32 = _model_grads(fused, images, tokens, autocast=False)
    exact = _model_grads(copy.deepcopy(base).double(), images.double(), tokens, autocast=False)
    eager16 = _model_grads(copy.deepcopy(base), images, tokens, autocast=True)
    fused16 = _model_grads(fused, images, tokens, autocast=True)

    def relative(a: list[torch.Tensor], b: list[torch.Tensor]) -> list[float]:
        return [float((x - y).norm() / y.norm()) for x, y in zip(a, b) if y.norm() > 0]

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    return {
        "tensors": len(eager32),
        "float32_fused_vs_eager_max": max(relative(fused32, eager32)),
        "bf16_eager_vs_float64": {
            "median": median(relative(eager16, exact)),
            "max": max(relative(eager16, exact)),
        },
        "bf16_fused_vs_float64": {
            "median": median(relative(fused16, exact)),
            "max": max(relative(fused16, exact)),
        },
    }


def block_outputs(
    block: torch.nn.Module, x: torch.Tensor, compiled: bool, autocast: torch.dtype | None = None
) -> list[torch.Tensor]:
    """A copy of the image `block` run on x (a 2 x 2 patch grid), eagerly or compiled with aot_eager
    in one graph, under autocast to `autocast` if given: its output (in float32), the input's
    gradient and every parameter gradient, from a fixed function of the output."""
    model = copy.deepcopy(block)
    forward = torch.compile(model, backend="aot_eager", fullgraph=True) if compiled else model
    leaf = x.clone().requires_grad_()
    with torch.autocast("cpu", dtype=autocast) if autocast is not None else contextlib.nullcontext():
        out = forward(leaf, (2, 2)).float()
    (out * torch.cos(out)).sum().backward()
    return [out.detach(), leaf.grad] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


def check_compile() -> dict:
    """One image block (its time mix's two mix sites and its channel mix) with fused mixes, float32,
    compiled with aot_eager in one graph (each op stays one opaque node), against the same block eager:
    output and every gradient. (In bf16, aot_eager's decompositions of the other ops round differently.)"""
    block = live_tiny(
        n_layer=1, image_depth=1, input_size=16, image_num_heads=1, head_size=64
    ).image_model.layers[0]
    for module in block.modules():
        if hasattr(module, "mix_impl"):
            module.mix_impl = "triton"
    x = torch.randn(2, 4, block.ln1.normalized_shape[0], generator=torch.Generator().manual_seed(1))
    compiled, eager = block_outputs(block, x, compiled=True), block_outputs(block, x, compiled=False)
    return {
        "tensors": len(compiled),
        "finite": all(bool(torch.isfinite(t).all()) for t in compiled),
        "compiled_vs_eager": max(float((a - b).abs().max()) for a, b in zip(compiled, eager)),
    }


def check_fake() -> dict:
    """FakeTensors (the traffic count and the cost model) get shapes and dtypes, no kernel."""
    with FakeTensorMode():
        a, b = torch.empty(2, 7, 80), torch.empty(2, 7, 80)
        coefs = [torch.empty(1, 1, 80, requires_grad=True) for _ in range(5)]
        m = torch.empty(5, 2, 7, 80, dtype=BF16, requires_grad=True)
        a.requires_grad_()
        with torch.autocast("cpu", dtype=BF16):
            outs = fused_mixes(a, b, coefs, m)
        sum(o.float().sum() for o in outs).backward()
        return {
            "outs": [[list(o.shape), str(o.dtype)] for o in outs],
            "grads": [[list(t.grad.shape), str(t.grad.dtype)] for t in (a, *coefs, m)],
        }


def main() -> int:
    torch.set_num_threads(1)
    report = {"cases": {name: check_case(shape, seed=i) for i, (name, shape) in enumerate(CASES.items())}}
    report["model"] = check_model()
    report["compile"] = check_compile()
    report["fake"] = check_fake()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
