"""Runs the bi_triton WKV under Triton's interpreter and prints what it measured as JSON.

    TRITON_INTERPRET=1 python -m tests._wkv_bi_triton_cases

Like tests/_wkv_fla_cases.py (whose checks it reuses), this runs in a process started
with the variable set; tests/open_alip/test_wkv_bi_triton.py starts it once and checks
the numbers. The kernels work in blocks of 16 tokens, so the cases cover sequences the blocks
divide and do not (1 row in the last block at T = 17, 33, 49, 77), one block (T <= 16), and
head sizes the 16-channel chunks cover exactly (80, 64, 48, 16: 5, 4, 3 and 1 chunks) and not
(40: the third chunk's last 8 lanes masked). The interpreter's cost grows with the
programs (B x H x T / 16) and the blocks each one walks, hence one batch element and head for
the long sequences.
"""

from __future__ import annotations

import json
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from src.open_alip.wkv import available_implementations, resolve_wkv_impl, wkv
from tests._mix_cases import block_outputs, live_tiny
from tests._wkv_fla_cases import check_case, make_inputs

F64, F32, BF16 = torch.float64, torch.float32, torch.bfloat16

# name -> (batch, time, heads, head size), dtypes of r, k, v, w, u. float64 inputs are
# computed in float32 (as fla's are); the bf16 cases hand the kernels bf16 directly:
# r, k, v from bf16 linears with the image tower's float32 w and u, and the text
# tower's all-bf16 inputs.
CASES: dict[str, tuple[tuple[int, int, int, int], tuple[torch.dtype, ...]]] = {
    "image_T49_N80": ((1, 49, 1, 80), (F64,) * 5),
    "T50_N64": ((1, 50, 1, 64), (F64,) * 5),
    "text_T77_N64": ((1, 77, 1, 64), (F64,) * 5),
    "b16_T196_N64": ((1, 196, 1, 64), (F64,) * 5),
    "odd_T13_B2_H2_N80": ((2, 13, 2, 80), (F64,) * 5),
    "T1_N16": ((1, 1, 1, 16), (F64,) * 5),
    "T2_N16": ((1, 2, 1, 16), (F64,) * 5),
    "T17_N40_masked_channels": ((1, 17, 1, 40), (F64,) * 5),
    "T33_B2_N48": ((2, 33, 1, 48), (F64,) * 5),
    "image_T49_N80_bf16_w_f32": ((1, 49, 1, 80), (BF16, BF16, BF16, F32, F32)),
    "text_T77_N64_bf16": ((1, 77, 1, 64), (BF16,) * 5),
}


def check_autocast() -> dict:
    """Under bf16 autocast: float32 out, and bf16 inputs give what their float32 copies give."""
    inputs = [t.bfloat16() for t in make_inputs(1, 6, 2, 16, seed=3)]
    with torch.autocast("cpu", dtype=BF16):
        y = wkv(*inputs, impl="bi_triton")
    plain = wkv(*(t.float() for t in inputs), impl="bi_triton")
    return {"dtype": str(y.dtype), "max_abs_diff": (y - plain).abs().max().item()}


def check_repeatable() -> dict:
    """Two runs on the same bf16 inputs: outputs and gradients bit for bit (no atomics, sums
    over blocks and batch in a fixed order). Two sequences of three blocks (the last holding one row),
    so both of du's sums run; one head of 48 channels keeps it light under the interpreter."""
    inputs = [t.to(d) for t, d in zip(make_inputs(2, 33, 1, 48, seed=5), (BF16, BF16, BF16, F32, F32))]
    weight = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(6))

    def run() -> list[torch.Tensor]:
        leaves = [t.clone().requires_grad_() for t in inputs]
        y = wkv(*leaves, impl="bi_triton")
        (y * weight).sum().backward()
        return [y.detach()] + [t.grad for t in leaves]

    first, second = run(), run()
    return {"identical": all(torch.equal(a, b) for a, b in zip(first, second)), "tensors": len(first)}


def check_fake() -> dict:
    """Shapes and dtypes on FakeTensors (as the cost model runs the model), no kernel launched."""
    with FakeTensorMode():
        leaves = [
            t.to(dtype).requires_grad_()
            for t, dtype in zip(make_inputs(2, 7, 2, 80, seed=4), (BF16,) * 4 + (F32,))
        ]
        y = wkv(*leaves, impl="bi_triton")
        y.sum().backward()
        return {
            "y": [list(y.shape), str(y.dtype)],
            "grads": [[list(t.grad.shape), str(t.grad.dtype)] for t in leaves],
        }


def check_compile() -> dict:
    """One image block (its time mix with the WKV on bi_triton, and its channel mix) under bf16
    autocast, compiled with aot_eager in one graph, against the same block eager and eager on
    "chunked": output, input gradient and every parameter gradient. (One block, not the model:
    the same op in the same graph, for a fifth of the tracing.)"""
    block = (
        live_tiny(n_layer=1, image_depth=1, ctx_len=8, input_size=16, image_num_heads=1, head_size=64)
        .image_model.layers[0]
        .train()
    )
    x = torch.randn(2, 4, block.ln1.normalized_shape[0], generator=torch.Generator().manual_seed(1))

    def step(impl: str, compiled: bool) -> list[torch.Tensor]:
        for module in block.modules():
            if hasattr(module, "wkv_impl"):
                module.wkv_impl = impl
        return block_outputs(block, x, compiled, autocast=BF16)

    compiled = step("bi_triton", compiled=True)
    eager = step("bi_triton", compiled=False)
    chunked = step("chunked", compiled=False)

    def largest(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return max(((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item() for x, y in zip(a, b))

    return {
        "tensors": len(compiled),
        "finite": all(bool(torch.isfinite(t).all()) for t in compiled),
        "compiled_vs_eager": max((a - b).abs().max().item() for a, b in zip(compiled, eager)),
        "grads_vs_chunked": largest(compiled[1:], chunked[1:]),
        "out_vs_chunked": largest(compiled[:1], chunked[:1]),
    }


def check_names() -> dict:
    return {
        "available_cpu": available_implementations("cpu"),
        "auto_cpu": resolve_wkv_impl("auto", "cpu"),
        "auto_cuda": resolve_wkv_impl("auto", "cuda"),
        "bi_triton_cpu": resolve_wkv_impl("bi_triton", "cpu"),
    }


def main() -> int:
    torch.set_num_threads(1)
    report = {"names": check_names()}
    report["cases"] = {
        name: check_case(shape, seed=i, impl="bi_triton", dtypes=dtypes)
        for i, (name, (shape, dtypes)) in enumerate(CASES.items())
    }
    report["input_dtypes"] = {name: [str(d) for d in dtypes] for name, (_, dtypes) in CASES.items()}
    report["autocast"] = check_autocast()
    report["repeatable"] = check_repeatable()
    report["fake"] = check_fake()
    report["compile"] = check_compile()
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
