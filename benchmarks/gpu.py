"""The GPU check: one command on a bare GPU machine (its own torch and triton, no internet) that
measures what matters most first, writing each result to the JSON report as it comes.

Beforehand, where pip works:   python -m benchmarks.gpu --download-wheels .whl
On the GPU machine:             python3 -m pip install -q --no-index --no-deps --no-compile \\
                                    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \\
                                  && export PYTHONPATH=/tmp/site
                                python -m benchmarks.gpu --output gpu.json

Sections, in order of value, each with a time bound that includes its start-up and compiles
(the table of bounds is printed first; together they fit 8 minutes on one H200). A section
that compiles runs in a child process killed at its bound, reported as such with the phase it
was in, and the next one starts on time; a failure is recorded and the next one runs:
  wkv                   the WKV alone at the training shapes (image T=49, 8 heads of 80; text
                        T=77, 10 heads of 64; batch 512): fla, bi_triton and chunked, fp32 and
                        bf16 inputs, the largest difference from chunked, time
  train_compiled        the recipe's step: B/32, batch 512, bf16, compiled (inductor), --wkv-impl
                        auto, as src.training.main builds it (samples/s, peak memory, compile and
                        autotune apart); then torch.profiler over one more step
  train_eager           the same step eager
  train_fused           the eager step on our own kernels: --wkv-impl bi_triton --mix-impl triton
  train_fused_compiled  the same compiled (inductor)
  predict               the cost model's and the planner's predicted peak beside the measured ones
  b16                   B/16 at batch 512, eager (only with --include b16)
  inference             encode_image of B/32 and B/16 on fla and bi_triton against open_clip's
                        ViTs where open_clip is installed, bf16 (only with --include inference)
  dali, nccl            only where DALI / NCCL are installed (otherwise one line)
A missing fla does not stop the check: the sections run without it and say so (auto runs
chunked then, and its rows name it). Without a CUDA GPU it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from benchmarks import gpu_setup, inference
from benchmarks.gpu_report import (
    Budget,
    Check,
    Results,
    Section,
    bounds_table,
    print_tables,
    run_section,
    run_sections,
    start_watchdog,
)
from src.errors import UserError
from src.errors import report as report_error

PROG = "benchmarks.gpu"
EIGHT_MINUTES = 480.0
STARTUP_S = 10.0  # the check's own start: torch's import, the import check, the device
HARD_STOP_GRACE = 10.0  # the watchdog's, past --time-limit
DEFAULT_TIME_LIMIT = EIGHT_MINUTES - STARTUP_S - HARD_STOP_GRACE
# The bounds are an H200's. --cpu-test runs the same code on tiny shapes, partly under Triton's
# interpreter, on whatever CPU the tests share: the wkv section took 12 s alone on 2 cores and
# over 45 s beside the suite's other workers. Its bounds (and the default --time-limit) are these
# times the H200's, so that a test sees every section finish and no bound means a speed there.
CPU_TEST_BOUND_SCALE = 10
EXTRAS = ("reference", "fla_chunk", "b16", "inference")
TRAIN_COLUMNS = [
    "model",
    "batch",
    "wkv",
    "mixes",
    "compile",
    "checkpointing",
    "samples_per_s",
    "step_ms",
    "peak_gb",
    "build_s",
    "tune_s",
    "first_step_s",
    "second_step_s",
    "note",
    "error",
]
COLUMNS = {
    "wkv": [
        "shape",
        "inputs",
        "impl",
        "ms",
        "first_call_s",
        "peak_gb",
        "max_rel_diff_vs_chunked",
        "largest_in",
        "error",
    ],
    "predict": [
        "model",
        "batch",
        "wkv",
        "compile",
        "checkpointing",
        "measured_gb",
        "predicted_gb",
        "measured_over_predicted",
        "planner",
        "error",
    ],
    "profile": ["kernel", "kind", "calls", "ms", "share"],
    "dali": ["records", "batch", "threads", "images_per_s", "images_per_s_with_rebuilds", "device", "error"],
    "nccl": ["init_s", "all_reduce_gb", "all_reduce_ms", "bus_gb_per_s", "correct", "error"],
}
COLUMNS.update(
    {
        name: TRAIN_COLUMNS
        for name in ("train_compiled", "train_eager", "train_fused", "train_fused_compiled", "b16")
    }
)
COLUMNS["inference"] = inference.GPU_COLUMNS


def _interpreted_only(check: Check) -> str | None:
    # Our kernels run on a CPU only under Triton's interpreter: minutes for a training step.
    return (
        "our Triton kernels need CUDA (on a CPU only Triton's interpreter runs them)"
        if check.cpu_test
        else None
    )


def _dali_unavailable(check: Check) -> str | None:
    from benchmarks import gpu_extras

    return gpu_extras.dali_missing() or ("needs CUDA" if check.cpu_test else None)


def _nccl_unavailable(check: Check) -> str | None:
    from benchmarks import gpu_extras

    return gpu_extras.nccl_missing() or ("needs CUDA" if check.cpu_test else None)


def _wkv(check: Check, results: Results, budget: Budget) -> None:
    from benchmarks import gpu_kernels

    impls = [*gpu_kernels.TIMED_IMPLS, *[i for i in ("reference", "fla_chunk") if i in check.args.include]]
    shapes = (
        {"image": (2, 16, 2, 32), "text": (2, 77, 2, 32)} if check.cpu_test else gpu_kernels.TRAINING_SHAPES
    )
    gpu_kernels.section_wkv(results, budget, check.device, impls, shapes, repeats=2 if check.cpu_test else 5)


def _dali(check: Check, results: Results, budget: Budget) -> None:
    from benchmarks import gpu_extras

    gpu_extras.section_dali(results, budget)


def _nccl(check: Check, results: Results, budget: Budget) -> None:
    from benchmarks import gpu_extras

    gpu_extras.section_nccl(results, budget)


def _train(**kwargs: Any):
    from benchmarks import gpu_train

    return partial(gpu_train.section_train, **kwargs)


def _inference(check: Check, results: Results, budget: Budget) -> None:
    inference.section_gpu(results, budget, check.device, cpu_test=check.cpu_test)


def _predict(check: Check, results: Results, budget: Budget) -> None:
    from benchmarks import gpu_train

    gpu_train.section_predict(check, results, budget)


def build_sections(args: argparse.Namespace) -> list[Section]:
    """The check's sections in the order they run: adding one is one entry here (its name, its
    function taking (check, results, budget), its bound in seconds on one H200, start-up and
    compiles included, and whether it runs in a child process). tests/benchmarks/
    test_gpu_benchmark.py holds the default set to 8 minutes."""
    sections = [
        Section(
            "wkv", _wkv, 45, what="the WKV alone at the training shapes (the only GPU check of our kernels)"
        ),
        Section(
            "train_compiled",
            _train(section="train_compiled", compile=True, profile=True),
            140,
            what="the recipe's step: compiled (inductor), --wkv-impl auto; then a profile of one step",
        ),
        Section("train_eager", _train(section="train_eager", compile=False), 35, what="the same step eager"),
        Section(
            "train_fused",
            _train(section="train_fused", compile=False, fused=True),
            35,
            unavailable=_interpreted_only,
            what="our kernels eager: bi_triton, --mix-impl triton",
        ),
        Section(
            "train_fused_compiled",
            _train(section="train_fused_compiled", compile=True, fused=True),
            100,
            unavailable=_interpreted_only,
            what="our kernels compiled (inductor)",
        ),
        # No compile: it runs in the check's process, stopping between cases when its bound is spent.
        Section(
            "predict",
            _predict,
            25,
            child=False,
            what="the cost model's predicted peaks beside the measured ones",
        ),
    ]
    if "b16" in args.include:
        sections.append(
            Section(
                "b16",
                _train(section="b16", compile=False, model="tiny" if args.cpu_test else "B16"),
                60,
                what="B/16 at batch 512, eager (--include b16)",
            )
        )
    if "inference" in args.include:
        sections.append(
            Section(
                "inference",
                _inference,
                60,
                what="encode_image with fla / bi_triton against "
                "open_clip's ViTs, bf16 (--include inference; benchmarks/inference.py)",
            )
        )
    sections += [
        Section("dali", _dali, 20, unavailable=_dali_unavailable, what="DALI's GPU JPEG pipeline"),
        Section("nccl", _nccl, 10, unavailable=_nccl_unavailable, what="a one-process NCCL all_reduce"),
    ]
    if args.cpu_test:
        sections = [replace(s, bound_s=s.bound_s * CPU_TEST_BOUND_SCALE) for s in sections]
    return sections


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    argv = list(sys.argv[1:] if argv is None else argv)
    names = [s.name for s in build_sections(argparse.Namespace(include=list(EXTRAS), cpu_test=False))]
    parser = argparse.ArgumentParser(
        prog=f"python -m {PROG}",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--output", default="gpu_benchmark.json", help="JSON report (default gpu_benchmark.json)"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"seconds for all sections (default {DEFAULT_TIME_LIMIT:.0f}: with start-up and the "
        f"watchdog's {HARD_STOP_GRACE:.0f} s, 8 minutes); a section gets its bound or what is "
        "left, and the process stops after it whatever runs",
    )
    parser.add_argument(
        "--include",
        action="append",
        choices=EXTRAS,
        default=[],
        help="also time the reference / fla_chunk WKV, B/16 training, or inference against the ViTs "
        "(repeatable)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=names,
        help="run only this section (repeatable); predict uses the training sections of the same run",
    )
    parser.add_argument(
        "--wkv-impl",
        default="auto",
        help="WKV of the training steps (default auto, as the recipes: fla on CUDA when fla-core "
        "imports, chunked otherwise)",
    )
    parser.add_argument(
        "--batch", type=int, default=512, help="training batch (default 512, the recipe's per GPU)"
    )
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per case (default 10)")
    parser.add_argument(
        "--download-wheels",
        metavar="DIR",
        type=Path,
        help="download the wheels the GPU machine lacks ("
        + ", ".join(gpu_setup.carried_pins())
        + ") into DIR and print how to carry and install them; nothing is measured",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="with --download-wheels: print pip's command only"
    )
    parser.add_argument(
        "--cpu-test",
        action="store_true",
        help="for the tests: every section's code on the CPU with the tiny model and tiny shapes, "
        f"under {CPU_TEST_BOUND_SCALE} times the H200's bounds (no number from it means anything)",
    )
    # The check's own: a child process running one section into the parent's report.
    parser.add_argument("--child-section", help=argparse.SUPPRESS)
    parser.add_argument("--child-deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = argv
    if args.time_limit is None:
        args.time_limit = DEFAULT_TIME_LIMIT * (CPU_TEST_BOUND_SCALE if args.cpu_test else 1)
    return args


def download(args: argparse.Namespace) -> int:
    folder: Path = args.download_wheels
    pins = gpu_setup.carried_pins()
    if args.dry_run:
        print(" ".join(gpu_setup.download_command(folder, pins)))
        return 0
    wheels = gpu_setup.download_wheels(folder, pins)
    size = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheel(s), {size:.0f} MiB, in {folder}: " + ", ".join(w.name for w in wheels))
    print(
        f"carry {folder} (git ignores .whl/) and run first on the GPU machine: "
        f"{gpu_setup.install_line(str(folder))}"
    )
    return 0


def header(args: argparse.Namespace, device: Any, fla_missing: str | None) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "args": {k: v for k, v in vars(args).items() if k != "argv"},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "fla_missing": fla_missing,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            device=props.name,
            capability=list(torch.cuda.get_device_capability(device)),
            total_memory_gb=round(props.total_memory / 1e9, 1),
        )
    else:
        info["device"] = "cpu (--cpu-test)"
    for module in ("triton", "fla", "einops", "numpy", "nvidia.dali"):
        try:
            info[module] = getattr(__import__(module, fromlist=["__name__"]), "__version__", "installed")
        except Exception as exc:
            info[module] = f"unavailable ({type(exc).__name__})"
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.download_wheels is not None:
            return download(args)
        return measure(args)
    except UserError as exc:
        return report_error(PROG, exc)


def child_command(args: argparse.Namespace, section: Section, bound: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "benchmarks.gpu",
        *args.argv,
        "--child-section",
        section.name,
        "--child-deadline",
        f"{time.time() + bound:.3f}",
    ]


def measure(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available() and not args.cpu_test:
        print("no CUDA GPU visible to torch: nothing to measure (benchmarks.gpu is the GPU check)")
        return 0
    if args.time_limit <= 0 or args.batch < 1 or args.steps < 0:
        raise UserError("--time-limit and --batch must be positive, --steps not negative")
    output = Path(args.output)
    if not output.parent.is_dir():
        raise UserError(f"--output {output}: folder {output.parent} does not exist")
    fla_missing = gpu_setup.check_imports()
    device = torch.device("cpu") if args.cpu_test else torch.device("cuda", 0)
    if args.wkv_impl != "auto":
        from src.open_alip.wkv import resolve_wkv_impl

        try:
            resolve_wkv_impl(args.wkv_impl, device)
        except ValueError as exc:
            raise UserError(f"--wkv-impl {args.wkv_impl}: {exc}") from None
    if device.type == "cuda":
        torch.cuda.set_device(device)
    check = Check(args, device, fla_missing)
    sections = build_sections(args)
    if args.child_section:
        return run_child_section(check, sections, output)
    sections = [s for s in sections if not args.only or s.name in args.only]
    results = Results(output, header(args, device, fla_missing))
    print(
        f"{results.data['device']}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
        f"fla {results.data['fla']}; writing {output}",
        flush=True,
    )
    if fla_missing:
        print(
            f"fla missing ({fla_missing}): the sections run without it and say so; to carry it: "
            f"{gpu_setup.install_line()}",
            flush=True,
        )
    print(bounds_table(sections, STARTUP_S), flush=True)
    start_watchdog(results, args.time_limit + HARD_STOP_GRACE, COLUMNS)
    for section in sections:  # the report lists them in the order they run
        results.set(section.name, status="pending", bound_s=section.bound_s)
    run_sections(sections, check, results, Budget(args.time_limit), partial(child_command, args))
    results.finish("done")
    print_tables(results, COLUMNS)
    print(f"\nwrote {output}")
    return 0


def run_child_section(check: Check, sections: list[Section], output: Path) -> int:
    """In a child process: run the one section named on the command line into the parent's report."""
    (section,) = [s for s in sections if s.name == check.args.child_section]
    left = (check.args.child_deadline or time.time() + section.bound_s) - time.time()
    run_section(section.name, section.run, check, Results.open(output), Budget(max(left, 0.0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
