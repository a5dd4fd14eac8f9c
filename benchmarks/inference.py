"""Inference speed of RWKV-CLIP against open_clip's ViTs, both measured in this one process.

Images/s and peak memory of `encode_image` for RWKV-CLIP B/32 and B/16 against open_clip's
ViT-B/32 and ViT-B/16 at 224, 384, 448, 640 and 1024 px, and texts/s of `encode_text` (RWKV-CLIP's
text tower against the ViTs' 12-layer text transformer): the same torch, threads, batch, precision
and inputs, under torch.inference_mode(). In each round the two models take turns (the order
alternates between rounds), so load from other processes falls on both; the table gives the
median round's images/s and the range of the per-round speed ratio RWKV/ViT. Then each model's
growth exponent in tokens between sizes (time per image ~ tokens^e; 1 is linear), the peak memory
of one call (a fresh child process per pair; benchmarks/peak_rss.py) and the goals of issue 44.

The ViTs are open_clip's own code: open_clip_torch 3.3.0 as the tokenizer oracle's venv holds it
(benchmarks/oracles.py builds that venv on first use, about a minute; `--open-clip DIR` takes any
open_clip folder). Its model.py is imported into this process from that folder, under this
process's torch: open_clip's __init__ is skipped (it imports torchvision's transforms), and
torchvision.ops.misc is a stand-in module, because open_clip's utils.py imports FrozenBatchNorm2d
from it (to freeze ResNet batch norms, which no ViT calls) and PyPI's torchvision wheels are CUDA
builds that do not load beside a CPU torch. The models are `open_clip.model.CLIP` built from
open_clip's own ViT-B-32.json / ViT-B-16.json, with the image size set to the one measured (its
position table is fixed); RWKV-CLIP keeps its 224-px config and resizes its table, as for any
size. Random weights on both sides: speed does not depend on them.

A call holds at most `--max-tokens` patch tokens (default 16 images of 196), so the batch shrinks
at the larger sizes; both models of a row always get the same batch.

    .venv/bin/python -m benchmarks.inference                    # B/32 and B/16, five sizes, text
    .venv/bin/python -m benchmarks.inference --models B32 --sizes 224,448 --threads 1 --clock cpu
    .venv/bin/python -m benchmarks.inference --precision bf16   # bf16 weights on both sides
    .venv/bin/python -m benchmarks.inference --compile --models B32 --sizes 224 --no-memory --text-batch 0
    .venv/bin/python -m benchmarks.inference --wkv --threads 1 --clock cpu   # the WKV alone, both forms

On a GPU, `python -m benchmarks.gpu --only inference` runs `section_gpu` below: the same rows with
the WKV on fla and on bi_triton, bf16 weights.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import statistics
import subprocess
import sys
import sysconfig
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

# pair: (RWKV-CLIP config, open_clip config, patch size)
PAIRS = {"B32": ("RWKV_CLIP_B32", "ViT-B-32", 32), "B16": ("RWKV_CLIP_B16", "ViT-B-16", 16)}
SIZES = (224, 384, 448, 640, 1024)
PRECISIONS = ("fp32", "bf16")
MAX_TOKENS = 16 * 196  # a call's patch tokens: batch 16 up to 448 px at B/32, 224 px at B/16
# Issue 44's goals, checked from each run.
GOAL_224 = 0.85  # B/32 at 224 px: RWKV/ViT speed at least this
GOAL_GROWTH = 4.4  # B/32 time per image at 448 px over 224 px (4x tokens): at most this
GOAL_1024 = 1.5  # B/16 at 1024 px: RWKV/ViT speed at least this


def tokens_of(size: int, patch: int) -> int:
    return (size // patch) ** 2


def batch_for(size: int, patch: int, batch: int, max_tokens: int) -> int:
    return max(1, min(batch, max_tokens // tokens_of(size, patch)))


# ------------------------------------------------------------------------------ the models


def default_open_clip_dir() -> Path:
    """open_clip's folder in the tokenizer oracle's venv (built on first use)."""
    from benchmarks.oracles import reference_python

    base = str(reference_python().parent.parent)
    return Path(sysconfig.get_paths(vars={"base": base, "platbase": base})["purelib"]) / "open_clip"


def load_open_clip(folder: Path) -> types.ModuleType:
    """open_clip's `model` module from `folder`, without its package __init__ (module docstring)."""
    if not (folder / "model.py").is_file() or not (folder / "transformer.py").is_file():
        raise SystemExit(
            f"error: {folder} holds no open_clip model code (model.py, transformer.py); "
            "pass --open-clip PATH/open_clip"
        )
    if "torchvision.ops.misc" not in sys.modules:
        try:
            importlib.import_module("torchvision.ops.misc")
        except Exception:  # absent, or a CUDA build beside a CPU torch
            stand_in = types.ModuleType("torchvision.ops.misc")

            class FrozenBatchNorm2d:  # only open_clip's freeze_batch_norm_2d (ResNet towers) builds one
                def __init__(self, *args: Any, **kwargs: Any):
                    raise RuntimeError("torchvision is not importable here: FrozenBatchNorm2d is a stand-in")

            stand_in.FrozenBatchNorm2d = FrozenBatchNorm2d
            for name in ("torchvision", "torchvision.ops"):
                sys.modules.setdefault(name, types.ModuleType(name))
            sys.modules["torchvision.ops.misc"] = stand_in
    loaded = sys.modules.get("open_clip")
    if loaded is None or list(getattr(loaded, "__path__", [])) != [str(folder)]:
        package = types.ModuleType("open_clip")
        package.__path__ = [str(folder)]
        sys.modules["open_clip"] = package
    return importlib.import_module("open_clip.model")


def build_vit(open_clip_model: types.ModuleType, name: str, size: int):
    """open_clip's CLIP from its own `name`.json, for `size`-px images, in eval mode."""
    config = json.loads(
        (Path(open_clip_model.__file__).parent / "model_configs" / f"{name}.json").read_text()
    )
    config["vision_cfg"]["image_size"] = size
    return open_clip_model.CLIP(**config).eval()


def build_rwkv(name: str, wkv_impl: str = "auto"):
    from src.open_alip.model import create_model

    return create_model(name, wkv_impl=wkv_impl).eval()


# ------------------------------------------------------------------------------ timing


def clock_of(kind: str) -> Callable[[], float]:
    return time.process_time if kind == "cpu" else time.perf_counter


def sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_turns(
    calls: dict[str, Callable[[], object]], rounds: int, clock: Callable[[], float], device: Any = "cpu"
) -> dict[str, list[float]]:
    """Seconds of each call in each round, after one warm-up call each; the order alternates."""
    for call in calls.values():
        call()
    sync(device)
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for i in range(rounds):
        for name in names if i % 2 == 0 else names[::-1]:
            start = clock()
            calls[name]()
            sync(device)
            times[name].append(clock() - start)
    return times


def growth_exponent(tokens: tuple[int, int], seconds: tuple[float, float]) -> float:
    """e in seconds ~ tokens^e between two sizes (per image)."""
    return math.log(seconds[1] / seconds[0]) / math.log(tokens[1] / tokens[0])


@dataclass
class Row:
    pair: str
    size: int
    tokens: int
    batch: int
    rwkv: list[float]  # seconds per call, one per round
    vit: list[float]
    peaks: dict[str, int] = field(default_factory=dict)  # "rwkv"/"vit": bytes

    def per_image(self, which: str) -> float:
        return statistics.median(getattr(self, which)) / self.batch

    def ratios(self) -> list[float]:
        """RWKV/ViT speed in each round (ViT time / RWKV time)."""
        return [v / r for r, v in zip(self.rwkv, self.vit)]


def image_batch(batch: int, size: int, dtype: Any, device: Any):
    import torch

    g = torch.Generator().manual_seed(size)
    return torch.randn(batch, 3, size, size, generator=g).to(device, dtype)


def text_batch(batch: int, ctx_len: int, device: Any):
    import torch

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(1, 49407, (batch, ctx_len), generator=g)
    tokens[:, ctx_len // 3 :] = 0  # padding, as captions leave it
    tokens[:, ctx_len // 3 - 1] = 49407  # the end token open_clip pools at
    return tokens.to(device)


def dtype_of(precision: str):
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]


# ------------------------------------------------------------------------------ memory


def memory_child(spec: dict[str, Any]) -> None:
    """Runs in a fresh process (peak_rss.child_env): the peak extra memory of one encode_image call of
    each model per size, printed as JSON {"rwkv": {size: bytes}, "vit": {size: bytes}}. The models
    and each input exist before the call; the first call at a size (oneDNN set-up) is not counted."""
    import torch

    from benchmarks.peak_rss import peak_growth

    torch.set_num_threads(spec["threads"])
    dtype = dtype_of(spec["precision"])
    open_clip_model = load_open_clip(Path(spec["open_clip"]))
    rwkv = build_rwkv(spec["rwkv"]).to(dtype)
    peaks: dict[str, dict[int, int]] = {"rwkv": {}, "vit": {}}
    with torch.inference_mode():
        for size, batch in spec["sizes"]:
            vit = build_vit(open_clip_model, spec["vit"], size).to(dtype)
            images = image_batch(batch, size, dtype, "cpu")
            for kind, model in (("rwkv", rwkv), ("vit", vit)):
                model.encode_image(images)
                peaks[kind][size] = peak_growth(partial(model.encode_image, images))
            del vit
    print(json.dumps(peaks))


def cpu_peaks(
    pair: tuple[str, str], sizes: list[tuple[int, int]], precision: str, threads: int, open_clip: Path
) -> dict[str, dict[int, int]]:
    """{"rwkv"/"vit": {size: peak bytes}} of RWKV-CLIP `pair[0]` and the ViT `pair[1]`, measured in one
    fresh child process."""
    from benchmarks.peak_rss import child_env

    spec = {
        "rwkv": pair[0],
        "vit": pair[1],
        "sizes": sizes,
        "precision": precision,
        "threads": threads,
        "open_clip": str(open_clip),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.inference", "--_memory-child", json.dumps(spec)],
        env=child_env(),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the memory child for {pair} failed: {proc.stderr.strip().splitlines()[-1:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    return {kind: {int(size): peak for size, peak in by_size.items()} for kind, by_size in found.items()}


# ------------------------------------------------------------------------------ the CPU table


def measure_images(args: argparse.Namespace, open_clip_model: types.ModuleType) -> list[Row]:
    import torch

    dtype, clock = dtype_of(args.precision), clock_of(args.clock)
    rows = []
    for pair in args.models:
        rwkv_name, vit_name, patch = PAIRS[pair]
        rwkv = build_rwkv(rwkv_name, args.wkv_impl).to(args.device, dtype)
        for size in args.sizes:
            batch = batch_for(size, patch, args.batch, args.max_tokens)
            vit = build_vit(open_clip_model, vit_name, size).to(args.device, dtype)
            images = image_batch(batch, size, dtype, args.device)
            calls = {"rwkv": rwkv.encode_image, "vit": vit.encode_image}
            if args.compile:  # inductor on both; the first call, timed here, compiles
                calls = {name: torch.compile(fn) for name, fn in calls.items()}
                with torch.inference_mode():
                    for name, fn in calls.items():
                        start = time.perf_counter()
                        fn(images)
                        print(
                            f"  compiled {name} for {size} px in {time.perf_counter() - start:.0f} s",
                            flush=True,
                        )
            with torch.inference_mode():
                times = time_turns(
                    {name: partial(fn, images) for name, fn in calls.items()}, args.rounds, clock, args.device
                )
            row = Row(pair, size, tokens_of(size, patch), batch, times["rwkv"], times["vit"])
            rows.append(row)
            print_row(row, args.precision, live=True)
    return rows


def measure_text(
    args: argparse.Namespace, open_clip_model: types.ModuleType
) -> tuple[list[float], list[float]]:
    import torch

    dtype = dtype_of(args.precision)
    rwkv = build_rwkv("RWKV_CLIP_B32", args.wkv_impl).to(args.device, dtype)
    vit = build_vit(open_clip_model, "ViT-B-32", 224).to(args.device, dtype)
    tokens = text_batch(args.text_batch, rwkv.context_length, args.device)
    with torch.inference_mode():
        calls = {"rwkv": partial(rwkv.encode_text, tokens), "vit": partial(vit.encode_text, tokens)}
        times = time_turns(calls, args.rounds, clock_of(args.clock), args.device)
    return times["rwkv"], times["vit"]


def mib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**20:,.0f}"


def print_row(row: Row, precision: str, live: bool = False) -> None:
    ratios = row.ratios()
    rwkv_rate, vit_rate = 1 / row.per_image("rwkv"), 1 / row.per_image("vit")
    line = (
        f"{row.pair[0]}/{row.pair[1:]:<3} {row.size:>5} {row.tokens:>6} {row.batch:>5}  "
        f"{rwkv_rate:>10.3g} {vit_rate:>10.3g}  {statistics.median(ratios):>6.2f}x "
        f"[{min(ratios):.2f}-{max(ratios):.2f}]"
    )
    if row.peaks:
        line += f"  {mib(row.peaks.get('rwkv')):>9} {mib(row.peaks.get('vit')):>9}"
    print(("  measured: " if live else "") + line, flush=True)


def print_report(
    args: argparse.Namespace, rows: list[Row], text: tuple[list[float], list[float]] | None
) -> None:
    import torch

    where = (
        f"cpu, {torch.get_num_threads()} threads" if args.device == "cpu" else torch.cuda.get_device_name()
    )
    compiled = ", torch.compile (inductor) on both" if args.compile else ""
    print(
        f"\nencode_image, {args.precision}{compiled}, {where}, torch {torch.__version__}, {args.clock} "
        f"clock; median of {args.rounds} rounds, the models alternating in each"
    )
    print(
        "model  px    tokens batch  RWKV img/s  ViT img/s  RWKV/ViT [rounds]"
        + ("   peak MiB: RWKV       ViT" if any(r.peaks for r in rows) else "")
    )
    for row in rows:
        print_row(row, args.precision)
    if len(args.sizes) > 1:
        print(
            "growth exponent in tokens (time per image ~ tokens^e, 1 = linear), between neighbouring sizes:"
        )
    for pair in args.models:
        mine = [r for r in rows if r.pair == pair]
        if len(mine) < 2:
            continue
        for which, label in (
            ("rwkv", f"RWKV-CLIP {pair[0]}/{pair[1:]}"),
            ("vit", f"ViT-{pair[0]}/{pair[1:]}"),
        ):
            steps = [
                f"{a.size}->{b.size} "
                f"{growth_exponent((a.tokens, b.tokens), (a.per_image(which), b.per_image(which))):.2f}"
                for a, b in zip(mine, mine[1:])
            ]
            if len(mine) > 2:
                a, b = mine[0], mine[-1]
                whole = growth_exponent((a.tokens, b.tokens), (a.per_image(which), b.per_image(which)))
                steps.append(f"overall {a.size}->{b.size} {whole:.2f}")
            print(f"  {label:15s} " + ", ".join(steps))
    if text is not None:
        rwkv, vit = text
        ratios = [v / r for r, v in zip(rwkv, vit)]
        print(
            f"encode_text, batch {args.text_batch} x 77 tokens: RWKV-CLIP "
            f"{args.text_batch / statistics.median(rwkv):.3g} texts/s, ViT-B/32's text transformer "
            f"{args.text_batch / statistics.median(vit):.3g} texts/s, RWKV/ViT "
            f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
        )
    print_goals(rows)


def print_goals(rows: list[Row]) -> None:
    """Issue 44's goals, from this run's rows (those it measured)."""
    by = {(r.pair, r.size): r for r in rows}
    goals = []
    if ("B32", 224) in by:
        ratios = by["B32", 224].ratios()
        goals.append(
            (
                f"B/32 at 224 px >= {GOAL_224}x ViT-B/32",
                statistics.median(ratios) >= GOAL_224,
                f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]",
            )
        )
    if ("B32", 224) in by and ("B32", 448) in by:
        growth = by["B32", 448].per_image("rwkv") / by["B32", 224].per_image("rwkv")
        goals.append(
            (f"B/32 time per image 448 px / 224 px <= {GOAL_GROWTH}", growth <= GOAL_GROWTH, f"{growth:.2f}")
        )
    if ("B16", 1024) in by:
        ratios = by["B16", 1024].ratios()
        goals.append(
            (
                f"B/16 at 1024 px >= {GOAL_1024}x ViT-B/16",
                statistics.median(ratios) >= GOAL_1024,
                f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]",
            )
        )
        peaks = by["B16", 1024].peaks
        if "rwkv" in peaks and "vit" in peaks:
            goals.append(
                (
                    "B/16 peak memory at 1024 px <= ViT-B/16's",
                    peaks["rwkv"] <= peaks["vit"],
                    f"{mib(peaks['rwkv'])} MiB vs {mib(peaks['vit'])} MiB",
                )
            )
    if goals:
        print("issue 44's goals (median round; range in brackets):")
        for what, met, value in goals:
            print(f"  {'met    ' if met else 'NOT met'}  {what}: {value}")


# ------------------------------------------------------------------------------ the WKV alone

# (batch, tokens): B/32 at 224 and 448 px, B/32 at 1024 px, B/16 at 1024 px; 8 heads of 80 (the image tower's)
WKV_CASES = ((16, 49), (16, 196), (4, 1024), (1, 4096))
WKV_HEADS, WKV_HEAD_SIZE = 8, 80


def measure_wkv(args: argparse.Namespace) -> None:
    """The WKV alone, forward only: its inference form (what evaluation runs now) against the autograd form
    (what it ran before, the training form without gradients), us per token and growth in tokens."""
    import torch

    from benchmarks.wkv import DECAY_RANGE, make_inputs
    from src.open_alip.wkv import wkv_chunked_autograd
    from src.open_alip.wkv_inference import wkv_chunked_inference

    where = (
        f"cpu, {torch.get_num_threads()} threads" if args.device == "cpu" else torch.cuda.get_device_name()
    )
    print(
        f"WKV alone, forward only, float32, {WKV_HEADS} heads of {WKV_HEAD_SIZE}, decay logits in "
        f"[{DECAY_RANGE[0]:g}, {DECAY_RANGE[1]:g}], {where}, {args.clock} clock; median of {args.rounds} "
        "rounds, the two forms alternating"
    )
    print(
        "tokens batch  inference form us/token  autograd form us/token  speed-up [rounds]  max|diff|/max|y|"
    )
    found = []
    for batch, tokens in WKV_CASES:
        inputs = make_inputs((batch, tokens, WKV_HEADS * WKV_HEAD_SIZE, WKV_HEADS), args.device)
        with torch.no_grad():
            calls = {
                "inference": partial(wkv_chunked_inference, *inputs),
                "autograd": partial(wkv_chunked_autograd, *inputs),
            }
            times = time_turns(calls, args.rounds, clock_of(args.clock), args.device)
            new, old = (fn() for fn in calls.values())
        per_token = {name: statistics.median(t) / (batch * tokens) * 1e6 for name, t in times.items()}
        speedups = [o / n for n, o in zip(times["inference"], times["autograd"])]
        diff = ((new - old).abs().max() / old.abs().max()).item()
        found.append((tokens, per_token))
        print(
            f"{tokens:>6} {batch:>5}  {per_token['inference']:>23.1f}  {per_token['autograd']:>22.1f}  "
            f"{statistics.median(speedups):>7.2f}x [{min(speedups):.2f}-{max(speedups):.2f}]  {diff:.1e}",
            flush=True,
        )
    for name in ("inference", "autograd"):  # of the time per sequence: per token times tokens
        steps = [
            f"{a}->{b} {growth_exponent((a, b), (pa[name] * a, pb[name] * b)):.2f}"
            for (a, pa), (b, pb) in zip(found, found[1:])
        ]
        print(f"growth exponent in tokens (time per sequence ~ tokens^e), {name} form: " + ", ".join(steps))


# ------------------------------------------------------------------------------ the GPU section


GPU_SIZES = {"B32": (224, 448, 1024), "B16": (224, 1024)}
GPU_BATCH = 64
GPU_IMPLS = ("fla", "bi_triton")


def section_gpu(
    results: Any, budget: Any, device: Any, cpu_test: bool = False, open_clip_dir: Path | None = None
) -> None:
    """benchmarks.gpu's `inference` section: the CPU table's rows on the GPU, bf16 weights, RWKV-CLIP
    with each GPU WKV (fla, bi_triton) against the ViT when open_clip's code is importable there
    (`open_clip` installed, or `open_clip_dir`). With `cpu_test`, the tiny model at two small sizes
    on the chunked WKV (the code path only; no number from it means anything)."""
    import importlib.util

    import torch

    from benchmarks.gpu_report import first_line
    from src.open_alip.wkv import resolve_wkv_impl

    if cpu_test:
        pairs, sizes, impls, batch, dtype = (
            {"tiny": ("RWKV_CLIP_tiny", None, 8)},
            {"tiny": (32, 64)},
            ("chunked",),
            2,
            torch.float32,
        )
    else:
        pairs, sizes, impls, batch, dtype = PAIRS, GPU_SIZES, GPU_IMPLS, GPU_BATCH, torch.bfloat16
    open_clip_model, vit_note = None, None
    if not cpu_test:
        spec = importlib.util.find_spec("open_clip") if open_clip_dir is None else None
        folder = open_clip_dir or (Path(spec.submodule_search_locations[0]) if spec else None)
        if folder is None:
            vit_note = (
                "no ViT rows: open_clip is not installed here (pip install --no-deps open_clip_torch==3.3.0)"
            )
        else:
            open_clip_model = load_open_clip(folder)
    runnable = {}
    for impl in impls:
        try:
            runnable[impl] = resolve_wkv_impl(impl, device)
        except ValueError as exc:
            results.set("inference", **{f"unusable_{impl}": first_line(exc)})
    results.set("inference", precision=str(dtype).removeprefix("torch."), batch=batch)
    if vit_note or cpu_test:
        results.set("inference", note=vit_note or "--cpu-test: the tiny model on the chunked WKV, no ViT")

    def encode_with(model: Any, impl: str, images: Any) -> Any:
        model.set_wkv_impl(impl)
        return model.encode_image(images)

    for pair, (rwkv_name, vit_name, patch) in pairs.items():
        with torch.device(device):  # initialised where they run: seconds less per model than on the CPU
            rwkv = build_rwkv(rwkv_name).to(dtype)
        for size in sizes[pair]:
            n = batch_for(size, patch, batch, batch * 196)
            case = {"model": pair, "px": size, "tokens": tokens_of(size, patch), "batch": n}
            if not budget.allows(5.0):
                case["error"] = "skipped: section time budget spent"
                results.add_case("inference", case)
                continue
            vit = images = None
            try:
                images = image_batch(n, size, dtype, device)
                calls = {impl: partial(encode_with, rwkv, impl, images) for impl in runnable}
                if open_clip_model is not None:
                    with torch.device(device):
                        vit = build_vit(open_clip_model, vit_name, size).to(dtype)
                    calls["vit"] = partial(vit.encode_image, images)
                with torch.inference_mode():
                    times = time_turns(calls, 2 if cpu_test else 5, time.perf_counter, device)
                    for name, call in calls.items():
                        case[f"{name}_img_s"] = round(n / statistics.median(times[name]), 2)
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                            base = torch.cuda.memory_allocated(device)
                            torch.cuda.reset_peak_memory_stats(device)
                            call()
                            case[f"{name}_peak_gb"] = round(
                                (torch.cuda.max_memory_allocated(device) - base) / 1e9, 3
                            )
                if "vit" in times:
                    for impl in runnable:
                        case[f"{impl}_over_vit"] = round(
                            statistics.median(times["vit"]) / statistics.median(times[impl]), 3
                        )
            except Exception as exc:
                case["error"] = f"{type(exc).__name__}: {first_line(exc)}"
            finally:
                vit = images = calls = None
            results.add_case("inference", case)
            print(f"[inference] {case}", flush=True)
        rwkv = None


GPU_COLUMNS = [
    "model",
    "px",
    "tokens",
    "batch",
    "vit_img_s",
    "fla_img_s",
    "bi_triton_img_s",
    "chunked_img_s",
    "fla_over_vit",
    "bi_triton_over_vit",
    "vit_peak_gb",
    "fla_peak_gb",
    "bi_triton_peak_gb",
    "error",
]


# ------------------------------------------------------------------------------ command line


def _csv(kind: Callable[[str], Any], choices: tuple | None = None) -> Callable[[str], list]:
    def parse(value: str) -> list:
        try:
            items = [kind(v.strip()) for v in value.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a comma-separated list") from None
        bad = [v for v in items if choices is not None and v not in choices]
        if not items or bad:
            raise argparse.ArgumentTypeError(f"{value!r}: choose from {', '.join(map(str, choices or ()))}")
        return list(dict.fromkeys(items))

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.inference",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--models",
        type=_csv(str, tuple(PAIRS)),
        default=list(PAIRS),
        help="comma-separated pairs out of B32, B16 (default B32,B16)",
    )
    parser.add_argument(
        "--sizes",
        type=_csv(int),
        default=list(SIZES),
        help="comma-separated image sizes in px (default 224,384,448,640,1024)",
    )
    parser.add_argument("--batch", type=int, default=16, help="images per call, at most (default 16)")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=MAX_TOKENS,
        help=f"patch tokens per call, at most: the batch shrinks for large images (default {MAX_TOKENS})",
    )
    parser.add_argument(
        "--text-batch", type=int, default=64, help="texts per encode_text call; 0 skips text (default 64)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per size (default 3)")
    parser.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (default 0: torch's default)"
    )
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="weights and inputs of both models (default fp32; bf16: the user's choice)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or this process's CPU time (steadier on a shared machine with "
        "--threads 1; default wall)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="default cpu")
    parser.add_argument("--wkv-impl", default="auto", help="RWKV-CLIP's WKV (default auto: chunked on CPU)")
    parser.add_argument(
        "--wkv",
        action="store_true",
        help="only the WKV alone, forward only: its inference form against the autograd form at "
        "49, 196, 1024 and 4096 tokens (no ViT, no open_clip)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile (inductor) both models' encode_image first; the compile is timed apart",
    )
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement (CPU)")
    parser.add_argument(
        "--open-clip", type=Path, help="an open_clip package folder (default: the oracle venv's)"
    )
    parser.add_argument("--_memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.batch < 1 or args.rounds < 1 or args.max_tokens < 1 or args.text_batch < 0 or args.threads < 0:
        parser.error(
            "--batch, --rounds and --max-tokens must be positive, --text-batch and --threads not negative"
        )
    if any(s < 32 for s in args.sizes):
        parser.error("--sizes: each size must be at least 32 px (one B/32 patch)")
    if args.device == "cuda" and args.clock == "cpu":
        parser.error("--clock cpu measures this process's CPU time; on --device cuda use wall")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args._memory_child:
        memory_child(json.loads(args._memory_child))
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda given but no CUDA device is available; use --device cpu", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    from src.open_alip.wkv import resolve_wkv_impl

    try:
        resolve_wkv_impl(args.wkv_impl, args.device)
    except ValueError as exc:
        print(f"error: --wkv-impl {args.wkv_impl}: {exc}", file=sys.stderr)
        return 2
    if args.wkv:
        measure_wkv(args)
        return 0
    folder = args.open_clip or default_open_clip_dir()
    open_clip_model = load_open_clip(folder)
    print(
        f"ViT: open_clip's model code from {folder}; {args.precision}, "
        f"{'cpu, ' + str(torch.get_num_threads()) + ' threads' if args.device == 'cpu' else args.device}",
        flush=True,
    )
    rows = measure_images(args, open_clip_model)
    if args.device == "cpu" and not args.no_memory:
        print("peak memory: one call per size and model, in a fresh process per pair", flush=True)
        for pair in args.models:
            rwkv_name, vit_name, _ = PAIRS[pair]
            mine = [r for r in rows if r.pair == pair]
            peaks = cpu_peaks(
                (rwkv_name, vit_name),
                [(r.size, r.batch) for r in mine],
                args.precision,
                torch.get_num_threads(),
                folder,
            )
            for row in mine:
                row.peaks = {kind: peaks[kind][row.size] for kind in ("rwkv", "vit")}
    text = measure_text(args, open_clip_model) if args.text_batch else None
    print_report(args, rows, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
