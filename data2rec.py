#!/usr/bin/env python3
"""data2rec: convert image-text pairs into MXNet RecordIO shards (.rec/.idx) for DALI training.

Examples:
  python data2rec.py YFCC15M/data --output rec/yfcc --shard-size 100000
  python data2rec.py img_folder --output rec/mine                      # img/ + captions/ layout
  python data2rec.py cc3m.tsv --image-column filepath --caption-columns caption --output rec/cc3m
  python data2rec.py shards/ --output rec/laion --num-machines 4 --machine-id 2 --shard-size 50000
  python data2rec.py --verify rec/yfcc --decode
"""

from __future__ import annotations

import argparse
import sys

from src.convert import (
    SOURCES,
    VALIDATE_LEVELS,
    ConvertOptions,
    ImageOptions,
    SourceOptions,
    convert,
    verify,
)
from src.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="data2rec.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="parquet files, WebDataset .tar files, CSV/TSV/JSONL manifests, or folders of them "
                        "(or one folder of images with .txt captions)")
    p.add_argument("--output", "-o", help="output prefix: writes OUT.rec/.idx, or OUT-00000.rec/.idx ... "
                                          "with --shard-size, plus OUT.report.json and OUT.state.json")
    p.add_argument("--format", default="auto", choices=["auto", *SOURCES],
                   help="input kind (default: detected from the paths)")
    g = p.add_argument_group("sharding and parallelism")
    g.add_argument("--shard-size", type=int, default=0, metavar="N",
                   help="records per output shard (default 0: a single OUT.rec)")
    g.add_argument("--num-machines", "--num-shards", dest="num_machines", type=int, default=1, metavar="N",
                   help="split the input units (files; folder slices) over N machines (default 1)")
    g.add_argument("--machine-id", "--shard-id", dest="machine_id", type=int, default=0, metavar="I",
                   help="which part this machine converts, 0..N-1; outputs are named OUT-mIII...")
    g.add_argument("--id-offset", type=int, default=0, metavar="N",
                   help="added to every sample id (ids are the global input position; default 0)")
    g.add_argument("--workers", type=int, default=0, metavar="N",
                   help="worker processes (default 0: all cores; 1: no subprocesses)")
    g = p.add_argument_group("images")
    g.add_argument("--validate", default="quick", choices=VALIDATE_LEVELS,
                   help="off: byte checks + header only; quick (default): + 1/8-scale decode; full: full decode")
    g.add_argument("--resize-short", type=int, default=0, metavar="S",
                   help="shrink images so the short side is S pixels (never enlarges; re-encodes)")
    g.add_argument("--quality", type=int, default=None, metavar="Q",
                   help="re-encode every image as JPEG quality Q (default: JPEGs pass through; "
                        "other formats are converted at 95)")
    g.add_argument("--max-pixels", type=int, default=100_000_000, metavar="N",
                   help="skip images with more pixels than this (default 100M; 0: no limit)")
    g = p.add_argument_group("captions")
    g.add_argument("--image-column", help="manifest/parquet column with the image (path or bytes)")
    g.add_argument("--caption-columns", help="comma-separated manifest columns with captions "
                                             "(several give K captions per record); parquet: the token column")
    g.add_argument("--image-root", help="folder that relative manifest image paths are under "
                                        "(default: the manifest's folder)")
    g.add_argument("--caption-dir", help="folder input: tree of .txt captions mirroring the image tree")
    g.add_argument("--context-length", type=int, default=77, help="tokens per caption (default 77)")
    g = p.add_argument_group("runs")
    g.add_argument("--no-resume", dest="resume", action="store_false",
                   help="ignore a previous run's state (default: resume it when the arguments match)")
    g.add_argument("--overwrite", action="store_true", help="replace existing outputs at OUT")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    g.add_argument("--verify", metavar="OUT", help="re-read the finished shards at OUT and report; no conversion")
    g.add_argument("--decode", action="store_true", help="with --verify: also decode every image")
    return p


def _fail(message: str) -> int:
    print(f"data2rec: error: {message}", file=sys.stderr)
    return 2


def _check_args(args: argparse.Namespace) -> str | None:
    if args.verify:
        return None
    if not args.inputs:
        return "no INPUT given; pass the files or folders to convert (see --help)"
    if not args.output:
        return "--output is required; give a prefix such as rec/yfcc"
    checks = [
        (args.shard_size >= 0, f"--shard-size {args.shard_size} must be >= 0"),
        (args.num_machines >= 1, f"--num-machines {args.num_machines} must be >= 1"),
        (0 <= args.machine_id < args.num_machines,
         f"--machine-id {args.machine_id} must be between 0 and {args.num_machines - 1}"),
        (args.id_offset >= 0, f"--id-offset {args.id_offset} must be >= 0"),
        (args.workers >= 0, f"--workers {args.workers} must be >= 0"),
        (args.resize_short >= 0, f"--resize-short {args.resize_short} must be >= 0"),
        (args.quality is None or 1 <= args.quality <= 100, f"--quality {args.quality} must be 1..100"),
        (args.max_pixels >= 0, f"--max-pixels {args.max_pixels} must be >= 0"),
        (args.context_length >= 2, f"--context-length {args.context_length} must be >= 2"),
    ]
    return next((msg for ok, msg in checks if not ok), None)


def run_verify(args: argparse.Namespace) -> int:
    result = verify(args.verify, decode=args.decode, progress=args.progress)
    for error in result["errors"][:20]:
        print(f"  {error}", file=sys.stderr)
    status = "OK" if result["ok"] else f"FAILED ({len(result['errors'])} problems)"
    print(f"verify {args.verify}: {len(result['shards'])} shards, {result['records']} records: {status}")
    return 0 if result["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = _check_args(args)
    if problem:
        return _fail(problem)
    if args.verify:
        return run_verify(args)
    opts = ConvertOptions(
        kind=args.format,
        source=SourceOptions(
            image_column=args.image_column,
            caption_columns=tuple(c.strip() for c in (args.caption_columns or "").split(",") if c.strip()),
            image_root=args.image_root,
            caption_dir=args.caption_dir,
        ),
        image=ImageOptions(args.validate, args.resize_short, args.quality, args.max_pixels),
        context_length=args.context_length,
        shard_size=args.shard_size,
        num_machines=args.num_machines,
        machine_id=args.machine_id,
        id_offset=args.id_offset,
        workers=args.workers,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=args.progress,
    )
    try:
        report = convert(args.inputs, args.output, opts)
    except UserError as exc:
        return _fail(str(exc))
    except OSError as exc:  # disk full, permissions changed mid-run, ...
        where = f"{exc.filename}: " if exc.filename else ""
        return _fail(f"{where}{exc.strerror or exc}; fix that and rerun the same command to resume")
    except KeyboardInterrupt:
        return _fail("interrupted; rerun the same command to resume")
    from src.convert.report import Report

    print(f"{report['output']}: {len(report['shards'])} shard(s), "
          f"{report.get('captions_per_record')} caption(s) per record")
    print(Report.from_dict(report).summary())
    print(f"report: {report['output']}.report.json")
    if report.get("resumed"):
        print("(nothing to do: this run was already complete)")
    units = report.get("units") or {}
    if units.get("this_machine") == 0:
        print(f"machine {args.machine_id} of {args.num_machines} has no input: the input has only "
              f"{units.get('all')} unit(s) (files, or folder slices of 10000 images)")
        return 0
    if report["written"] == 0:
        print("data2rec: no record was written; see the skip reasons above", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
