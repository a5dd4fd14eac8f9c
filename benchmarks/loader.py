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

  python benchmarks/loader.py                      # synthetic shards
  python benchmarks/loader.py --data /data/rec/    # your shards
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from dataloaders.imagenet import build_loader  # noqa: E402
from src.recordio import IRHeader, MXIndexedRecordIO, pack  # noqa: E402


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="shards to read (prefix, folder, glob); default: synthetic")
    p.add_argument("--records", type=int, default=1024, help="synthetic records to write (default 1024)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--input-size", type=int, default=224)
    p.add_argument("--workers", type=int, default=2, help="DALI threads = DataLoader worker processes")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="alternate the two loaders this many times")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
