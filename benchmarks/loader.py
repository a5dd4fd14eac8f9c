#!/usr/bin/env python
"""Images/s of the DALI CPU training pipeline against the PyTorch fallback, same files, same run.

Both loaders read the same shards with the same number of CPU workers (DALI
threads vs DataLoader processes), apply the training transform (random-resized
crop, resize, flip, normalise) and pick captions. Each loader is warmed up once
(libraries loaded), then timed over whole epochs, per-epoch start-up included.
CPU time (this process and its reaped workers) is reported beside wall time, as
it is the steadier figure on a machine shared with other jobs.
Without --data it writes synthetic photo-like JPEGs (YFCC-like size) to a
temporary folder.

  python -m benchmarks.loader                      # synthetic shards
  python -m benchmarks.loader --data /data/rec/    # your shards
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

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

    Each epoch's start-up (DALI pipeline build, DataLoader worker start) is included:
    a training run pays it every epoch too.
    """
    images, cpu0, wall0 = 0, _cpu_seconds(), time.perf_counter()
    for _ in range(epochs):
        for batch, _tokens in loader:
            images += batch.shape[0]
    wall = time.perf_counter() - wall0
    return images / wall, images / (_cpu_seconds() - cpu0), images


def stage_costs(data, input_size: int, batch_size: int, batches: int = 8) -> None:
    """Images per CPU-second of decode and decode+crop+resize, DALI (one thread) vs PIL."""
    import io

    from nvidia.dali import fn, pipeline_def, types
    from PIL import Image

    from dataloaders.shards import load_shards
    from dataloaders.torch_loader import RecordDataset

    shardset = load_shards(data, cache_dir=Path(tempfile.gettempdir()) / "rwkv-clip-bench-cache")
    n = min(shardset.total_records, batch_size * batches)

    def dali_rate(resize: bool, antialias: bool = True) -> float:
        @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, prefetch_queue_depth=1)
        def pipe():
            jpegs, _ = fn.readers.mxnet(path=[str(s.rec) for s in shardset.shards],
                                        index_path=[str(shardset.index_path)])
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                                   random_area=[0.7, 1.0], random_aspect_ratio=[0.8, 1.25])
            if resize:
                images = fn.resize(images, resize_x=input_size, resize_y=input_size, antialias=antialias)
            return images

        p = pipe()
        p.build()
        p.run()
        t = time.process_time()
        for _ in range(n // batch_size):
            p.run()
        return (n // batch_size) * batch_size / (time.process_time() - t)

    payloads = [RecordDataset(shardset, input_size, True).read(i)[1] for i in range(n)]

    def pil_rate(resize: bool) -> float:
        t = time.process_time()
        for b in payloads:
            with Image.open(io.BytesIO(b)) as img:
                img = img.convert("RGB")
                if resize:
                    w, h = img.size
                    img.resize((input_size, input_size), Image.BILINEAR, box=(0, 0, int(w * 0.9), int(h * 0.9)))
        return len(payloads) / (time.process_time() - t)

    print("stage costs, one thread, images per CPU-second (higher is better):")
    print(f"  decode + random crop            DALI {dali_rate(False):7.1f}   PIL {pil_rate(False):7.1f}")
    print(f"  + resize to {input_size:<4d}(antialiased)   DALI {dali_rate(True):7.1f}   PIL {pil_rate(True):7.1f}")
    print(f"  + resize, DALI antialias=False  DALI {dali_rate(True, False):7.1f}")


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
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        data = args.data or synthetic_shards(Path(tmp), args.records)
        common = dict(input_size=args.input_size, train=True, device="cpu", num_threads=args.workers,
                      cache_dir=Path(tmp) / "cache", rank=0, world_size=1)
        wall: dict[str, list[float]] = {"dali": [], "torch": []}
        cpu: dict[str, list[float]] = {"dali": [], "torch": []}
        for backend in wall:  # warm-up: load DALI / fork machinery once, untimed
            warm = iter(build_loader(data, args.batch_size, backend=backend, **common))
            next(warm)
            del warm
        # Alternating runs spread the machine's noise over both loaders.
        for _ in range(args.repeats):
            for backend in wall:
                loader = build_loader(data, args.batch_size, backend=backend, **common)
                rate, per_cpu, n = measure(loader, args.epochs)
                wall[backend].append(rate)
                cpu[backend].append(per_cpu)
                print(f"{backend:>5}: {rate:8.1f} images/s, {per_cpu:8.1f} images per CPU-second "
                      f"({n} images timed)", flush=True)
        print(f"records {loader.total_records}, batch {args.batch_size}, input {args.input_size}, "
              f"workers {args.workers}, epochs {args.epochs}, repeats {args.repeats}")
        for name, table, unit in (("wall", wall, "images/s"), ("cpu", cpu, "images per CPU-second")):
            dali, fallback = (float(np.median(table[b])) for b in ("dali", "torch"))
            print(f"median {unit}: DALI CPU {dali:.1f}, PyTorch fallback {fallback:.1f}; "
                  f"ratio DALI / fallback ({name}): {dali / fallback:.2f}x")
        if args.stages:
            stage_costs(data, args.input_size, args.batch_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
