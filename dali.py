#!/usr/bin/env python
"""Smoke-test the training data loader on real `.rec/.idx` shards before spending GPU hours.

Builds the same loader train.py uses, pulls a few batches, checks shapes, dtypes,
value ranges and caption token ids, prints the loader's throughput, and can save a
grid of the images (de-normalised) with their decoded captions. Exit status: 0 all
checks passed, 1 a check failed (or a record could not be read or decoded), 2 bad input.

Examples:
  python dali.py --data-dir YFCC15M --rec-file datarec.rec
  python dali.py --data /data/yfcc15m_rec/ --steps 50
  python dali.py --data 'shards/part-00*' --device cpu --save-grid grid.png
"""

from __future__ import annotations

import argparse
import os
import sys


def max_workers() -> int:
    """More threads or processes than this only add memory and switching (4 per usable core, at least 8)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(8, 4 * cores)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Validate the DALI (or fallback) loader on real shards and measure its throughput.",
        epilog="Input shards: --data takes a prefix (data/train -> data/train.rec + .idx), a .rec file, a folder "
        "of *.rec/*.idx, or a quoted glob, and may be given several times. As in the how-to guide, "
        "--data-dir DIR --rec-file NAME reads NAME from DIR (else from the working folder), with its .idx "
        "beside it; --data-dir alone reads every shard in DIR.\n"
        "Exit status: 0 all checks passed, 1 a check failed or a record could not be read or decoded, "
        "2 bad input.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--data", action="append", metavar="PATH",
                   help="shards to read (prefix, .rec, folder or glob); repeat for more")
    p.add_argument("--data-dir", metavar="DIR", help="folder of the shards (alone: every shard in it)")
    p.add_argument("--rec-file", metavar="NAME", help="the .rec file to read, looked up in --data-dir first")
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help="images per batch (default 64)")
    p.add_argument("--steps", type=int, default=20, metavar="N", help="batches to check (default 20)")
    p.add_argument("--time-steps", type=int, metavar="N",
                   help="batches to time back to back, after the first and before the checks (default: --steps; "
                        "0: no timing)")
    p.add_argument("--device", default="auto",
                   help="auto, cpu, cuda or cuda:N: decode on the GPU (DALI 'mixed') or the CPU; "
                        "auto picks the GPU when there is one")
    p.add_argument("--input-size", type=int, default=224, metavar="S", help="image side after crop/resize (default 224)")
    p.add_argument("--workers", type=int, default=4, metavar="N",
                   help=f"CPU threads (DALI) or worker processes (torch); default 4, at most {max_workers()} here")
    p.add_argument("--eval", action="store_true", help="evaluation transform (resize + centre crop, no shuffle)")
    p.add_argument("--backend", choices=("dali", "torch"), default="dali",
                   help="dali (default) or the pure-PyTorch fallback")
    p.add_argument("--seed", type=int, default=0, help="shuffle/augmentation seed (default 0)")
    p.add_argument("--save-grid", metavar="FILE.png", help="write a grid of the first batch's images and captions")
    p.add_argument("--max-bad-records", type=int, default=0, metavar="N",
                   help="records that cannot be read or decoded to skip before failing (default 0: any one fails "
                        "the check; train.py skips up to 100)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="where to cache the record index (default $RWKV_CLIP_CACHE or ~/.cache/rwkv-clip)")
    args = p.parse_args(argv)
    if not args.data and not args.data_dir and not args.rec_file:
        p.error("no shards given: use --data PATH, or --data-dir DIR [--rec-file NAME]")
    for name in ("batch_size", "steps", "input_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.time_steps is None:
        args.time_steps = args.steps
    elif args.time_steps < 0:
        p.error("--time-steps must be 0 or more")
    if not 0 <= args.workers <= max_workers():
        p.error(f"--workers {args.workers}: use 0 to {max_workers()} (4 per usable CPU core here)")
    if args.max_bad_records < 0:
        p.error("--max-bad-records must be 0 or more")
    if args.data_dir and not os.path.isdir(args.data_dir):
        p.error(f"--data-dir {args.data_dir}: no such folder")
    if args.save_grid:
        parent = os.path.dirname(os.path.abspath(args.save_grid))
        if not os.path.isdir(parent):
            p.error(f"--save-grid {args.save_grid}: folder {parent} does not exist")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tqdm import tqdm

    from dataloaders.base import CorruptRecordError
    from dataloaders.imagenet import build_loader
    from dataloaders.shards import find_rec_file
    from dataloaders.smoke import run_smoke, save_grid
    from src.errors import UserError, report

    prog = os.path.basename(sys.argv[0])
    try:
        data = list(args.data or [])
        if args.rec_file:
            data.append(str(find_rec_file(args.data_dir, args.rec_file)))
        elif args.data_dir:
            data.append(args.data_dir)
        loader = build_loader(
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
        )
    except UserError as e:
        return report(prog, e)
    print(f"{loader.total_records} records in {len(loader.shardset.shards)} shard(s); rank {loader.rank}/"
          f"{loader.world_size} reads {loader.num_samples} per epoch in {len(loader)} batches; "
          f"backend {loader.backend}, device {loader.device}, {args.workers} workers")
    try:
        with tqdm(total=args.time_steps + args.steps, desc="batches", unit="batch", file=sys.stderr) as bar:
            smoke = run_smoke(loader, args.steps, bar, time_steps=args.time_steps)
    except ImportError as e:
        print(f"{prog}: error: {e}; run `make` (python -m src.install), which installs the DALI wheel for this "
              "torch's CUDA version, or use --backend torch", file=sys.stderr)
        return 2
    except CorruptRecordError as e:
        print(f"{prog}: FAILED: {e}", file=sys.stderr)
        return 1
    except UserError as e:
        return report(prog, e)
    rate = smoke.images_per_second
    threads = max(1, args.workers)
    if smoke.timed_images:
        print(f"the loader delivers {rate:.1f} images/s ({smoke.timed_images} images in {args.time_steps} batches "
              f"after the first, timed back to back without the checks), {rate / threads:.1f} per "
              f"{'thread' if args.backend == 'dali' else 'worker'} ({threads})")
    print(f"checked {smoke.images} images in {smoke.batches} batch(es)")
    if args.save_grid and smoke.first_batch is not None:
        from src.open_alip import decode

        images, tokens = smoke.first_batch
        n = min(16, images.shape[0])
        captions = [decode([int(t) for t in row if t]) for row in tokens[:n].cpu().tolist()]
        save_grid(args.save_grid, images[:n], captions)
        print(f"wrote {args.save_grid} ({n} images with their captions)")
    if loader.bad_records:
        print(f"skipped {loader.bad_records} record(s) that could not be read or decoded (named above)",
              file=sys.stderr)
    if smoke.problems:
        for problem in smoke.problems[:20]:
            print(f"FAILED: {problem}", file=sys.stderr)
        more = len(smoke.problems) - 20
        if more > 0:
            print(f"... and {more} more", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
