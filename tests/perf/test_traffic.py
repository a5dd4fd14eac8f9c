"""The memory-traffic count (src/perf/traffic.py) and its CLI (benchmarks/step_traffic.py).

Hand-checkable ops are held to their exact byte counts; a whole training step of the
tiny model is checked per class, and the WKV is checked to come from the analytic
launch-shape count for the opaque kernels (fla, bi_triton) and from dispatch otherwise.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from benchmarks import step_traffic as cli
from src.open_alip import get_model_config
from src.open_alip.wkv import wkv_traffic_bytes
from src.perf.step_trace import autocast, autocast_rules, fake_mode
from src.perf.traffic import (
    CLASSES,
    TrafficCounter,
    TrafficError,
    TrafficReport,
    count_traffic,
    tensor_bytes,
)

# Few tokens (4 image patches, 12 text tokens): seconds per step count.
SMALL = get_model_config("RWKV_CLIP_tiny", ctx_len=12, input_size=16)


def _count(fn, *shapes: tuple[int, ...], precision: str = "fp32") -> TrafficReport:
    """The traffic of `fn` on FakeTensors of these shapes (made outside the count)."""
    report = TrafficReport("ops", 1, precision, "fla")
    with fake_mode():
        inputs = [torch.randn(*shape) for shape in shapes]
        with (
            TrafficCounter(report, skip_wkv_ops=True),
            autocast_rules(precision, "cuda"),
            autocast(precision),
        ):
            fn(*inputs)
    return report


def test_a_broadcast_multiply_reads_both_inputs_once_and_writes_its_result():
    report = _count(lambda x, y: x * y, (4, 8), (8,))
    assert dict(report.by_op) == {("elementwise", "mul"): 4 * (32 + 8) + 4 * 32}
    # An in-place op writes its input instead of a new tensor; a view moves nothing.
    report = _count(lambda x: x.mul_(2.0).t(), (4, 8))
    assert dict(report.by_op) == {("elementwise", "mul_"): 4 * 32 + 4 * 32}


def test_a_linear_under_bf16_autocast_casts_both_operands_and_runs_one_matmul():
    report = _count(F.linear, (4, 8), (16, 8), precision="bf16")
    # casts: x and the weight read in float32, written in bf16
    assert report.by_class["cast"] == (4 * 8 + 16 * 8) * (4 + 2)
    # the matmul reads both bf16 operands and writes the bf16 [4, 16] result
    assert report.by_class["matmul"] == (4 * 8 + 16 * 8 + 4 * 16) * 2
    assert report.total == report.by_class["cast"] + report.by_class["matmul"]


def test_cuda_autocast_runs_pow_in_float32_and_a_product_in_bf16():
    report = _count(lambda x: torch.square(x.to(torch.bfloat16)), (4, 8), precision="bf16")
    # bf16 -> float32 widening for pow, then pow in float32
    assert report.by_op[("cast", "_to_copy")] == 32 * (4 + 2) + 32 * (2 + 4)
    assert report.by_op[("elementwise", "pow")] == 32 * 4 * 2
    report = _count(lambda x: (lambda b: b * b)(x.to(torch.bfloat16)), (4, 8), precision="bf16")
    assert report.by_op[("elementwise", "mul")] == 32 * 2 * 3


def test_tensor_bytes_counts_a_broadcast_dimension_once():
    assert tensor_bytes(torch.zeros(3, 1).expand(3, 5)) == 3 * 4
    assert tensor_bytes(torch.zeros(0, 5)) == 0


@pytest.mark.parametrize("impl", ["fla", "bi_triton"])
def test_a_training_step_counts_every_class_and_the_wkv_from_its_launch_shapes(impl):
    report = count_traffic(SMALL, batch=2, precision="bf16", wkv_impl=impl)
    assert all(report.by_class[c] > 0 for c in CLASSES), report.by_class
    layers = SMALL["image_depth"] + SMALL["n_layer"]
    assert len(report.wkv_calls) == layers
    assert {c.tower for c in report.wkv_calls} == {"image", "text"}
    analytic = sum(
        sum(wkv_traffic_bytes(impl, c.batch, c.time, c.heads, c.size, c.dtype, c.w_dtype).values())
        for c in report.wkv_calls
    )
    # Every WKV byte is the analytic count: the stand-in chunked WKV's own ops are left out.
    assert report.by_class["wkv"] == analytic
    assert report.by_line[("wkv", f"wkv {impl} kernels and their copies (analytic)")] == analytic
    image = next(c for c in report.wkv_calls if c.tower == "image")
    assert (image.batch, image.time) == (2, (16 // SMALL["image_patch_size"]) ** 2)
    # Forward ops are charged to the model's lines, not to torch's frames (a .venv inside the
    # repository holds torch, and its files once took the forward's bytes).
    sites = {site for _, site in report.by_line}
    assert not any("site-packages" in site or site.startswith(".venv") for site in sites), sorted(sites)
    assert any(site.startswith("src/open_alip/rwkv6.py:") and "backward" not in site for site in sites)


def test_the_chunked_wkv_is_counted_at_dispatch_and_the_rest_of_the_step_is_unchanged():
    fla = count_traffic(SMALL, batch=2, precision="bf16", wkv_impl="fla")
    chunked = count_traffic(SMALL, batch=2, precision="bf16", wkv_impl="chunked")
    assert chunked.by_class["wkv"] > 0
    assert ("wkv", "fla (analytic)") not in chunked.by_op
    for c in ("matmul", "elementwise", "cast", "copy", "optimizer"):
        assert chunked.by_class[c] == fla.by_class[c], c


def test_bad_inputs_name_the_fix():
    with pytest.raises(TrafficError, match="precision 'fp8'"):
        count_traffic(SMALL, batch=2, precision="fp8")
    with pytest.raises(TrafficError, match="--wkv-impl 'cuda'"):
        count_traffic(SMALL, batch=2, wkv_impl="cuda")
    with pytest.raises(TrafficError, match="batch 0"):
        count_traffic(SMALL, batch=0)


def test_the_cli_prints_classes_lines_and_times_and_compares_with_a_saved_baseline(tmp_path, capsys):
    saved, config = tmp_path / "before.json", tmp_path / "small.json"
    config.write_text(json.dumps(SMALL))
    args = ["--config", str(config), "--batch", "2", "--top", "3"]
    assert cli.main([*args, "--save", str(saved), "--label", "before"]) == 0
    out = capsys.readouterr().out
    assert "elementwise" in out and "at 4.3 TB/s" in out and "fla / bi_triton" in out
    data = json.loads(saved.read_text())
    assert data["label"] == "before" and data["bytes_per_pair"]["total"] > 0
    assert cli.main([*args, "--baseline", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "element-wise + cast + copy" in out and "1.00x lower" in out
    # A baseline counted for another batch is refused in one line.
    assert cli.main(["--config", str(config), "--batch", "3", "--baseline", str(saved)]) != 0
    err = capsys.readouterr().err
    assert err.startswith("benchmarks.step_traffic: error: --baseline") and err.count("\n") == 1
