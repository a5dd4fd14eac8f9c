"""One command for the day a GPU is lent: WKV kernels, training steps, DALI, NCCL.

    python -m benchmarks.gpu                      # everything, about 7 minutes on one GPU
    python -m benchmarks.gpu --quick              # small shapes, about 2 minutes
    python -m benchmarks.gpu --only train --only predict --output rerun.json

Sections (each guarded: a failure is recorded and the next section runs; each has a
share of --time-limit and skips what would not fit in what is left of it):
  wkv      forward+backward ms of every WKV implementation at the B/32 image shape
           (T=49, H=8, N=80), the text shape (T=77, H=10, N=64) and the B/16 image shape
           (T=196), batch 256 and 512; the largest difference of each against chunked
  train    B/32 and B/16 training steps (forward, ClipLoss, backward, clipping, fused
           AdamW) under bf16 autocast (WKV and loss in float32): samples/s and
           torch.cuda.max_memory_allocated, eager and torch.compile'd; OOM is recorded
  dali     images/s of the DALI training pipeline with the "mixed" (GPU) JPEG decoder
           on generated 500x375 photo-like JPEGs in a temporary .rec
  nccl     a one-process NCCL process group: init and all_reduce
  predict  the cost model's memory prediction (src/training/cost_model.py) for each
           training case that ran, beside the measured peak
Results go to --output (JSON, rewritten after every case) and a table at the end.
Without a CUDA GPU it prints one line and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from src.errors import UserError
from src.errors import report as report_error
from src.fsutil import atomic_write_json

PROG = "benchmarks.gpu"
SECTIONS = ("wkv", "train", "dali", "nccl", "predict")
# Shares of --time-limit per section; what a section leaves unused goes to the next.
SHARES = {"wkv": 0.14, "train": 0.56, "dali": 0.14, "nccl": 0.04, "predict": 0.12}
# Seconds for all sections: with start-up and the hard stop's grace it stays under 8 minutes.
DEFAULT_TIME_LIMIT = 400.0
HARD_STOP_GRACE = 30.0
WKV_SHAPES = {  # name: (tokens, channels, heads)
    "B32 image": (49, 640, 8),
    "text": (77, 640, 10),
    "B16 image": (196, 640, 8),
}
MODELS = {"B32": "RWKV_CLIP_B32", "B16": "RWKV_CLIP_B16"}
LOGIT_SCALE_MAX = math.log(100)


# --------------------------------------------------------------------------------------
# Bookkeeping that runs anywhere (tested on CPU)
# --------------------------------------------------------------------------------------


class Budget:
    """Seconds left of a time allowance, by a monotonic clock."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.seconds = seconds
        self.start = clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def allows(self, estimate_s: float) -> bool:
        return self.left() >= estimate_s


class Results:
    """The JSON report, rewritten (to a temporary name, then renamed) after every change."""

    def __init__(self, path: Path, header: dict[str, Any], keep: dict[str, Any] | None = None):
        self.path = path
        # `keep`: sections of an earlier report that this run does not redo.
        self.data: dict[str, Any] = {**header, "status": "running", "sections": dict(keep or {})}
        self._lock = threading.Lock()
        self.save()

    def section(self, name: str) -> dict[str, Any]:
        return self.data["sections"].setdefault(name, {"status": "running", "cases": []})

    def restart(self, name: str) -> None:
        self.data["sections"][name] = {"status": "running", "cases": []}
        self.save()

    def add_case(self, section: str, case: dict[str, Any]) -> None:
        self.section(section)["cases"].append(case)
        self.save()

    def set(self, section: str, **values: Any) -> None:
        self.section(section).update(values)
        self.save()

    def save(self) -> None:
        with self._lock:
            atomic_write_json(self.path, self.data, default=str)


def run_section(name: str, fn: Callable[[Results, Budget], None], results: Results, budget: Budget) -> None:
    """Run one section; an exception is recorded, never raised."""
    started = time.monotonic()
    results.restart(name)
    results.set(name, budget_s=round(budget.seconds, 1))
    print(f"[{name}] {budget.seconds:.0f} s budget", flush=True)
    try:
        fn(results, budget)
        status = "done"
    except Exception as exc:
        status = "error"
        results.set(name, error=f"{type(exc).__name__}: {_first_line(exc)}", traceback=traceback.format_exc())
        print(f"[{name}] failed: {type(exc).__name__}: {_first_line(exc)}", flush=True)
    results.set(name, status=status, seconds=round(time.monotonic() - started, 1))


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain text table of `columns` (missing cells blank; floats to 4 significant digits)."""

    def cell(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    table = [columns] + [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


TABLE_COLUMNS = {
    "wkv": ["shape", "batch", "impl", "ms", "peak_gb", "max_rel_diff_vs_chunked", "error"],
    "train": ["model", "batch", "wkv", "compile", "checkpointing", "samples_per_s", "step_ms", "peak_gb",
              "first_step_s", "error"],
    "dali": ["records", "batch", "threads", "images_per_s", "images_per_s_with_rebuilds", "device", "error"],
    "nccl": ["init_s", "all_reduce_gb", "all_reduce_ms", "bus_gb_per_s", "correct", "error"],
    "predict": ["model", "batch", "wkv", "compile", "checkpointing", "measured_gb", "predicted_gb",
                "measured_over_predicted", "error"],
}


def print_tables(results: Results) -> None:
    for name, section in results.data["sections"].items():
        print(f"\n== {name}: {section.get('status')} in {section.get('seconds', '?')} s"
              + (f" ({section['error']})" if section.get("error") else ""))
        if section.get("cases"):
            print(format_table(section["cases"], TABLE_COLUMNS.get(name, sorted(section["cases"][0]))))
        for key in ("note", "max_rel_diff_vs_chunked"):
            if key in section:
                print(f"{key}: {section[key]}")


# --------------------------------------------------------------------------------------
# GPU sections (run only where torch.cuda.is_available())
# --------------------------------------------------------------------------------------


def _gb(n: float) -> float:
    return round(n / 1e9, 3)


def _free_cuda() -> None:
    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def _is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _wkv_inputs(batch: int, tokens: int, channels: int, heads: int, seed: int = 0):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    shape = (batch, tokens, channels)
    r, k, v = (torch.randn(shape, device="cuda", generator=g) for _ in range(3))
    w = torch.rand(shape, device="cuda", generator=g) * 6 - 6  # the released models' decay range
    u = torch.randn(heads, channels // heads, device="cuda", generator=g)
    return [t.requires_grad_() for t in (r, k, v, w, u)]


def _wkv_pass(impl: str, inputs, grad) -> Any:
    from src.open_alip.wkv import wkv

    for t in inputs:
        t.grad = None
    y = wkv(*inputs, impl=impl)
    y.backward(grad)
    return y


def section_wkv(results: Results, budget: Budget, quick: bool) -> None:
    import torch

    from benchmarks.wkv import largest_difference
    from src.open_alip.wkv import IMPLEMENTATIONS, available_implementations, resolve_wkv_impl

    # chunked first: the others are compared with it.
    impls = sorted(available_implementations("cuda"), key=lambda n: n != "chunked")
    unusable = {}
    for name in IMPLEMENTATIONS:
        if name not in impls:
            try:
                resolve_wkv_impl(name, "cuda")
            except ValueError as exc:
                unusable[name] = str(exc)
    batches = (32,) if quick else (256, 512)
    repeats = 2 if quick else 5
    results.set("wkv", implementations=impls, unusable=unusable)
    worst: dict[str, float] = {}
    for shape_name, (tokens, channels, heads) in WKV_SHAPES.items():
        for batch in batches:
            reference_out = None
            for impl in impls:
                case = {"shape": shape_name, "tokens": tokens, "heads": heads, "head_size": channels // heads,
                        "batch": batch, "impl": impl}
                if impl == "reference" and batch != batches[0]:
                    case["error"] = "skipped: the reference keeps T x N x N per step; timed at the smallest batch"
                    results.add_case("wkv", case)
                    continue
                if not budget.allows(3.0):
                    case["error"] = "skipped: section time budget spent"
                    results.add_case("wkv", case)
                    continue
                try:
                    _free_cuda()
                    inputs = _wkv_inputs(batch, tokens, channels, heads)
                    # A fixed, non-uniform output gradient exercises every path of the backward.
                    grad = torch.randn(
                        inputs[0].shape, device="cuda", generator=torch.Generator("cuda").manual_seed(1)
                    )
                    base = torch.cuda.memory_allocated()
                    _wkv_pass(impl, inputs, grad)  # warm-up: compiles and autotunes Triton kernels
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    times = []
                    for _ in range(repeats):
                        start.record()
                        y = _wkv_pass(impl, inputs, grad)
                        end.record()
                        end.synchronize()
                        times.append(start.elapsed_time(end))
                    case["ms"] = sorted(times)[len(times) // 2]
                    case["peak_gb"] = _gb(torch.cuda.max_memory_allocated() - base)
                    outs = [y.detach()] + [t.grad.detach() for t in inputs]
                    if impl == "chunked":
                        reference_out = outs
                    elif reference_out is not None:
                        diff, which = largest_difference(outs, reference_out)
                        case["max_rel_diff_vs_chunked"] = diff
                        case["largest_in"] = which
                        worst[impl] = max(worst.get(impl, 0.0), diff)
                except Exception as exc:
                    case["error"] = "OOM" if _is_oom(exc) else f"{type(exc).__name__}: {_first_line(exc)}"
                finally:
                    inputs = grad = y = outs = None
                results.add_case("wkv", case)
                print(f"[wkv] {case}", flush=True)
            reference_out = None
    results.set(
        "wkv",
        max_rel_diff_vs_chunked=worst,
        note="max_rel_diff: the largest max|impl - chunked| / max|chunked| over the output and the five "
        "gradients (float32; largest_in names which)",
    )


def _train_step_fn(model, forward, optimizer, loss_fn, images, tokens):
    import torch

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            image_emb, text_emb, scale = forward(images, tokens, normalize=False)  # as the Trainer
        loss = loss_fn(image_emb, text_emb, scale)  # float32 inside ClipLoss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            model.logit_scale.clamp_(0, LOGIT_SCALE_MAX)

    return step


def _train_inputs(batch: int, size: int, ctx_len: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    images = torch.randn(batch, 3, size, size, device="cuda", generator=g)
    tokens = torch.zeros(batch, ctx_len, dtype=torch.long, device="cuda")
    words = torch.randint(1, 49406, (batch, 20), device="cuda", generator=g)
    tokens[:, 0], tokens[:, 1:21], tokens[:, 21] = 49406, words, 49407  # captions of ~20 tokens
    return images, tokens


def train_cases(quick: bool, impl: str) -> list[dict[str, Any]]:
    """Cases in order of importance: eager first (seconds each), then compiled (minutes)."""

    def case(model: str, batch: int, compile: bool = False, checkpointing: bool = False) -> dict[str, Any]:
        return {"model": model, "batch": batch, "wkv": impl, "compile": compile, "checkpointing": checkpointing}

    if quick:
        return [case("B32", 64), case("B16", 64), case("B32", 64, compile=True)]
    return [
        case("B32", 512), case("B32", 256), case("B16", 512), case("B16", 256),
        case("B16", 512, checkpointing=True),  # the planner's choice for B/16 on 80 GB cards
        case("B32", 512, compile=True), case("B16", 256, compile=True),
        case("B32", 256, compile=True), case("B16", 512, compile=True),
    ]


def section_train(results: Results, budget: Budget, quick: bool, impl: str) -> None:
    import torch

    from src.open_alip import ClipLoss, create_model

    steps, warmup = (3, 2) if quick else (10, 3)
    for case in train_cases(quick, impl):
        # Compiling a model for one batch size takes a minute or more.
        estimate = 120.0 if case["compile"] else 20.0
        if not budget.allows(estimate):
            results.add_case("train", {**case, "error": f"skipped: under {estimate:.0f} s of budget left"})
            continue
        model = optimizer = step = images = tokens = forward = None
        try:
            _free_cuda()
            torch.manual_seed(0)
            model = create_model(MODELS[case["model"]]).cuda().train()
            model.set_wkv_impl(case["wkv"])
            model.set_grad_checkpointing(case["checkpointing"])
            optimizer = torch.optim.AdamW(
                model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.2, fused=True
            )
            forward = torch.compile(model) if case["compile"] else model
            images, tokens = _train_inputs(case["batch"], model.config["input_size"], model.config["ctx_len"])
            step = _train_step_fn(model, forward, optimizer, ClipLoss(), images, tokens)
            started = time.perf_counter()
            step()
            torch.cuda.synchronize()
            case["first_step_s"] = round(time.perf_counter() - started, 2)
            for _ in range(warmup - 1):
                step()
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - started
            case["samples_per_s"] = case["batch"] * steps / elapsed
            case["step_ms"] = 1e3 * elapsed / steps
            case["peak_gb"] = _gb(torch.cuda.max_memory_allocated())
            case["peak_bytes"] = torch.cuda.max_memory_allocated()
        except Exception as exc:
            case["error"] = "OOM" if _is_oom(exc) else f"{type(exc).__name__}: {_first_line(exc)}"
            case["peak_gb"] = _gb(torch.cuda.max_memory_allocated())
        finally:
            model = optimizer = step = images = tokens = forward = None
            with contextlib.suppress(Exception):
                torch._dynamo.reset()  # drops compiled graphs and their hold on the model
        results.add_case("train", case)
        print(f"[train] {case}", flush=True)
    results.set("train", note="samples/s per GPU of one process; peak = torch.cuda.max_memory_allocated")


def _photo_records(folder: Path, records: int, unique: int) -> Path:
    """`records` JPEGs of 500x375 (photo-like: smooth colour fields plus grain), cycling
    over `unique` encoded images to keep generation short; captions are a fixed token list."""
    import cv2
    import numpy as np

    from src.recordio import IRHeader, MXIndexedRecordIO, pack

    rng = np.random.default_rng(0)
    jpegs = []
    for _ in range(unique):
        low = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        img = cv2.resize(low, (500, 375), interpolation=cv2.INTER_CUBIC)
        img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
        jpegs.append(cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes())
    label = np.zeros(77, np.float32)
    label[[0, 1, 2]] = (49406, 320, 49407)
    prefix = folder / "photos"
    with MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "w") as rec:
        for i in range(records):
            rec.write_idx(i, pack(IRHeader(0, label, i, 0), jpegs[i % unique]))
    return prefix


def section_dali(results: Results, budget: Budget, quick: bool) -> None:
    import torch

    from dataloaders.imagenet import build_loader

    records, batch, epochs = (512, 64, 2) if quick else (8192, 256, 3)
    threads = max(1, min(8, (os.cpu_count() or 2) - 2))
    case: dict[str, Any] = {"records": records, "batch": batch, "threads": threads, "epochs": epochs}
    with tempfile.TemporaryDirectory() as tmp:
        prefix = _photo_records(Path(tmp), records, unique=256)
        loader = build_loader(
            f"{prefix}.rec", batch, input_size=224, train=True, backend="dali", device="cuda",
            num_threads=threads, rank=0, world_size=1, seed=0, cache_dir=tmp,
        )
        steady_images, steady_s, total_images, total_s = 0, 0.0, 0, 0.0
        for epoch in range(epochs):
            if epoch and not budget.allows(10.0):
                case["note"] = f"stopped after {epoch} epochs: section time budget spent"
                break
            loader.set_epoch(epoch)
            started = time.perf_counter()
            first_done = None
            for i, (images, tokens) in enumerate(loader):
                if i == 0:
                    torch.cuda.synchronize()
                    first_done = time.perf_counter()
                    case["device"] = str(images.device)
                    case["tokens_device"] = str(tokens.device)
                    case["shape"] = list(images.shape)
                    case["dtype"] = str(images.dtype)
                elif epoch:  # epoch 0 warms up the decoder
                    steady_images += images.shape[0]
            torch.cuda.synchronize()
            ended = time.perf_counter()
            if epoch and first_done is not None:
                steady_s += ended - first_done
                total_images += len(loader) * batch
                total_s += ended - started
        if steady_s:
            case["images_per_s"] = steady_images / steady_s
            case["images_per_s_with_rebuilds"] = total_images / total_s
    results.add_case("dali", case)
    results.set(
        "dali",
        note="images/s within epochs after the first (warm-up); with_rebuilds includes each epoch's pipeline build",
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def section_nccl(results: Results, budget: Budget, quick: bool) -> None:
    import torch
    import torch.distributed as dist

    version = torch.cuda.nccl.version()
    case: dict[str, Any] = {"nccl_version": ".".join(map(str, version)) if isinstance(version, tuple) else str(version)}
    device = torch.device("cuda", 0)
    started = time.perf_counter()
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1, device_id=device
    )
    try:
        case["init_s"] = round(time.perf_counter() - started, 3)
        n = (16 if quick else 256) * 2**20 // 4  # float32 elements
        x = torch.full((n,), 1.5, device=device)
        dist.all_reduce(x)  # warm-up: builds the communicator
        torch.cuda.synchronize()
        repeats = 5
        started = time.perf_counter()
        for _ in range(repeats):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / repeats
        case["all_reduce_gb"] = _gb(x.numel() * 4)
        case["all_reduce_ms"] = 1e3 * seconds
        case["bus_gb_per_s"] = x.numel() * 4 / seconds / 1e9
        case["correct"] = bool((x == 1.5).all().item())  # a sum over one rank leaves it unchanged
    finally:
        dist.destroy_process_group()
    results.add_case("nccl", case)


def section_predict(results: Results, budget: Budget) -> None:
    from src.training.cost_model import estimate_cost

    ran = [c for c in results.section("train")["cases"] if "peak_bytes" in c or c.get("error") == "OOM"]
    if not ran:
        results.set("predict", note="no training case ran in this process; run with the train section")
        return
    for case in ran:
        row = {k: case[k] for k in ("model", "batch", "wkv", "compile", "checkpointing")}
        if not budget.allows(5.0):
            results.add_case("predict", {**row, "error": "skipped: section time budget spent"})
            continue
        try:
            cost = estimate_cost(MODELS[case["model"]], wkv_impl=case["wkv"], precision="bf16", device_type="cuda")
            parts = cost.step_bytes(case["batch"], 1, 1, case["checkpointing"])
            # This benchmark holds one batch on the GPU and no loader queue.
            predicted = parts["total"] - parts["inputs"] + cost.input_bytes * case["batch"]
            row["predicted_gb"] = _gb(predicted)
            if "peak_bytes" in case:
                row["measured_gb"] = _gb(case["peak_bytes"])
                row["measured_over_predicted"] = case["peak_bytes"] / predicted
            else:
                row["measured_gb"] = "OOM"
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {_first_line(exc)}"
        results.add_case("predict", row)
    results.set("predict", note="predicted: params, grads, AdamW, activations, loss and one batch of inputs")


# --------------------------------------------------------------------------------------


def _header(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    props = torch.cuda.get_device_properties(0)
    info: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "capability": list(torch.cuda.get_device_capability(0)),
        "total_memory_gb": _gb(props.total_memory),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "args": {k: v for k, v in vars(args).items()},
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    for module in ("nvidia.dali", "triton", "fla"):
        try:
            info[module] = getattr(__import__(module, fromlist=["__name__"]), "__version__", "installed")
        except Exception as exc:  # optional packages: record why they are missing
            info[module] = f"unavailable ({type(exc).__name__})"
    return info


def _earlier_sections(path: Path, redo: list[str]) -> dict[str, Any]:
    """The sections of an existing report at `path` that this run does not redo."""
    try:
        sections = json.loads(path.read_text()).get("sections", {})
    except (OSError, ValueError, AttributeError):
        return {}
    return {name: value for name, value in sections.items() if name not in redo}


def _watchdog(results: Results, limit_s: float) -> None:
    """Past the hard limit, save what there is, print the tables and stop the process."""

    def fire() -> None:
        results.data["status"] = f"stopped at the {limit_s:g} s time limit"
        for _ in range(3):  # the main thread may be changing the report right now
            try:
                results.save()
                break
            except RuntimeError:
                time.sleep(0.1)
        print(f"\ntime limit of {limit_s:g} s reached; stopping (results so far in {results.path})", flush=True)
        with contextlib.suppress(Exception):
            print_tables(results)
        sys.stdout.flush()
        os._exit(0)

    timer = threading.Timer(limit_s, fire)
    timer.daemon = True
    timer.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--output", default="gpu_benchmark.json", help="JSON report (default gpu_benchmark.json)")
    parser.add_argument("--quick", action="store_true", help="small shapes and few steps (about 2 minutes)")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="run only this section (repeatable)")
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT,
                        help=f"seconds for all sections (default {DEFAULT_TIME_LIMIT:.0f}); the process stops "
                        f"{HARD_STOP_GRACE:.0f} s after it whatever runs")
    parser.add_argument("--wkv-impl", default="auto",
                        help="WKV for the training steps (default auto: fla when it runs, else chunked)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU visible to torch: nothing to benchmark (this is a GPU-only benchmark)")
        return 0
    if args.time_limit <= 0:
        return report_error(PROG, UserError(f"--time-limit {args.time_limit}: must be positive"))
    output = Path(args.output)
    if not output.parent.is_dir():
        return report_error(PROG, UserError(f"--output {output}: folder {output.parent} does not exist"))
    from src.open_alip.wkv import resolve_wkv_impl

    try:
        impl = resolve_wkv_impl(args.wkv_impl, "cuda")
    except ValueError as exc:
        return report_error(PROG, UserError(f"--wkv-impl: {exc}"))

    torch.cuda.set_device(0)
    chosen = [s for s in SECTIONS if not args.only or s in args.only]
    results = Results(output, _header(args), keep=_earlier_sections(output, chosen) if args.only else None)
    print(f"{results.data['device']}, torch {torch.__version__}, CUDA {torch.version.cuda}; writing {output}")
    _watchdog(results, args.time_limit + HARD_STOP_GRACE)
    runners = {
        "wkv": lambda r, b: section_wkv(r, b, args.quick),
        "train": lambda r, b: section_train(r, b, args.quick, impl),
        "dali": lambda r, b: section_dali(r, b, args.quick),
        "nccl": lambda r, b: section_nccl(r, b, args.quick),
        "predict": section_predict,
    }
    overall = Budget(args.time_limit)
    share_total = sum(SHARES[s] for s in chosen)
    for i, name in enumerate(chosen):
        later = sum(SHARES[s] for s in chosen[i + 1 :])
        # This section's share, plus whatever earlier sections left unused.
        seconds = max(0.0, overall.left() - args.time_limit * later / share_total)
        run_section(name, runners[name], results, Budget(seconds))
    results.data["status"] = "done"
    results.save()
    print_tables(results)
    print(f"\nwrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
