#!/usr/bin/env python
"""Images/s of the DALI CPU training pipeline against the PyTorch fallback, same files, same run.

Both loaders read the same shards with the same number of CPU workers (DALI threads vs
DataLoader processes), apply the training transform (random-resized crop, resize, flip,
normalise) and pick captions. The DALI loader runs twice: as the CPU backend runs it
(DALI decodes only each crop's window, torch resizes it) and as the `mixed` pipeline
runs (whole-image decodes, DALI's resize), so the CPU pipeline's gain comes from the
same run. `--stages` times each step of the transform on one thread. Each loader's first
batch pays for its start-up and is not timed (as in dali.py); the rest of `--epochs`
whole epochs is, epoch changes included. CPU time (this process and its reaped workers)
is reported beside wall time, as it is the steadier figure on a machine shared with
other jobs. `--vs-dali-py` also runs `dali.py` on the same shards with the same settings
and prints its rate beside this one's: the two must agree. Without --data it writes
synthetic photo-like JPEGs (YFCC-like size) to a temporary folder (or to
--synthetic-out, kept).

  python -m benchmarks.loader                      # synthetic shards
  python -m benchmarks.loader --data /data/rec/    # your shards
  python -m benchmarks.loader --vs-dali-py         # and dali.py's figure on the same shards
  python -m benchmarks.loader --reader             # the record reader alone, beside a busy Python thread

`--reader` times what feeds DALI (dataloaders/read_ahead.py: pread, label check, header
parse, crop draws) without decoding: the crop draws per sample against per batch, and the
records/s delivered to the training process by a reader thread (the old way) and by reader
processes, each alone and beside a Python-heavy thread (a stand-in for the training loop,
which needs the GIL), with how much of its speed that thread keeps.
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

import cv2
import numpy as np
import torch

from dataloaders.imagenet import build_loader
from src.recordio import IRHeader, MXIndexedRecordIO, pack


def synthetic_shards(folder: Path, records: int, shards: int = 2, size: tuple[int, int] = (500, 375)) -> Path:
    """Smooth random colour fields plus grain: JPEGs of roughly photo-like size (~30-60 KB)."""
    rng = np.random.default_rng(0)
    w, h = size
    per = -(-records // shards)
    label = np.zeros(3 * 77, np.float32)
    label[[0, 77, 154]] = 49406
    label[[2, 79, 156]] = 49407
    label[[1, 78, 155]] = 320
    for s in range(shards):
        with MXIndexedRecordIO(folder / f"bench-{s}.idx", folder / f"bench-{s}.rec", "w") as rec:
            for i in range(s * per, min(records, (s + 1) * per)):
                low = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
                img = cv2.resize(low, (w, h), interpolation=cv2.INTER_CUBIC)
                img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
                jpg = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
                rec.write_idx(i, pack(IRHeader(0, label, i, 0), jpg))
    return folder


def _cpu_seconds() -> float:
    # DALI decodes on threads of this process, the fallback in worker processes; those are
    # reaped at each epoch's end, so RUSAGE_CHILDREN holds their time once the epoch is over.
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def measure(loader, epochs: int) -> tuple[float, float, int]:
    """(images/s of wall time, images per CPU second, images) over `epochs` whole epochs.

    The clock starts after the first batch, which pays for building the pipeline or
    starting the workers once per run; later epochs' start-up (a pipeline reset, new
    DataLoader workers) is timed, as a training run pays it every epoch.
    """
    it = iter(loader)
    next(it)
    images, cpu0, wall0 = 0, _cpu_seconds(), time.perf_counter()
    for epoch in range(epochs):
        for batch, _tokens in it if epoch == 0 else loader:
            images += batch.shape[0]
    wall = time.perf_counter() - wall0
    reader = getattr(loader, "reader", None)
    if reader is not None:  # the DALI loader's reader processes: reaped, so their CPU time counts
        reader.close()
    return images / wall, images / (_cpu_seconds() - cpu0), images


def dali_py_rate(data, args: argparse.Namespace, steps: int) -> float:
    """The images/s dali.py prints for the same shards and settings (a process of its own)."""
    cmd = [
        sys.executable,
        "dali.py",
        "--data",
        str(data),
        "--batch-size",
        str(args.batch_size),
        "--input-size",
        str(args.input_size),
        "--workers",
        str(args.workers),
        "--steps",
        "1",
        "--time-steps",
        str(steps),
        "--device",
        "cpu",
        "--cache-dir",
        str(Path(tempfile.gettempdir()) / "rwkv-clip-bench-cache"),
    ]
    ran = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    found = re.search(r"delivers ([0-9.]+) images/s", ran.stdout)
    if ran.returncode or not found:
        raise RuntimeError(f"dali.py failed ({ran.returncode}): {ran.stderr[-500:]}")
    return float(found.group(1))


def stage_costs(data, input_size: int, batch_size: int, batches: int = 8, repeats: int = 3) -> None:
    """Images per CPU-second of each step of the training transform, DALI (one thread) vs PIL.

    Each image gets its crop box as the loaders draw it (src/open_alip/crops.py), and the DALI
    rows cut it out with the loader's own code (`DaliLoader._crops`): a whole decode and a slice
    (the `mixed` way, resized by DALI), or the window decode (`fn.decoders.image_slice`, the CPU
    way, resized by torch: dataloaders/resize.py). Steps are timed in turn, `repeats` times;
    medians are printed.
    """
    import io

    from nvidia.dali import fn, pipeline_def, types
    from PIL import Image

    from dataloaders.resize import resize_crop, resize_flip_normalize
    from dataloaders.torch_loader import RecordDataset, normalize_pixels
    from src.open_alip.constants import CLIP_MEAN, CLIP_STD
    from src.open_alip.crops import crops_and_flips
    from src.open_alip.transform import resize_box_pil

    cache = Path(tempfile.gettempdir()) / "rwkv-clip-bench-cache"
    loader = build_loader(
        data,
        batch_size,
        input_size=input_size,
        train=True,
        device="cpu",
        cache_dir=cache,
        rank=0,
        world_size=1,
    )
    reader = RecordDataset(loader.shardset, input_size, True)  # the records, read once up front
    n = min(loader.shardset.total_records, batch_size * batches) // batch_size * batch_size
    payloads = [reader.read(i)[1] for i in range(n)]
    sizes = [Image.open(io.BytesIO(p)).size for p in payloads]
    widths, heights = np.array([w for w, _ in sizes]), np.array([h for _, h in sizes])
    boxes, mirror = crops_and_flips(widths, heights, np.arange(n) * 7919 + 1)
    extent = np.stack([heights, widths], axis=1).astype(np.float64)
    starts = (boxes[:, [1, 0]] / extent).astype(np.float32)
    ends = (boxes[:, [3, 2]] / extent).astype(np.float32)
    feeds = [
        (
            [np.frombuffer(p, np.uint8) for p in payloads[i : i + batch_size]],
            list(starts[i : i + batch_size]),
            list(ends[i : i + batch_size]),
            list(mirror[i : i + batch_size].astype(np.int32)),
        )
        for i in range(0, n, batch_size)
    ]
    mean, std = [m * 255 for m in CLIP_MEAN], [s * 255 for s in CLIP_STD]

    def dali_step(step: str):
        state = {"at": 0}
        inputs = 4 if step == "full+normalise" else 1 if step == "decode" else 3  # what the step uses
        in_torch = step.startswith("window+")  # DALI hands over the window, torch resizes it

        def source():
            feed = feeds[state["at"] % len(feeds)]
            state["at"] += 1
            return feed[:inputs]

        @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, prefetch_queue_depth=1)
        def pipe():
            fed = fn.external_source(
                source=source,
                num_outputs=inputs,
                batch=True,
                dtype=[types.UINT8, types.FLOAT, types.FLOAT, types.INT32][:inputs],
            )
            jpegs, start, end, flip = (list(fed) + [None] * 3)[:4]
            if step == "decode":
                return fn.decoders.image(jpegs, device="cpu", adjust_orientation=False)
            loader.roi_decode = step.startswith("window")
            images = loader._crops(jpegs, start, end)
            if step.startswith("full"):
                images = fn.resize(
                    images, resize_x=input_size, resize_y=input_size, interp_type=types.INTERP_LINEAR
                )
            if step == "full+normalise":
                images = fn.crop_mirror_normalize(
                    images, dtype=types.FLOAT, output_layout="CHW", mean=mean, std=std, mirror=flip
                )
            return images

        p = pipe()
        p.build()
        p.run()  # untimed: the first run allocates

        def run() -> float:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # one thread, as the DALI steps (resize_flip_normalize does so too)
            t = time.process_time()
            for b in range(len(feeds)):
                (out,) = p.run()
                if in_torch:
                    crops = [np.asarray(out[i]) for i in range(len(out))]
                    if step == "window+resize":
                        for crop in crops:
                            resize_crop(crop, input_size)
                    else:
                        resize_flip_normalize(
                            crops, mirror[b * batch_size : (b + 1) * batch_size], input_size
                        )
            rate = n / (time.process_time() - t)
            torch.set_num_threads(threads)
            return rate

        return run

    def pil_step(step: str):
        def run() -> float:
            t = time.process_time()
            for b, box, flip in zip(payloads, boxes.tolist(), mirror.tolist()):
                with Image.open(io.BytesIO(b)) as img:
                    img = img.convert("RGB")
                if step != "decode":
                    img = resize_box_pil(img, input_size, tuple(box), flip)
                if step.endswith("normalise"):  # as dataloaders/torch_loader.py does
                    normalize_pixels(img)
            return n / (time.process_time() - t)

        return run

    rows = [  # (label, DALI step, PIL step or None)
        ("decode the whole image", "decode", "decode"),
        ("decode the crop's window only", "window", None),
        (f"whole decode + crop, DALI's resize to {input_size}", "full", "resize"),
        ("window decode, torch's resize (the CPU loader)", "window+resize", None),
        ("+ flip, normalise: the mixed way, on the CPU", "full+normalise", "resize+normalise"),
        ("+ flip, normalise: the CPU loader", "window+normalise", None),
    ]
    timers = [(dali_step(d), pil_step(q) if q else None) for _, d, q in rows]
    rates: list[tuple[list[float], list[float]]] = [([], []) for _ in rows]
    for _ in range(repeats):
        for (dali, pil), (dali_rates, pil_rates) in zip(timers, rates):
            dali_rates.append(dali())
            if pil:
                pil_rates.append(pil())
    print(
        f"stage costs over {n} images with the loaders' crop boxes, one thread, median images per CPU-second "
        f"of {repeats} (higher is better):"
    )
    for (label, _, _), (dali_rates, pil_rates) in zip(rows, rates):
        pil = f"   PIL {np.median(pil_rates):7.1f}" if pil_rates else ""
        print(f"  {label:46s} DALI {np.median(dali_rates):7.1f}{pil}")
    loader.reader.close()


def _spin(stop: threading.Event, count: list[int]) -> None:
    """Pure-Python work that needs the GIL, as a training loop's Python side does."""
    while not stop.is_set():
        sum(i * i for i in range(200))
        count[0] += 1


def reader_rate(
    data, cache: Path, workers: int, batch_size: int, records: int, busy: bool
) -> tuple[float, float]:
    """(records/s the reader delivers, busy-thread rounds/s) for `records` records in random order."""
    from dataloaders.read_ahead import BatchReader
    from dataloaders.shards import load_shards

    shardset = load_shards(data, cache_dir=cache)
    rng = np.random.default_rng(0)
    total = shardset.total_records
    order = np.concatenate([rng.permutation(total) for _ in range(-(-records // total) + 1)])
    seeds = rng.integers(0, 2**63 - 1, len(order))
    batches = [(order[i : i + batch_size], seeds[i : i + batch_size]) for i in range(0, records, batch_size)]
    reader = BatchReader(shardset, workers)
    first = reader.submit(*batches[0], True)  # start the workers, untimed
    first.result()
    reader.release(first)
    stop, count = threading.Event(), [0]
    spinner = threading.Thread(target=_spin, args=(stop, count), daemon=True)
    if busy:
        spinner.start()
    pending: deque = deque()
    start, delivered = time.perf_counter(), 0

    def take() -> int:
        handle = pending.popleft()
        n = len(handle.result().payloads)
        reader.release(handle)
        return n

    for batch in batches:  # the loader's read-ahead: a batch per worker plus one in flight
        pending.append(reader.submit(*batch, True))
        if len(pending) > max(2, workers + 1):
            delivered += take()
    while pending:
        delivered += take()
    elapsed = time.perf_counter() - start
    stop.set()
    if busy:
        spinner.join()
    reader.close()
    return delivered / elapsed, count[0] / elapsed


def crop_draw_costs(batch_size: int, batches: int = 20) -> tuple[float, float]:
    """(us per sample with a Generator per sample (the earlier way), us per sample drawn per batch)."""
    from src.open_alip.constants import TRAIN_AREA, TRAIN_ASPECT, TRAIN_CROP_ATTEMPTS
    from src.open_alip.crops import crops_and_flips

    def generator_draw(width: int, height: int, seed: int) -> None:
        """The earlier way: a numpy Generator per sample, the same crop rule."""
        g = np.random.default_rng(seed)
        lo, hi = np.log(TRAIN_ASPECT[0]), np.log(TRAIN_ASPECT[1])
        for _ in range(TRAIN_CROP_ATTEMPTS):
            target = width * height * g.uniform(*TRAIN_AREA)
            aspect = np.exp(g.uniform(lo, hi))
            w, h = round(np.sqrt(target * aspect)), round(np.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                g.integers(0, width - w + 1), g.integers(0, height - h + 1)
                break
        g.random()

    rng = np.random.default_rng(0)
    n = batch_size * batches
    widths, heights = rng.integers(400, 640, n), rng.integers(300, 480, n)
    seeds = rng.integers(0, 2**63 - 1, n)
    start = time.perf_counter()
    for w, h, seed in zip(widths.tolist(), heights.tolist(), seeds.tolist()):
        generator_draw(w, h, seed)
    per_sample = (time.perf_counter() - start) / n * 1e6
    start = time.perf_counter()
    for i in range(0, n, batch_size):
        crops_and_flips(widths[i : i + batch_size], heights[i : i + batch_size], seeds[i : i + batch_size])
    return per_sample, (time.perf_counter() - start) / n * 1e6


def reader_report(data, cache: Path, args: argparse.Namespace) -> None:
    old, new = crop_draw_costs(args.batch_size)
    print(
        f"crop draws: {old:.1f} us/sample with a Generator per sample, {new:.1f} us/sample drawn per batch "
        f"of {args.batch_size}; ratio {old / new:.1f}x"
    )
    stop, count = threading.Event(), [0]
    spinner = threading.Thread(target=_spin, args=(stop, count), daemon=True)
    start = time.perf_counter()
    spinner.start()
    time.sleep(2.0)
    stop.set()
    spinner.join()
    alone = count[0] / (time.perf_counter() - start)
    rates: dict[tuple[int, bool], list[float]] = {}
    kept: dict[int, list[float]] = {}
    ways = (0, args.reader_workers)
    for _ in range(args.repeats):
        for workers in ways:
            for busy in (False, True):
                rate, spins = reader_rate(data, cache, workers, args.batch_size, args.reader_records, busy)
                rates.setdefault((workers, busy), []).append(rate)
                note = ""
                if busy:
                    kept.setdefault(workers, []).append(spins / alone)
                    note = f", the busy thread keeps {spins / alone:.0%} of its speed"
                name = "a thread" if not workers else f"{workers} processes"
                print(
                    f"reader in {name:>11}, {'beside a busy thread' if busy else 'alone':>20}: "
                    f"{rate:9,.0f} records/s{note}",
                    flush=True,
                )
    med = {k: float(np.median(v)) for k, v in rates.items()}
    w = args.reader_workers
    print(
        f"median records/s beside a busy Python thread: in a thread {med[(0, True)]:,.0f} (keeps "
        f"{np.median(kept[0]):.0%}), in {w} processes {med[(w, True)]:,.0f} (keeps "
        f"{np.median(kept[w]):.0%}); ratio processes / thread: {med[(w, True)] / med[(0, True)]:.1f}x; "
        f"alone: {med[(0, False)]:,.0f} and {med[(w, False)]:,.0f}; goal >= 12,000 beside it (batch "
        f"{args.batch_size}, {args.reader_records} records per run)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--data", help="shards to read (prefix, folder, glob); default: synthetic")
    p.add_argument("--records", type=int, default=1024, help="synthetic records to write (default 1024)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--input-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2, help="DALI threads = DataLoader worker processes")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="alternate the two loaders this many times")
    p.add_argument("--stages", action="store_true", help="also time decode and resize alone, DALI vs PIL")
    p.add_argument(
        "--vs-dali-py",
        action="store_true",
        help="also run dali.py on the same shards (same batch, workers, images) and compare its rate",
    )
    p.add_argument("--synthetic-out", metavar="DIR", help="write the synthetic shards here and keep them")
    p.add_argument(
        "--reader",
        action="store_true",
        help="time only the record reader (no decoding), in a thread vs processes, alone and beside a busy "
        "thread",
    )
    p.add_argument("--reader-workers", type=int, default=2, help="reader processes for --reader (default 2)")
    p.add_argument(
        "--reader-records", type=int, default=20000, help="records read per --reader run (default 20000)"
    )
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        if args.data:
            data = args.data
        else:
            out = Path(args.synthetic_out or tmp)
            out.mkdir(parents=True, exist_ok=True)
            data = synthetic_shards(out, args.records)
        if args.reader:
            reader_report(data, Path(tmp) / "cache", args)
            return 0
        common = dict(
            input_size=args.input_size,
            train=True,
            device="cpu",
            num_threads=args.workers,
            cache_dir=Path(tmp) / "cache",
            rank=0,
            world_size=1,
        )

        def make(name: str):
            """dali: the CPU pipeline (window decodes, torch resizes); dali-full: whole decodes and
            DALI's resize, as `mixed` does."""
            loader = build_loader(
                data, args.batch_size, backend="torch" if name == "torch" else "dali", **common
            )
            if name == "dali-full":
                loader.roi_decode = False
            return loader

        names = ("dali", "dali-full", "torch")
        wall: dict[str, list[float]] = {name: [] for name in names}
        cpu: dict[str, list[float]] = {name: [] for name in names}
        for backend in ("dali", "torch"):  # warm-up: load DALI / fork machinery once, untimed
            warm = iter(make(backend))
            next(warm)
            del warm
        shape = build_loader(data, args.batch_size, **common)
        # Alternating runs spread the machine's noise over the loaders.
        cli: list[float] = []
        for _ in range(args.repeats):
            for name in names:
                loader = make(name)
                rate, per_cpu, n = measure(loader, args.epochs)
                wall[name].append(rate)
                cpu[name].append(per_cpu)
                print(
                    f"{name:>9}: {rate:8.1f} images/s, {per_cpu:8.1f} images per CPU-second "
                    f"({n} images timed)",
                    flush=True,
                )
                del loader
            if args.vs_dali_py:
                # dali.py times the batches after its first: the same images this run times.
                cli.append(dali_py_rate(data, args, args.epochs * len(shape) - 1))
                print(
                    f"dali.py: {cli[-1]:8.1f} images/s (its own process, same shards and settings)",
                    flush=True,
                )
        print(
            f"records {shape.total_records}, batch {args.batch_size}, input {args.input_size}, "
            f"workers {args.workers}, epochs {args.epochs}, repeats {args.repeats}"
        )
        for name, table, unit in (("wall", wall, "images/s"), ("cpu", cpu, "images per CPU-second")):
            dali, full, fallback = (float(np.median(table[b])) for b in names)
            print(
                f"median {unit}: DALI CPU {dali:.1f}, PyTorch fallback {fallback:.1f}; "
                f"ratio DALI / fallback ({name}): {dali / fallback:.2f}x; the mixed way on the CPU (whole "
                f"decodes, DALI's resize) {full:.1f}, {full / fallback:.2f}x (the CPU pipeline gains "
                f"{dali / full:.2f}x)"
            )
        if cli:
            bench = float(np.median(wall["dali"]))
            print(
                f"median images/s: dali.py {np.median(cli):.1f}, this benchmark's DALI {bench:.1f}; "
                f"ratio dali.py / benchmark: {np.median(cli) / bench:.2f}"
            )
        if args.stages:
            stage_costs(data, args.input_size, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
