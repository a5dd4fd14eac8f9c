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

from dataloaders.limits import BACKENDS, DEFAULT_MAX_BAD_RECORDS, READER_WORKERS_HELP
from dataloaders.smoke_cli import max_workers, run
from src.errors import flag_of


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Validate the DALI (or fallback) loader on real shards and measure its throughput.",
        epilog="Input shards: --data takes a prefix (data/train -> data/train.rec + .idx), a .rec file, a "
        "folder of *.rec/*.idx, or a quoted glob, and may be given several times. As in the how-to guide, "
        "--data-dir DIR --rec-file NAME reads NAME from DIR (else from the working folder), with its .idx "
        "beside it; --data-dir alone reads every shard in DIR.\n"
        "Exit status: 0 all checks passed, 1 a check failed or a record could not be read or decoded, "
        "2 bad input.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "--data",
        action="append",
        metavar="PATH",
        help="shards to read (prefix, .rec, folder or glob); repeat for more",
    )
    p.add_argument("--data-dir", metavar="DIR", help="folder of the shards (alone: every shard in it)")
    p.add_argument("--rec-file", metavar="NAME", help="the .rec file to read, looked up in --data-dir first")
    p.add_argument("--batch-size", type=int, default=64, metavar="N", help="images per batch (default 64)")
    p.add_argument("--steps", type=int, default=20, metavar="N", help="batches to check (default 20)")
    p.add_argument(
        "--time-steps",
        type=int,
        metavar="N",
        help="batches to time back to back, after the first and before the checks (default: --steps; "
        "0: no timing)",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="auto, cpu, cuda or cuda:N: decode on the GPU (DALI 'mixed') or the CPU; "
        "auto picks the GPU when there is one",
    )
    p.add_argument(
        "--input-size", type=int, default=224, metavar="S", help="image side after crop/resize (default 224)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=4,
        metavar="N",
        help=f"CPU threads (DALI) or worker processes (torch); default 4, at most {max_workers()} here",
    )
    p.add_argument(
        "--eval", action="store_true", help="evaluation transform (resize + centre crop, no shuffle)"
    )
    p.add_argument(
        "--backend", choices=BACKENDS, default=BACKENDS[0], help="dali (default) or the pure-PyTorch fallback"
    )
    p.add_argument("--seed", type=int, default=0, help="shuffle/augmentation seed (default 0)")
    p.add_argument(
        "--save-grid", metavar="FILE.png", help="write a grid of the first batch's images and captions"
    )
    p.add_argument(
        "--max-bad-records",
        type=int,
        default=0,
        metavar="N",
        help="records that cannot be read or decoded to skip before failing (default 0: any one fails "
        f"the check; train.py skips up to {DEFAULT_MAX_BAD_RECORDS})",
    )
    p.add_argument(
        "--reader-workers", type=int, metavar="N", help=READER_WORKERS_HELP + "; as train.py's flag"
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="where to cache the record index (default $RWKV_CLIP_CACHE or ~/.cache/rwkv-clip)",
    )
    args = p.parse_args(argv)
    if not args.data and not args.data_dir and not args.rec_file:
        p.error("no shards given: use --data PATH, or --data-dir DIR [--rec-file NAME]")
    for name in ("batch_size", "steps", "input_size"):
        if getattr(args, name) < 1:
            p.error(f"{flag_of(name)} must be at least 1")
    if args.time_steps is None:
        args.time_steps = args.steps
    elif args.time_steps < 0:
        p.error("--time-steps must be 0 or more")
    if not 0 <= args.workers <= max_workers():
        p.error(f"--workers {args.workers}: use 0 to {max_workers()} (4 per usable CPU core here)")
    if args.max_bad_records < 0:
        p.error("--max-bad-records must be 0 or more")
    if args.reader_workers is not None and args.reader_workers < 0:
        p.error("--reader-workers must be 0 or more")
    if args.data_dir and not os.path.isdir(args.data_dir):
        p.error(f"--data-dir {args.data_dir}: no such folder")
    if args.save_grid:
        parent = os.path.dirname(os.path.abspath(args.save_grid))
        if not os.path.isdir(parent):
            p.error(f"--save-grid {args.save_grid}: folder {parent} does not exist")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run(args, prog=os.path.basename(sys.argv[0]))


if __name__ == "__main__":
    sys.exit(main())
