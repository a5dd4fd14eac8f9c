"""benchmarks/gpu.py's training sections: the real training step (src.training.loop.Trainer,
built by src.training.main.build_training_step as train.py builds it, its WKV kernels tuned at
the micro-batch as train.py tunes them) timed on generated batches; the planner's predicted
peak beside the measured one; a profile of one step.

Every function here also runs on the CPU (the tests' tiny configuration); only the memory
counters need CUDA.
"""

from __future__ import annotations

import gc
import re
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.gpu_report import Budget, Check, Results, first_line

MODELS = {"B32": "RWKV_CLIP_B32", "B16": "RWKV_CLIP_B16", "tiny": "RWKV_CLIP_tiny"}
TRAIN_SECTIONS = ("train_compiled", "train_eager", "train_fused", "train_fused_compiled", "b16")


@dataclass
class Kept:
    """A Trainer kept after its timing, for the profile of one more step."""

    step: Any = None  # a callable running one more optimizer step
    label: str = ""

    def drop(self) -> None:
        if self.step is not None:
            self.step, self.label = None, ""
            torch._dynamo.reset()  # compiled graphs hold the model they were traced from
        free_memory()


def gb(n: float) -> float:
    return round(n / 1e9, 3)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def train_config(
    model: str,
    batch: int,
    wkv_impl: str,
    compile: bool,
    device: torch.device,
    backend: str = "inductor",
    precision: str = "bf16",
    output: str = "",
    mix_impl: str = "torch",
):
    """The TrainConfig train.py would build from these flags (nothing is read or written)."""
    from src.training.config import build_config

    given = {
        "config": MODELS[model],
        "batch_size": batch,
        "wkv_impl": wkv_impl,
        "mix_impl": mix_impl,
        "compile": compile,
        "compile_backend": backend,
        "precision": precision,
        "device": str(device),
        "train_data": ["(generated batches)"],
        "output": output or tempfile.gettempdir(),
    }
    return build_config(given, {})


def generated_batch(batch: int, size: int, ctx_len: int, device: torch.device):
    """A batch as the loader delivers it: float32 images, int64 captions of ~20 tokens."""
    g = torch.Generator(device="cpu").manual_seed(0)
    images = torch.randn(batch, 3, size, size, generator=g)
    tokens = torch.zeros(batch, ctx_len, dtype=torch.long)
    tokens[:, 0], tokens[:, 1:21], tokens[:, 21] = (
        49406,
        torch.randint(1, 49406, (batch, 20), generator=g),
        49407,
    )
    return images.to(device), tokens.to(device)


def section_train(
    check: Check,
    results: Results,
    budget: Budget,
    *,
    section: str,
    compile: bool,
    fused: bool = False,
    model: str | None = None,
    profile: bool = False,
) -> None:
    """One training case of the check: B/32 (or `model`) at --batch, bf16, --wkv-impl (default
    auto, as the recipes) with eager token-shift mixes, or `fused`: our own kernels (bi_triton,
    --mix-impl triton); `compile`: inductor, as the recipes. `profile`: then one more step under
    torch.profiler, its kernels in the section's "profile" table."""
    args, cpu = check.args, check.cpu_test
    wkv, mixes = ("bi_triton", "triton") if fused else (args.wkv_impl, "torch")
    case = {
        "model": model or ("tiny" if cpu else "B32"),
        "batch": 8 if cpu else args.batch,
        "wkv": wkv,
        "mixes": mixes,
        "compile": compile,
        "backend": "aot_eager" if cpu else "inductor",
    }
    kept = Kept()
    try:
        time_training(
            results,
            section,
            budget,
            case,
            kept,
            check.device,
            2 if cpu else args.steps,
            keep=profile,
            fla_missing=check.fla_missing,
        )
        if profile:
            section_profile(results, section, kept, check.device)
    finally:
        kept.drop()


def time_training(
    results: Results,
    section: str | None,
    budget: Budget,
    case: dict[str, Any],
    kept: Kept,
    device: torch.device,
    steps: int = 10,
    keep: bool = False,
    fla_missing: str | None = None,
) -> dict[str, Any]:
    """Build the run's Trainer for `case`, tune its WKV kernels at the micro-batch, and time its
    steps, the first and second apart (compile, autotune) from the steady step time; the case
    goes to `section` of the report (if one is named) and is returned. Each phase is noted in
    the report as it starts, so a section killed at its bound says where it was. `keep`: leave
    the Trainer in `kept` for the profile."""
    from src.training.distributed import DistEnv
    from src.training.main import build_training_step
    from src.training.warmup import tuning_choices, warm_wkv

    def phase(text: str) -> None:
        if section:
            results.set(section, phase=text)

    env = DistEnv(0, 0, 1, device, None)
    trainer = micro = None
    asked = case["wkv"]
    try:
        free_memory()
        phase("building the model")
        started = time.perf_counter()
        cfg = train_config(
            case["model"],
            case["batch"],
            case["wkv"],
            case["compile"],
            device,
            backend=case.get("backend", "inductor"),
            precision=case.get("precision", "bf16"),
            mix_impl=case.get("mixes", "torch"),
        )
        trainer, plan = build_training_step(cfg, env, total_steps=1000)
        # A compiler failure is this measurement's result, not a reason to time the eager step.
        trainer.eager_fallback = None
        case["build_s"] = round(time.perf_counter() - started, 2)
        case["wkv"] = "/".join(
            sorted({m.wkv_impl for m in trainer.raw_model.modules() if hasattr(m, "wkv_impl")})
        )
        if fla_missing and asked == "auto":
            case["note"] = f"fla missing: auto ran {case['wkv']}"
        case["checkpointing"] = any(getattr(m, "with_cp", False) for m in trainer.raw_model.modules())
        phase("tuning the WKV kernels at the micro-batch")
        tuned = warm_wkv(cfg.model, case["wkv"], plan.micro_batch, device, cfg.precision)
        if tuned is not None:
            case["tune_s"] = round(tuned, 2)
            case["tuned"] = tuning_choices(plan.micro_batch)
        micro = [generated_batch(plan.micro_batch, cfg.model["input_size"], cfg.model["ctx_len"], device)]
        step_no = 0

        def one_step() -> float:
            nonlocal step_no
            t0 = time.perf_counter()
            trainer.step(micro, step_no)
            sync(device)
            step_no += 1
            return time.perf_counter() - t0

        # The first step compiles (torch.compile) and autotunes (Triton); the second shows a recompile.
        phase("first step (compile, autotune)" if case["compile"] else "first step (autotune)")
        case["first_step_s"] = round(one_step(), 2)
        phase("second step")
        case["second_step_s"] = round(one_step(), 3)
        phase("timed steps")
        timed = []
        while len(timed) < steps and budget.allows(2 * max(timed or [case["second_step_s"]])):
            timed.append(one_step())
        if timed:
            timed.sort()
            median = timed[len(timed) // 2]
            case["steps_timed"] = len(timed)
            case["step_ms"] = round(1e3 * median, 2)
            case["samples_per_s"] = round(case["batch"] / median, 1)
        trainer.raise_if_nonfinite()  # a NaN would make the timing meaningless
        case["loss_finite"] = True
        if device.type == "cuda":
            case["peak_bytes"] = torch.cuda.max_memory_allocated(device)
            case["peak_gb"] = gb(case["peak_bytes"])
        if keep:
            kept.step, kept.label = (
                one_step,
                f"{case['model']} batch {case['batch']} {case['wkv']} "
                + ("compiled" if case["compile"] else "eager"),
            )
    except Exception as exc:
        case["error"] = "OOM" if is_oom(exc) else f"{type(exc).__name__}: {first_line(exc)}"
        if device.type == "cuda":
            case["peak_gb"] = gb(torch.cuda.max_memory_allocated(device))
    finally:
        if not keep or "error" in case:
            trainer = micro = None
            if case["compile"]:
                torch._dynamo.reset()  # drops compiled graphs and their hold on the model
            free_memory()
    if section:
        results.add_case(section, case)
    print(f"[{section or 'profile'}] {case}", flush=True)
    return case


def measured_cases(results: Results) -> list[dict[str, Any]]:
    """The training cases of this run's report that measured a peak (or ran out of memory)."""
    cases = []
    for name in TRAIN_SECTIONS:
        for case in results.data["sections"].get(name, {}).get("cases", []):
            if "peak_bytes" in case or case.get("error") == "OOM":
                cases.append(case)
    return cases


def section_predict(check: Check, results: Results, budget: Budget) -> None:
    """The cost model's and the planner's predicted peak beside each measured one."""
    from src.perf.cost_model import estimate_cost
    from src.perf.planner import plan_micro_batch

    measured = measured_cases(results)
    if not measured:
        results.set("predict", note="no training case measured a peak in this run (CUDA only)")
        return
    memory = torch.cuda.get_device_properties(check.device).total_memory
    for case in measured:
        row = {k: case.get(k) for k in ("model", "batch", "wkv", "compile", "checkpointing")}
        if not budget.allows(5.0):
            results.add_case("predict", {**row, "error": "skipped: section time budget spent"})
            continue
        try:
            cost = estimate_cost(
                MODELS[case["model"]], wkv_impl=case["wkv"], precision="bf16", device_type="cuda"
            )
            parts = cost.step_bytes(case["batch"], 1, 1, bool(case["checkpointing"]))
            # The planner counts the loader's prefetched batches; this step holds one batch.
            predicted = parts["total"] - parts["inputs"] + cost.input_bytes * case["batch"]
            row["predicted_gb"] = gb(predicted)
            plan = plan_micro_batch(
                MODELS[case["model"]],
                wkv_impl=case["wkv"],
                precision="bf16",
                device_memory_bytes=memory,
                global_batch=case["batch"],
                world_size=1,
            )
            row["planner"] = (
                f"micro {plan.micro_batch}, checkpointing {'on' if plan.grad_checkpointing else 'off'}, "
                f"{gb(plan.predicted_bytes)} GB with loader prefetch"
            )
            if "peak_bytes" in case:
                row["measured_gb"] = gb(case["peak_bytes"])
                row["measured_over_predicted"] = round(case["peak_bytes"] / predicted, 3)
            else:
                row["measured_gb"] = "OOM"
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {first_line(exc)}"
        results.add_case("predict", row)
    results.set(
        "predict",
        note="predicted: parameters, gradients, AdamW, activations, loss and one batch "
        "(src/perf/cost_model.py); measured: torch.cuda.max_memory_allocated",
    )


# Kernel names to kinds, first match wins: fla's and our WKV kernels, then matrix products
# (cuBLAS, CUTLASS, Inductor's GEMM templates), then copies; the rest is element-wise work
# (Inductor's fused pointwise/reduction kernels, norms, the optimizer).
KINDS = (
    ("wkv", re.compile(r"rwkv|wkv|IntraChunk", re.I)),
    (
        "gemm",
        re.compile(
            r"gemm|gemv|cutlass|cublas|nvjet|xmma|wgmma|triton_tem_|(^|[^a-z])(bmm|addmm|mm|matmul|"
            r"linear|conv\w*)([^a-z]|$)",
            re.I,
        ),
    ),
    ("copy", re.compile(r"memcpy|memset", re.I)),
)
OTHER_KIND = "element-wise"


def kernel_kind(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return OTHER_KIND


def kernel_table(
    times: list[tuple[str, float, int]], top: int = 15
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """(the `top` kernels by time, each kind's share of all kernel time) from (name, us, calls)."""
    total = sum(us for _, us, _ in times) or 1.0
    shares: dict[str, float] = {}
    for name, us, _ in times:
        kind = kernel_kind(name)
        shares[kind] = shares.get(kind, 0.0) + us / total
    rows = [
        {
            "kernel": name[:90],
            "kind": kernel_kind(name),
            "calls": calls,
            "ms": round(us / 1e3, 3),
            "share": round(us / total, 4),
        }
        for name, us, calls in sorted(times, key=lambda t: -t[1])[:top]
    ]
    return rows, {k: round(v, 4) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}


def section_profile(results: Results, section: str, kept: Kept, device: torch.device) -> None:
    """torch.profiler over one more step of the kept Trainer: its top kernels (the section's
    "profile" table) and the shares of matrix products, element-wise work and the WKV."""
    from torch.profiler import ProfilerActivity, profile

    if kept.step is None:
        results.set(section, profile={"note": "not profiled: the step did not run"})
        return
    results.set(section, phase="profiling one step")
    kept.step()  # one more step outside the profile: nothing left to compile or tune
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        kept.step()
    times = []
    for event in prof.key_averages():
        if device.type == "cuda":
            if getattr(event.device_type, "name", "") != "CUDA":
                continue
            us = getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)
        else:  # the CPU has no kernels: torch's operators, by self time, stand in
            us = event.self_cpu_time_total
        if us > 0:
            times.append((event.key, float(us), int(event.count)))
    rows, shares = kernel_table(times)
    results.set(
        section,
        tables={"profile": rows},
        shares=shares,
        profile={
            "step": kept.label,
            "kernel_ms": round(sum(t[1] for t in times) / 1e3, 2),
            "note": "one optimizer step; kinds by kernel name: "
            + ", ".join(k for k, _ in KINDS)
            + f", {OTHER_KIND} (the rest); the WKV's share counts fla's and bi_triton's kernels (chunked's "
            "matrix products count as gemm)",
        },
    )
