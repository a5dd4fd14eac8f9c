"""The GPU check: one command on a bare H200 (its own torch and triton, no internet) that
measures what matters most first, writing each result to the JSON report as it comes.

Beforehand, where pip works:   python -m benchmarks.gpu --download-wheels .whl
On the GPU machine:             python3 -m pip install -q --no-index --no-deps --no-compile \\
                                    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \\
                                  && export PYTHONPATH=/tmp/site
                                python -m benchmarks.gpu --output gpu.json

Sections, in order of value (each guarded: a failure is recorded and the next one runs; each
starts only with the time it needs left, and takes at most its cap):
  train_eager     B/32, batch 512, bf16, fla: the real training step (src.training.loop.Trainer,
                  built as train.py builds it), samples/s, peak memory, first steps apart
  train_fused     the eager step on our own kernels: --wkv-impl bi_triton --mix-impl triton
                  (the fused token-shift mixes), against train_eager's fla and eager mixes
  train_compiled  the same as train_eager under --compile (inductor); the first step is the compile
  wkv             the WKV alone at the training shapes (image T=49, 8 heads of 80; text T=77,
                  10 heads of 64; batch 512): fla, bi_triton and chunked, fp32 and bf16
                  inputs, time and the largest difference from chunked
  predict         the cost model's and the planner's predicted peak beside the measured ones
  profile         torch.profiler over one compiled step: top kernels, GEMM / element-wise /
                  WKV shares
  b16             B/16 at batch 512, eager (only with --include b16)
  dali, nccl      only where DALI / NCCL are installed (a missing DALI is one line)
--include reference / fla_chunk adds those WKVs to the wkv section. The whole run stays under
8 minutes (--time-limit for the sections; a watchdog ends the process 30 s after it, keeping
the report). Without a CUDA GPU it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import gpu_setup
from benchmarks.gpu_report import Budget, Results, Section, print_tables, run_sections, start_watchdog
from src.errors import UserError
from src.errors import report as report_error

PROG = "benchmarks.gpu"
DEFAULT_TIME_LIMIT = 400.0  # with start-up (~20 s) and the watchdog's grace: under 8 minutes
HARD_STOP_GRACE = 30.0
SECTION_NAMES = ("train_eager", "train_fused", "train_compiled", "wkv", "predict", "profile", "b16", "dali", "nccl")
EXTRAS = ("reference", "fla_chunk", "b16")
COLUMNS = {
    "train_eager": ["model", "batch", "wkv", "compile", "checkpointing", "samples_per_s", "step_ms", "peak_gb",
                    "first_step_s", "second_step_s", "error"],
    "wkv": ["shape", "inputs", "impl", "ms", "first_call_s", "peak_gb", "max_rel_diff_vs_chunked", "largest_in",
            "error"],
    "predict": ["model", "batch", "compile", "checkpointing", "measured_gb", "predicted_gb",
                "measured_over_predicted", "planner", "error"],
    "profile": ["kernel", "kind", "calls", "ms", "share"],
    "dali": ["records", "batch", "threads", "images_per_s", "images_per_s_with_rebuilds", "device", "error"],
    "nccl": ["init_s", "all_reduce_gb", "all_reduce_ms", "bus_gb_per_s", "correct", "error"],
}
COLUMNS["train_compiled"] = COLUMNS["b16"] = COLUMNS["train_eager"]
COLUMNS["train_fused"] = [*COLUMNS["train_eager"][:3], "mixes", *COLUMNS["train_eager"][3:]]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {PROG}", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("--output", default="gpu_benchmark.json", help="JSON report (default gpu_benchmark.json)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help=f"seconds for all sections (default {DEFAULT_TIME_LIMIT:.0f}); the process stops "
                             f"{HARD_STOP_GRACE:.0f} s after it whatever runs")
    parser.add_argument("--include", action="append", choices=EXTRAS, default=[],
                        help="also time the reference / fla_chunk WKV, or B/16 training (repeatable)")
    parser.add_argument("--only", action="append", choices=SECTION_NAMES,
                        help="run only this section (repeatable); profile and predict use the training sections "
                             "of the same run")
    parser.add_argument("--wkv-impl", default=None,
                        help="WKV of the training steps (default fla; fla-core must import)")
    parser.add_argument("--batch", type=int, default=512, help="training batch (default 512, the recipe's per GPU)")
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per case (default 10)")
    parser.add_argument("--download-wheels", metavar="DIR", type=Path,
                        help="download the wheels the GPU machine lacks (" + ", ".join(gpu_setup.carried_pins())
                             + ") into DIR and print how to carry and install them; nothing is measured")
    parser.add_argument("--dry-run", action="store_true", help="with --download-wheels: print pip's command only")
    parser.add_argument("--cpu-test", action="store_true",
                        help="for the tests: every section's code on the CPU with the tiny model and tiny shapes "
                             "(no number from it means anything)")
    args = parser.parse_args(argv)
    if args.time_limit is None:
        args.time_limit = 120.0 if args.cpu_test else DEFAULT_TIME_LIMIT
    if args.wkv_impl is None:
        args.wkv_impl = "chunked" if args.cpu_test else "fla"
    return args


def download(args: argparse.Namespace) -> int:
    folder: Path = args.download_wheels
    pins = gpu_setup.carried_pins()
    if args.dry_run:
        print(" ".join(gpu_setup.download_command(folder, pins)))
        return 0
    wheels = gpu_setup.download_wheels(folder, pins)
    print(f"{len(wheels)} wheel(s) in {folder}: " + ", ".join(w.name for w in wheels))
    print(f"carry {folder} (git ignores .whl/) and run first on the GPU machine: {gpu_setup.install_line(str(folder))}")
    return 0


def header(args: argparse.Namespace, device: Any) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "args": vars(args),
                            "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device=props.name, capability=list(torch.cuda.get_device_capability(device)),
                    total_memory_gb=round(props.total_memory / 1e9, 1))
    else:
        info["device"] = "cpu (--cpu-test)"
    for module in ("triton", "fla", "einops", "nvidia.dali"):
        try:
            info[module] = getattr(__import__(module, fromlist=["__name__"]), "__version__", "installed")
        except Exception as exc:
            info[module] = f"unavailable ({type(exc).__name__})"
    return info


def build_sections(args: argparse.Namespace, device: Any) -> list[Section]:
    from benchmarks import gpu_extras, gpu_kernels, gpu_train

    kept = gpu_train.Kept()
    cpu = args.cpu_test
    model, batch = ("tiny", 8) if cpu else ("B32", args.batch)
    backend = "aot_eager" if cpu else "inductor"
    steps = 2 if cpu else args.steps

    def case(name: str, compile: bool, fused: bool = False) -> dict[str, Any]:
        wkv, mixes = ("bi_triton", "triton") if fused else (args.wkv_impl, "torch")
        return {"model": name, "batch": batch, "wkv": wkv, "mixes": mixes, "compile": compile, "backend": backend}

    def train(section: str, model_name: str, compile: bool, keep: bool, results: Results, budget: Budget,
              fused: bool = False) -> None:
        if keep:
            kept.drop()
        gpu_train.time_training(results, section, budget, case(model_name, compile, fused), kept, device, steps,
                                keep=keep)

    def profile(results: Results, budget: Budget) -> None:
        if kept.step is None:  # the compiled case did not run or failed: profile an eager step
            built = gpu_train.time_training(results, None, budget, case(model, False), kept, device, 0, keep=True)
            results.set("profile", step_case=built)
        try:
            gpu_train.section_profile(results, budget, kept, device)
        finally:
            kept.drop()

    impls = [*gpu_kernels.TIMED_IMPLS, *[i for i in ("reference", "fla_chunk") if i in args.include]]
    shapes = {"image": (2, 16, 2, 32), "text": (2, 77, 2, 32)} if cpu else gpu_kernels.TRAINING_SHAPES
    sections = [
        Section("train_eager", partial(train, "train_eager", model, False, False), needs_s=20, cap_s=60),
        Section("train_fused", partial(train, "train_fused", model, False, False, fused=True), needs_s=20, cap_s=60),
        Section("train_compiled", partial(train, "train_compiled", model, True, True), needs_s=120, cap_s=220),
        Section("wkv", lambda r, b: gpu_kernels.section_wkv(r, b, device, impls, shapes, repeats=2 if cpu else 5),
                needs_s=15, cap_s=75),
        Section("predict", lambda r, b: gpu_train.section_predict(r, b, kept, device), needs_s=10, cap_s=40),
        Section("profile", profile, needs_s=5, cap_s=40),
    ]
    if "b16" in args.include:
        sections.append(Section("b16", partial(train, "b16", "tiny" if cpu else "B16", False, False),
                                needs_s=30, cap_s=90))
    sections += [Section("dali", gpu_extras.section_dali, needs_s=20, cap_s=40),
                 Section("nccl", gpu_extras.section_nccl, needs_s=5, cap_s=15)]
    if cpu:  # our kernels run on the CPU only under Triton's interpreter, too slow for a smoke run
        sections = [s for s in sections if s.name != "train_fused"]
    if cpu:  # the tiny configuration needs seconds where the real one needs minutes
        sections = [dataclasses.replace(s, needs_s=1.0) for s in sections]
    return sections


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.download_wheels is not None:
            return download(args)
        return measure(args)
    except UserError as exc:
        return report_error(PROG, exc)


def measure(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available() and not args.cpu_test:
        print("no CUDA GPU visible to torch: nothing to measure (benchmarks.gpu is the GPU check)")
        return 0
    problems = gpu_setup.missing(gpu_setup.needs(args.wkv_impl))
    if problems:
        raise UserError(gpu_setup.missing_message(problems))
    device = torch.device("cpu") if args.cpu_test else torch.device("cuda", 0)
    from src.open_alip.wkv import resolve_wkv_impl

    try:
        if resolve_wkv_impl(args.wkv_impl, device) != args.wkv_impl:
            raise ValueError(f"it resolves to {resolve_wkv_impl(args.wkv_impl, device)} here; name one")
    except ValueError as exc:
        raise UserError(f"--wkv-impl {args.wkv_impl}: {exc}") from None
    if args.time_limit <= 0 or args.batch < 1 or args.steps < 0:
        raise UserError("--time-limit and --batch must be positive, --steps not negative")
    output = Path(args.output)
    if not output.parent.is_dir():
        raise UserError(f"--output {output}: folder {output.parent} does not exist")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    results = Results(output, header(args, device))
    print(f"{results.data['device']}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"fla {results.data['fla']}; writing {output}", flush=True)
    start_watchdog(results, args.time_limit + HARD_STOP_GRACE, COLUMNS)
    sections = [s for s in build_sections(args, device) if not args.only or s.name in args.only]
    for section in sections:  # the report lists them in the order they run
        results.set(section.name, status="pending")
    absent = {"dali": "dali_missing", "nccl": "nccl_missing"}
    from benchmarks import gpu_extras

    runnable = []
    for section in sections:
        why = getattr(gpu_extras, absent[section.name])() if section.name in absent else None
        if why is None and section.name in absent and args.cpu_test:
            why = "needs CUDA"
        if why:
            results.set(section.name, status="skipped", note=why)
            print(f"[{section.name}] skipped: {why}", flush=True)
        else:
            runnable.append(section)
    run_sections(runnable, results, Budget(args.time_limit))
    results.finish("done")
    print_tables(results, COLUMNS)
    print(f"\nwrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
