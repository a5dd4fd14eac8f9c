"""What dali.py runs once its arguments are parsed: build the loader train.py would use on the
given shards, run the smoke checks (dataloaders/smoke.py), and report them with the documented
exit status (0 all checks passed, 1 a check failed or a record could not be read or decoded,
2 bad input).

Only the standard library is imported at the top: dali.py imports this module for its parser,
and --help or an argument error should not wait for torch and DALI.
"""

from __future__ import annotations

import argparse
import os
import sys


def max_workers() -> int:
    """More threads or processes than this only add memory and switching (4 per usable core, at least 8)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(8, 4 * cores)


def _build_loader(args: argparse.Namespace):
    from dataloaders.imagenet import build_loader
    from dataloaders.shards import find_rec_file

    data = list(args.data or [])
    if args.rec_file:
        data.append(str(find_rec_file(args.data_dir, args.rec_file)))
    elif args.data_dir:
        data.append(args.data_dir)
    return build_loader(
        data if len(data) > 1 else data[0],
        args.batch_size,
        input_size=args.input_size,
        train=not args.eval,
        backend=args.backend,
        device=args.device,
        num_threads=args.workers,
        seed=args.seed,
        cache_dir=args.cache_dir,
        max_bad_records=args.max_bad_records,
        reader_workers=args.reader_workers,
    )


def _write_grid(path: str, first_batch) -> None:
    from dataloaders.smoke import save_grid
    from src.open_alip import decode

    images, tokens = first_batch
    n = min(16, images.shape[0])
    captions = [decode([int(t) for t in row if t]) for row in tokens[:n].cpu().tolist()]
    save_grid(path, images[:n], captions)
    print(f"wrote {path} ({n} images with their captions)")


def _report(smoke, loader, args: argparse.Namespace) -> int:
    rate = smoke.images_per_second
    threads = max(1, args.workers)
    if smoke.timed_images:
        print(
            f"the loader delivers {rate:.1f} images/s ({smoke.timed_images} images in {args.time_steps} "
            f"batches after the first, timed back to back without the checks), {rate / threads:.1f} per "
            f"{'thread' if args.backend == 'dali' else 'worker'} ({threads})"
        )
    print(f"checked {smoke.images} images in {smoke.batches} batch(es)")
    if args.save_grid and smoke.first_batch is not None:
        _write_grid(args.save_grid, smoke.first_batch)
    if loader.bad_records:
        print(
            f"skipped {loader.bad_records} record(s) that could not be read or decoded (named above)",
            file=sys.stderr,
        )
    if smoke.problems:
        for problem in smoke.problems[:20]:
            print(f"FAILED: {problem}", file=sys.stderr)
        more = len(smoke.problems) - 20
        if more > 0:
            print(f"... and {more} more", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


def run(args: argparse.Namespace, prog: str) -> int:
    """Check the shards `args` (dali.py's parser) name; the exit status. `prog` starts error lines."""
    from tqdm import tqdm

    from dataloaders.base import CorruptRecordError
    from dataloaders.smoke import run_smoke
    from src.errors import UserError, report

    try:
        loader = _build_loader(args)
    except UserError as e:
        return report(prog, e)
    print(
        f"{loader.total_records} records in {len(loader.shardset.shards)} shard(s); rank {loader.rank}/"
        f"{loader.world_size} reads {loader.num_samples} per epoch in {len(loader)} batches; "
        f"backend {loader.backend}, device {loader.device}, {args.workers} workers"
    )
    try:
        with tqdm(total=args.time_steps + args.steps, desc="batches", unit="batch", file=sys.stderr) as bar:
            smoke = run_smoke(loader, args.steps, bar, time_steps=args.time_steps)
    except ImportError as e:
        print(
            f"{prog}: error: {e}; run `make` (python -m src.install), which installs the DALI wheel for this "
            "torch's CUDA version, or use --backend torch",
            file=sys.stderr,
        )
        return 2
    except CorruptRecordError as e:
        print(f"{prog}: FAILED: {e}", file=sys.stderr)
        return 1
    except UserError as e:
        return report(prog, e)
    return _report(smoke, loader, args)
