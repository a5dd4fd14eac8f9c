"""Benchmark the WKV operator: every implementation that runs on the device, against "chunked".

Times forward+backward at the B/32 shapes (image: B=8, T=49, C=640, H=8; text:
B=8, T=77, C=640, H=10) for each implementation in the same run and prints its time,
its speed relative to "chunked", and its largest difference from "chunked" (forward
and the five gradients, each relative to chunked's largest value); measures the peak
memory of one forward+backward of each; optionally times a full RWKV-CLIP training
step (bf16 autocast, AdamW) in samples/s.

Implementations: "reference" and "chunked" everywhere; "fla" and "fla_chunk" on CUDA
when fla-core imports, and "bi_triton" (our own kernel pair) when triton imports. Under
TRITON_INTERPRET=1 "fla" and "bi_triton" also run on CPU, far too slowly for these
shapes: name them with --impls to include them anyway.

Every implementation is called as the model calls it (`wkv(..., impl=...)`): with
`--dtype bfloat16` the inputs are bf16, as the bf16 linears make them under autocast;
"bi_triton" reads them as they are, the others get float32 copies first.

Memory method: on CUDA, torch.cuda.max_memory_allocated() above the inputs. On CPU,
each implementation runs in a fresh child process with glibc told to serve every
allocation above 16 KiB by mmap (MALLOC_MMAP_THRESHOLD_), so freed tensors leave the
resident set at once; after one warm-up pass the child resets the kernel's
resident-set high-water mark (writing 5 to /proc/self/clear_refs) and reports
VmHWM - VmRSS around the measured pass: the peak of live memory, at page granularity.

    python -m benchmarks.wkv                         # CPU: reference and chunked
    python -m benchmarks.wkv --device cuda --train-step --train-batch 256
    python -m benchmarks.wkv --device cuda --decay-range -20 20   # extreme decay logits
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from src.open_alip.wkv import (
    IMPLEMENTATIONS,
    TRITON_IMPLEMENTATIONS,
    WKV_IMPL_CHOICES,
    available_implementations,
    resolve_wkv_impl,
    wkv,
)

REPO_ROOT = Path(__file__).resolve().parent.parent

BASELINE = "chunked"
SHAPES = {
    "image": (8, 49, 640, 8),
    "text": (8, 77, 640, 10),
}
DECAY_RANGE = (-6.0, 0.0)  # the released models' decay logits
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def make_inputs(
    shape: tuple[int, int, int, int],
    device: str,
    seed: int = 0,
    decay: tuple[float, float] = DECAY_RANGE,
    dtype: torch.dtype = torch.float32,
) -> list[torch.Tensor]:
    batch, time_, channels, heads = shape
    g = torch.Generator().manual_seed(seed)
    r, k, v = (torch.randn(batch, time_, channels, generator=g) for _ in range(3))
    lo, hi = decay
    w = torch.rand(batch, time_, channels, generator=g) * (hi - lo) + lo
    u = torch.randn(heads, channels // heads, generator=g)
    return [t.to(device, dtype).requires_grad_() for t in (r, k, v, w, u)]


def step(impl: str, inputs: list[torch.Tensor]) -> None:
    for t in inputs:
        t.grad = None
    wkv(*inputs, impl=impl).square().sum().backward()


def outputs_and_gradients(impl: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """[y, dr, dk, dv, dw, du] of one forward+backward with a fixed random output weight."""
    for t in inputs:
        t.grad = None
    y = wkv(*inputs, impl=impl)
    weight = torch.randn(y.shape, generator=torch.Generator().manual_seed(1)).to(y.device)
    (y * weight).sum().backward()
    return [y.detach()] + [torch.zeros_like(t) if t.grad is None else t.grad.clone() for t in inputs]


def largest_difference(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[float, str]:
    """The largest of max|got - want| / max|want| over y and the gradients, and which one."""
    worst, name = 0.0, "y"
    for label, a, b in zip(("y", "r", "k", "v", "w", "u"), got, want):
        a, b = a.float(), b.float()
        diff = ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
        if not diff <= worst:  # also catches nan
            worst, name = diff, label
    return worst, name


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_impl(impl: str, inputs: list[torch.Tensor], device: str, repeats: int) -> tuple[float, float]:
    """Median wall time and median process CPU time of one forward+backward."""
    step(impl, inputs)  # warm-up
    sync(device)
    wall, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        step(impl, inputs)
        sync(device)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(impl: str, shape_name: str, dtype_name: str) -> None:
    """Runs in a fresh process; prints the peak extra RSS of one forward+backward in bytes."""
    inputs = make_inputs(SHAPES[shape_name], "cpu", dtype=DTYPES[dtype_name])
    step(impl, inputs)
    for t in inputs:
        t.grad = None
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _proc_status_kib("VmRSS")
    step(impl, inputs)
    print(json.dumps({"peak_bytes": (_proc_status_kib("VmHWM") - before) * 1024}))


def cpu_peak_memory(impl: str, shape_name: str, dtype_name: str) -> int:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "16384"}
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.wkv", "--_memory-child", impl, shape_name, dtype_name],
        env=env,
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]


def cuda_peak_memory(impl: str, shape_name: str, dtype_name: str) -> int:
    inputs = make_inputs(SHAPES[shape_name], "cuda", dtype=DTYPES[dtype_name])
    step(impl, inputs)
    for t in inputs:
        t.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step(impl, inputs)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def train_step_throughput(model_name: str, batch: int, device: str, steps: int, impl: str) -> float:
    """Samples/s of full training steps (bf16 autocast, AdamW, contrastive loss)."""
    from src.open_alip import create_model

    torch.manual_seed(0)
    model = create_model(model_name).to(device).train()
    model.set_wkv_impl(impl)
    size = model.config["input_size"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = torch.randn(batch, 3, size, size, device=device)
    tokens = torch.randint(0, model.config["vocab_size"], (batch, model.config["ctx_len"]), device=device)
    labels = torch.arange(batch, device=device)

    def one() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            image_emb, text_emb, scale = model(images, tokens, normalize=False)
            image_emb = torch.nn.functional.normalize(image_emb.float(), dim=-1)
            text_emb = torch.nn.functional.normalize(text_emb.float(), dim=-1)
            logits = scale * image_emb @ text_emb.T
            loss = (
                torch.nn.functional.cross_entropy(logits, labels)
                + torch.nn.functional.cross_entropy(logits.T, labels)
            ) / 2
        loss.backward()
        optimizer.step()

    one()  # warm-up
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        one()
    sync(device)
    return batch * steps / (time.perf_counter() - start)


def mib(n: int) -> str:
    return f"{n / 2**20:8.1f} MiB"


def default_impls(device: str) -> list[str]:
    """Everything that runs on `device`, except Triton kernels interpreted on CPU (hours at these shapes)."""
    impls = available_implementations(device)
    return [i for i in impls if not (device == "cpu" and i in TRITON_IMPLEMENTATIONS)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run (default cpu)")
    parser.add_argument(
        "--impls", nargs="+", choices=list(IMPLEMENTATIONS),
        help="implementations to compare (default: every one that runs on the device; chunked is always "
        "added)",
    )  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5, help="timed forward+backward passes per case")
    parser.add_argument(
        "--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), help="which shapes"
    )
    parser.add_argument(
        "--decay-range", nargs=2, type=float, default=list(DECAY_RANGE), metavar=("LO", "HI"),
        help=f"decay logits are drawn uniformly from [LO, HI] (default {DECAY_RANGE[0]:g} "
        f"{DECAY_RANGE[1]:g})",
    )  # fmt: skip
    parser.add_argument(
        "--dtype", default="float32", choices=list(DTYPES),
        help="dtype of r, k, v, w, u (bfloat16: as under bf16 autocast; default float32)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--train-step", action="store_true", help="also time full training steps")
    parser.add_argument("--train-model", default="RWKV_CLIP_B32", help="model config for --train-step")
    parser.add_argument("--train-batch", type=int, default=256, help="batch size for --train-step")
    parser.add_argument("--train-steps", type=int, default=5, help="timed steps for --train-step")
    parser.add_argument("--train-impls", nargs="+", default=["auto"], choices=list(WKV_IMPL_CHOICES))
    parser.add_argument("--_memory-child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._memory_child:
        memory_child(*args._memory_child)
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda given but no CUDA device is available; use --device cpu", file=sys.stderr)
        return 2
    if args.repeats < 1 or args.train_batch < 1 or args.train_steps < 1:
        print("error: --repeats, --train-batch and --train-steps must be at least 1", file=sys.stderr)
        return 2
    try:
        impls = [resolve_wkv_impl(i, args.device) for i in (args.impls or default_impls(args.device))]
        train_impls = [resolve_wkv_impl(i, args.device) for i in args.train_impls] if args.train_step else []
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    impls = [BASELINE] + [i for i in dict.fromkeys(impls) if i != BASELINE]
    if args.threads:
        torch.set_num_threads(args.threads)

    device_name = (
        torch.cuda.get_device_name() if args.device == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    )
    lo, hi = args.decay_range
    print(
        f"WKV forward+backward, {args.dtype} inputs, {device_name}, median of {args.repeats}, "
        f"decay logits in [{lo:g}, {hi:g}]"
    )
    print(
        "  speed-up: chunked time / this time; diff: largest |this - chunked| / max|chunked| over y and grads"
    )
    for name in args.shapes:
        shape = SHAPES[name]
        b, t, c, h = shape
        print(f"  {name} B={b} T={t} C={c} H={h}")
        inputs = make_inputs(shape, args.device, decay=(lo, hi), dtype=DTYPES[args.dtype])
        base_out = outputs_and_gradients(BASELINE, inputs)
        base_wall = base_cpu = None
        for impl in impls:
            try:
                if impl != BASELINE:
                    diff, worst = largest_difference(outputs_and_gradients(impl, inputs), base_out)
                wall, cpu = time_impl(impl, inputs, args.device, args.repeats)
            except Exception as exc:  # one failing kernel must not hide the others' numbers
                print(f"    {impl:10s} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            if impl == BASELINE:
                base_wall, base_cpu = wall, cpu
            line = f"    {impl:10s} wall {wall * 1e3:9.2f} ms  speed-up x{base_wall / wall:7.2f}"
            if args.device == "cpu":  # CPU time is steadier than wall time on a shared machine
                line += f"  cpu {cpu * 1e3:9.2f} ms  x{base_cpu / cpu:7.2f}"
            print(line + ("" if impl == BASELINE else f"  diff {diff:.1e} ({worst})"))
    if not args.no_memory:
        how = (
            "torch.cuda.max_memory_allocated above inputs"
            if args.device == "cuda"
            else "peak RSS growth of one pass in a fresh process, mmap-backed malloc"
        )
        print(f"Peak memory of one forward+backward ({how}); ratio: chunked / this")
        measure = cuda_peak_memory if args.device == "cuda" else cpu_peak_memory
        for name in args.shapes:
            peaks = {}
            for impl in impls:
                try:
                    peaks[impl] = measure(impl, name, args.dtype)
                except Exception as exc:
                    print(f"  {name:5s} {impl:10s} failed: {type(exc).__name__}")
            for impl, peak in peaks.items():
                ratio = f"x{peaks[BASELINE] / peak:.2f}" if peak > 0 and BASELINE in peaks else "n/a"
                print(f"  {name:5s} {impl:10s} {mib(peak)}  {ratio}")
    if args.train_step:
        print(f"Training step, {args.train_model}, batch {args.train_batch}, bf16 autocast, AdamW")
        for impl in train_impls:
            rate = train_step_throughput(
                args.train_model, args.train_batch, args.device, args.train_steps, impl
            )
            print(f"  wkv={impl:9s}: {rate:10.4g} samples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
