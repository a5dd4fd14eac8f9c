"""benchmarks/gpu.py's WKV section: each implementation alone at the training shapes, float32
and bf16 inputs, forward+backward time and the largest difference from `chunked`."""

from __future__ import annotations

import time
from typing import Any

import torch

from benchmarks.gpu_report import Budget, Results, first_line
from benchmarks.gpu_train import free_memory, gb, is_oom, sync

# name: (batch, tokens, heads, head size) as B/32 training at 512 per GPU runs them
TRAINING_SHAPES = {"image": (512, 49, 8, 80), "text": (512, 77, 10, 64)}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BASELINE = "chunked"
TIMED_IMPLS = ("fla", "bi_triton")  # beside the baseline; reference and fla_chunk on request


def wkv_inputs(batch: int, tokens: int, heads: int, size: int, dtype: torch.dtype, device: torch.device):
    """r, k, v, w, u as the model hands them to `wkv` (w: the released models' decay logits)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    shape = (batch, tokens, heads * size)
    r, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    w = torch.rand(shape, generator=g) * 6 - 6
    u = torch.randn(heads, size, generator=g)
    return [t.to(device, dtype).requires_grad_() for t in (r, k, v, w, u)]


def _pass(impl: str, inputs: list[torch.Tensor], grad: torch.Tensor) -> list[torch.Tensor]:
    from src.open_alip.wkv import wkv

    for t in inputs:
        t.grad = None
    y = wkv(*inputs, impl=impl)
    y.backward(grad)
    return [y.detach()] + [t.grad.detach() for t in inputs]


def section_wkv(
    results: Results,
    budget: Budget,
    device: torch.device,
    impls: list[str],
    shapes: dict[str, tuple[int, int, int, int]] = TRAINING_SHAPES,
    repeats: int = 5,
) -> None:
    from benchmarks.wkv import largest_difference
    from src.open_alip.wkv import resolve_wkv_impl

    runnable, unusable = [], {}
    for impl in [BASELINE, *[i for i in impls if i != BASELINE]]:
        try:
            runnable.append(resolve_wkv_impl(impl, device))
        except ValueError as exc:
            unusable[impl] = first_line(exc)
    results.set("wkv", implementations=runnable, unusable=unusable)
    for shape_name, (batch, tokens, heads, size) in shapes.items():
        for dtype_name, dtype in DTYPES.items():
            baseline = None
            for impl in runnable:
                case: dict[str, Any] = {
                    "shape": shape_name,
                    "batch": batch,
                    "tokens": tokens,
                    "heads": heads,
                    "head_size": size,
                    "inputs": dtype_name,
                    "impl": impl,
                }
                if not budget.allows(3.0):
                    case["error"] = "skipped: section time budget spent"
                    results.add_case("wkv", case)
                    continue
                inputs = grad = outs = None
                try:
                    free_memory()
                    inputs = wkv_inputs(batch, tokens, heads, size, dtype, device)
                    # A fixed, non-uniform output gradient exercises every path of the backward.
                    grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(1)).to(device)
                    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
                    t0 = time.perf_counter()
                    _pass(impl, inputs, grad)  # compiles and autotunes Triton kernels
                    sync(device)
                    case["first_call_s"] = round(time.perf_counter() - t0, 3)
                    if device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats(device)
                    times = []
                    for _ in range(repeats):
                        t0 = time.perf_counter()
                        outs = _pass(impl, inputs, grad)
                        sync(device)
                        times.append(time.perf_counter() - t0)
                    case["ms"] = round(1e3 * sorted(times)[len(times) // 2], 3)
                    if device.type == "cuda":
                        case["peak_gb"] = gb(torch.cuda.max_memory_allocated(device) - base)
                    if impl == BASELINE:
                        baseline = outs
                    elif baseline is not None:
                        diff, where = largest_difference(outs, baseline)
                        case["max_rel_diff_vs_chunked"] = diff
                        case["largest_in"] = where
                except Exception as exc:
                    case["error"] = "OOM" if is_oom(exc) else f"{type(exc).__name__}: {first_line(exc)}"
                finally:
                    inputs = grad = outs = None
                results.add_case("wkv", case)
                print(f"[wkv] {case}", flush=True)
    results.set(
        "wkv",
        note="ms: median forward+backward; max_rel_diff: the largest max|impl - chunked| / "
        "max|chunked| over the output and the five gradients (largest_in names which), "
        "chunked given the same inputs",
    )
