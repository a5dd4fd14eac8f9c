"""Benchmark the WKV operator: chunked fast path against the two-scan reference.

Times forward+backward at the B/32 shapes (image: B=8, T=49, C=640, H=8; text:
B=8, T=77, C=640, H=10) for both implementations in the same run and prints the
ratio; measures the peak memory of one forward+backward of each; optionally times a
full RWKV-CLIP training step (bf16 autocast, AdamW) in samples/s.

Memory method: on CUDA, torch.cuda.max_memory_allocated() above the inputs. On CPU,
each implementation runs in a fresh child process with glibc told to serve every
allocation above 16 KiB by mmap (MALLOC_MMAP_THRESHOLD_), so freed tensors leave the
resident set at once; after one warm-up pass the child resets the kernel's
resident-set high-water mark (writing 5 to /proc/self/clear_refs) and reports
VmHWM - VmRSS around the measured pass: the peak of live memory, at page granularity.

    python -m benchmarks.wkv                         # CPU, both shapes
    python -m benchmarks.wkv --device cuda --train-step --train-batch 256
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

from src.open_alip.wkv import IMPLEMENTATIONS

REPO_ROOT = Path(__file__).resolve().parent.parent

IMPLS = ("reference", "chunked")
SHAPES = {
    "image": (8, 49, 640, 8),
    "text": (8, 77, 640, 10),
}


def make_inputs(shape: tuple[int, int, int, int], device: str, seed: int = 0) -> list[torch.Tensor]:
    batch, time_, channels, heads = shape
    g = torch.Generator().manual_seed(seed)
    r, k, v = (torch.randn(batch, time_, channels, generator=g) for _ in range(3))
    w = torch.rand(batch, time_, channels, generator=g) * 6 - 6  # the released models' decay range
    u = torch.randn(heads, channels // heads, generator=g)
    return [t.to(device).requires_grad_() for t in (r, k, v, w, u)]


def step(impl: str, inputs: list[torch.Tensor]) -> None:
    for t in inputs:
        t.grad = None
    IMPLEMENTATIONS[impl](*inputs).square().sum().backward()


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


def memory_child(impl: str, shape_name: str) -> None:
    """Runs in a fresh process; prints the peak extra RSS of one forward+backward in bytes."""
    inputs = make_inputs(SHAPES[shape_name], "cpu")
    step(impl, inputs)
    for t in inputs:
        t.grad = None
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _proc_status_kib("VmRSS")
    step(impl, inputs)
    print(json.dumps({"peak_bytes": (_proc_status_kib("VmHWM") - before) * 1024}))


def cpu_peak_memory(impl: str, shape_name: str) -> int:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "16384"}
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.wkv", "--_memory-child", impl, shape_name],
        env=env,
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]


def cuda_peak_memory(impl: str, shape_name: str) -> int:
    inputs = make_inputs(SHAPES[shape_name], "cuda")
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
            image_emb, text_emb, scale = model(images, tokens)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to run (default cpu)")
    parser.add_argument("--repeats", type=int, default=5, help="timed forward+backward passes per case")
    parser.add_argument(
        "--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES), help="which shapes"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--train-step", action="store_true", help="also time full training steps")
    parser.add_argument("--train-model", default="RWKV_CLIP_B32", help="model config for --train-step")
    parser.add_argument("--train-batch", type=int, default=256, help="batch size for --train-step")
    parser.add_argument("--train-steps", type=int, default=5, help="timed steps for --train-step")
    parser.add_argument("--train-impls", nargs="+", default=["chunked"], choices=list(IMPLEMENTATIONS))
    parser.add_argument("--_memory-child", nargs=2, help=argparse.SUPPRESS)
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
    if args.threads:
        torch.set_num_threads(args.threads)

    device_name = (
        torch.cuda.get_device_name() if args.device == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    )
    print(f"WKV forward+backward, float32, {device_name}, median of {args.repeats}")
    for name in args.shapes:
        shape = SHAPES[name]
        inputs = make_inputs(shape, args.device)
        (ref, ref_cpu), (fast, fast_cpu) = (time_impl(i, inputs, args.device, args.repeats) for i in IMPLS)
        b, t, c, h = shape
        print(
            f"  {name:5s} B={b} T={t} C={c} H={h}: wall reference {ref * 1e3:9.2f} ms  chunked {fast * 1e3:9.2f} ms"
            f"  speed-up x{ref / fast:.2f}"
        )
        if args.device == "cpu":  # CPU time is steadier than wall time on a shared machine
            print(
                f"  {'':5s} {'':24s} cpu  reference {ref_cpu * 1e3:9.2f} ms  chunked {fast_cpu * 1e3:9.2f} ms"
                f"  speed-up x{ref_cpu / fast_cpu:.2f}"
            )
    if not args.no_memory:
        how = (
            "torch.cuda.max_memory_allocated above inputs"
            if args.device == "cuda"
            else "peak RSS growth of one pass in a fresh process, mmap-backed malloc"
        )
        print(f"Peak memory of one forward+backward ({how})")
        measure = cuda_peak_memory if args.device == "cuda" else cpu_peak_memory
        for name in args.shapes:
            ref, fast = measure("reference", name), measure("chunked", name)
            ratio = f"x{ref / fast:.2f}" if fast > 0 else "n/a"
            print(f"  {name:5s}: reference {mib(ref)}  chunked {mib(fast)}  reference/chunked {ratio}")
    if args.train_step:
        print(f"Training step, {args.train_model}, batch {args.train_batch}, bf16 autocast, AdamW")
        for impl in args.train_impls:
            rate = train_step_throughput(
                args.train_model, args.train_batch, args.device, args.train_steps, impl
            )
            print(f"  wkv={impl:9s}: {rate:10.4g} samples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
