"""The fused token-shift mixes (`mix_impl="triton"`): exact against float64, the same model
as the eager mixes, compilable, counted by the traffic benchmark, and refused where they
cannot run.

With no GPU here the kernels run under Triton's interpreter in one child process
(tests/_mix_cases.py), whose measurements are asserted here case by case.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from src.open_alip import create_model
from src.open_alip.mix import fused_mixes
from src.perf.traffic import count_traffic
from tests._mix_cases import CASES
from tests._repo import REPO
from tests._wkv_fla_cases import run_report

# float32 arithmetic whose intermediates (b - a, the coefficient sums over rows) can exceed the
# result: measured at most 2.4e-7 of the largest value for the outputs and da, db, 1.8e-6 for one
# output element next to cancellation and for the coefficients' sums over 150-600 rows.
F32 = 2.0**-18
BF16 = 2.0**-8  # one bf16 rounding


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_report("tests._mix_cases")


@pytest.mark.parametrize("case", list(CASES))
def test_outputs_and_every_gradient_match_float64(interpreted, case):
    result = interpreted["cases"][case]
    errors = {name: err for name, err in result.items() if isinstance(err, dict) and "max_abs_err" in err}
    assert {n for n in errors if n.startswith("out")} == {f"out{j}" for j in range(CASES[case][3])}
    for name, err in errors.items():
        # dm comes back in m's dtype, bf16 as the LoRA matmul gives it under autocast.
        tol = BF16 if name == "dm" else F32
        assert err["max_abs_err"] <= tol * err["max_abs_ref"], f"{case}: {name} {err}"
        assert err["dtype"] == ("torch.bfloat16" if name == "dm" else "torch.float32")
    assert result["grad_shapes_match"]


@pytest.mark.parametrize("case", list(CASES))
def test_under_autocast_the_outputs_are_the_float32_results_rounded_once(interpreted, case):
    # What the linears would get from autocast's own cast of the eager float32 mixes.
    assert interpreted["cases"][case]["autocast"] == {
        "dtype": "torch.bfloat16",
        "max_abs_diff_from_rounded_f32": 0.0,
    }


@pytest.mark.parametrize("case", list(CASES))
def test_coefficient_gradients_are_the_same_bits_on_every_run(interpreted, case):
    assert interpreted["cases"][case]["same_bits_twice"]


def test_the_model_with_fused_mixes_is_the_model_with_eager_ones(interpreted):
    # The tiny model's two embeddings and 124 parameter gradients: float32 up to rounding order,
    # and under bf16 autocast as far from the float64 model as the eager mixes are.
    result = interpreted["model"]
    assert result["tensors"] == 126
    assert result["float32_fused_vs_eager_max"] < 1e-5
    eager, fused = result["bf16_eager_vs_float64"], result["bf16_fused_vs_float64"]
    assert fused["median"] <= 1.02 * eager["median"] and fused["max"] <= 1.02 * eager["max"]
    assert eager["max"] < 0.05


def test_a_compiled_block_matches_eager(interpreted):
    # An image block (both time-mix sites and the channel mix), fullgraph=True with aot_eager:
    # output, input gradient and 30 parameter gradients identical.
    assert interpreted["compile"] == {"tensors": 32, "finite": True, "compiled_vs_eager": 0.0}


def test_fake_tensors_get_shapes_and_dtypes_without_a_kernel(interpreted):
    assert interpreted["fake"] == {
        "outs": [[[2, 7, 80], "torch.bfloat16"]] * 5,
        "grads": [[[2, 7, 80], "torch.float32"]]
        + [[[1, 1, 80], "torch.float32"]] * 5
        + [[[5, 2, 7, 80], "torch.bfloat16"]],
    }


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") == "1", reason="checks the refusal without the interpreter"
)
def test_cpu_without_the_interpreter_is_refused_with_the_fix():
    a = torch.zeros(1, 2, 4)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        fused_mixes(a, a, [torch.zeros(4)])
    model = create_model("RWKV_CLIP_tiny")
    with pytest.raises(ValueError, match="unknown mix implementation 'fast'; choose one of torch, triton"):
        model.set_mix_impl("fast")
    proc = subprocess.run(
        [sys.executable, "train.py", "--config", "RWKV_CLIP_tiny", "--train-data", "nowhere",
         "--output", "out", "--device", "cpu", "--mix-impl", "triton"],
        cwd=REPO, capture_output=True, text=True,
        env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"},
    )  # fmt: skip
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "--mix-impl triton: it runs on CUDA tensors" in proc.stderr and "--mix-impl torch" in proc.stderr


def test_traffic_counts_each_mix_site_as_one_op_at_the_model_line():
    eager = count_traffic("RWKV_CLIP_tiny", batch=4, wkv_impl="bi_triton")
    fused = count_traffic("RWKV_CLIP_tiny", batch=4, wkv_impl="bi_triton", mix_impl="triton")
    fusible = ("elementwise", "cast", "copy")
    # B/32 at batch 512: 2.5x less (benchmarks/step_traffic.py); the tiny model, measured: 1.49x.
    assert fused.per_pair(*fusible) < 0.75 * eager.per_pair(*fusible)
    assert fused.per_pair("matmul", "wkv") == eager.per_pair("matmul", "wkv")
    ops = {op for _, op in fused.by_op}
    assert {"token_mix", "token_mix_backward"} <= ops and "token_mix" not in {op for _, op in eager.by_op}
    # Charged to the model's lines that ask for the mixes, forward and backward, not to mix.py.
    sites = {site for _, site in fused.by_line}
    assert not [site for site in sites if site.startswith("src/open_alip/mix.py")]
    assert fused.as_json()["mix_impl"] == "triton"


def test_kernels_compile_for_sm90_without_spilling():
    # The GPU lowering (and its native bf16 rounding, which the interpreter replaces), at the
    # launch configuration mix.py uses, for the time mix's five mixes and a channel mix's two.
    report = run_report("tests._mix_compile", interpret=False, timeout=600)
    assert set(report) == {"forward_K5", "backward_K5", "forward_K2", "backward_K2"}
    for kernel, usage in report.items():
        assert usage["spill_bytes"] == 0, (kernel, usage)
        # Under 168 registers a thread leaves room for three programs of 4 warps per SM.
        assert usage["registers"] < 168, (kernel, usage)


def test_shapes_the_kernels_cannot_address_are_refused_before_any_launch():
    # Checked before the device: the message is the same on a GPU. Shapes only (meta tensors).
    a = torch.empty(1, 2**29, 4, device="meta")
    with pytest.raises(ValueError, match="exceed the kernels' 2\\^31 elements"):
        fused_mixes(a, a, [torch.empty(4, device="meta")] * 2)
    small = torch.empty(1, 2, 4, device="meta")
    with pytest.raises(ValueError, match="the kernels take 1 to 5"):
        fused_mixes(small, small, [torch.empty(4, device="meta")] * 6)
