#!/usr/bin/env python3
"""data2rec: convert image-text pairs into MXNet RecordIO shards (.rec/.idx) for DALI training.

Examples:
  python data2rec.py                                   # ./YFCC15M -> YFCC15M/datarec.rec + datarec.idx
  python data2rec.py YFCC15M/data --output rec/yfcc --shard-size 100000
  python data2rec.py img_folder --output rec/mine                      # img/ + captions/ layout
  python data2rec.py cc3m.tsv --image-column filepath --caption-columns caption --output rec/cc3m
  python data2rec.py shards/ --output rec/laion --num-machines 4 --machine-id 2 --shard-size 50000
  python data2rec.py --verify rec/yfcc --decode
  python data2rec.py --from-hub Kaichengalex/YFCC15M --output rec/yfcc   # download + convert, bounded disk

Exit status:
  0    done (or, with --verify, everything checked out)
  1    --verify found a problem or an unfinished conversion; or no record could be written
  2    bad arguments or input, or the output is busy: one line says what to fix
  3    --from-hub: the hub could not be listed, a shard not downloaded after its retries, or
       a shard that cannot be read (kept for the rerun)
  4    more than --max-skip-fraction of the rows were skipped, or an input file could not be
       read at all; every valid row and the report are written all the same (rerun with a
       higher fraction to accept skips; replace an unreadable file and rerun with --overwrite)
  130  interrupted by Ctrl-C, 143 by SIGTERM: finished shards are kept, rerun the same
       command to resume
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from src.convert import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_SKIP_FRACTION,
    DEFAULT_VALIDATE,
    MAX_CAPTIONS,
    MAX_WORKERS_PER_CORE,
    SOURCES,
    VALIDATE_LEVELS,
    Validate,
    validate_level,
)
from src.convert.cli import DEFAULT_INPUT, DEFAULT_NAME, run
from src.convert.hub_cli import add_arguments as add_hub_arguments
from src.convert.hub_cli import run_from_hub
from src.errors import finite_float
from src.fsutil import DEFAULT_MAX_FILE_BYTES
from src.shard_names import LOCK, REPORT, STATE, shard_names_text

OUT = Path("OUT")  # how the help writes the --output prefix


def _level(name: str) -> Validate:
    """--validate's value as its level (an old name too), or argparse's one-line error."""
    try:
        return validate_level(name)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="data2rec.py",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument(
        "inputs",
        nargs="*",
        metavar="INPUT",
        help="parquet files, WebDataset .tar files, CSV/TSV/JSONL manifests, or folders of them "
        f"(or one folder of images with .txt captions); none: ./{DEFAULT_INPUT}, written to "
        f"{shard_names_text(DEFAULT_INPUT / DEFAULT_NAME, sharded=False)}",
    )
    p.add_argument(
        "--output",
        "-o",
        help=f"output prefix: writes {shard_names_text(OUT, sharded=False)}, or "
        f"{shard_names_text(OUT)} with --shard-size, plus {OUT}{REPORT} and {OUT}{STATE} "
        f"(and {OUT}{LOCK} while running)",
    )
    p.add_argument(
        "--format",
        default="auto",
        choices=["auto", *SOURCES],
        help="input kind (default: detected from the paths)",
    )
    g = p.add_argument_group("sharding and parallelism")
    g.add_argument(
        "--shard-size",
        type=int,
        default=0,
        metavar="N",
        help="records per output shard (default 0: a single OUT.rec)",
    )
    g.add_argument(
        "--num-machines",
        "--num-shards",
        dest="num_machines",
        type=int,
        default=1,
        metavar="N",
        help="split the input units (files; folder slices) over N machines (default 1)",
    )
    g.add_argument(
        "--machine-id",
        "--shard-id",
        dest="machine_id",
        type=int,
        default=0,
        metavar="I",
        help="which part this machine converts, 0..N-1; outputs are named OUT-mIII...",
    )
    g.add_argument(
        "--id-offset",
        type=int,
        default=0,
        metavar="N",
        help="added to every sample id (ids are the global input position; default 0; "
        "ids are uint64, so offset + rows must stay below 2^64)",
    )
    g.add_argument(
        "--workers",
        type=int,
        default=0,
        metavar="N",
        help=f"worker processes (default 0: all usable cores; 1: no subprocesses; "
        f"at most {MAX_WORKERS_PER_CORE} per usable core). Hub parquet of JPEGs at --validate "
        "off or structure needs none: it is converted in the main process",
    )
    g = p.add_argument_group("images")
    g.add_argument(
        "--validate",
        default=DEFAULT_VALIDATE,
        choices=VALIDATE_LEVELS,
        type=_level,
        help="what a stored image is guaranteed to pass. off: byte checks and header only. "
        "structure (default): + every JPEG's markers, tables and scans in order, EOI at the "
        "end, nothing cut off; near the speed of a copy, no decode, and a sequential JPEG's "
        "last scan is not read (the loaders skip and count a record that still fails to "
        "decode). decode (old name: quick): + a decode by "
        "PIL at 1/8 scale (all of the compressed data is read), so PIL, the torch loader's "
        "decoder, reads every stored JPEG; DALI's CPU decoder is more lenient than PIL on "
        "every fault we know. full: + a full-size PIL decode and a decode by DALI's CPU "
        "decoder itself (when DALI is installed). No level can test the GPU decoder without "
        "a GPU",
    )
    g.add_argument(
        "--resize-short",
        type=int,
        default=0,
        metavar="S",
        help="shrink images so the short side is S pixels (never enlarges; re-encodes)",
    )
    g.add_argument(
        "--quality",
        type=int,
        default=None,
        metavar="Q",
        help="re-encode every image as JPEG quality Q (default: JPEGs pass through; "
        "other formats are converted at 95)",
    )
    g.add_argument(
        "--max-pixels",
        type=int,
        default=DEFAULT_MAX_PIXELS,
        metavar="N",
        help=f"skip images with more pixels than this (default {DEFAULT_MAX_PIXELS / 1e6:g}M; 0: no limit)",
    )
    g.add_argument(
        "--max-file-bytes",
        type=int,
        default=DEFAULT_MAX_FILE_BYTES,
        metavar="N",
        help=f"skip image and caption files larger than this (default {DEFAULT_MAX_FILE_BYTES >> 20} MiB; "
        "0: no limit); only regular files are read: a FIFO or device is skipped, never waited on",
    )
    g = p.add_argument_group("captions")
    g.add_argument("--image-column", help="manifest/parquet column with the image (path or bytes)")
    g.add_argument(
        "--caption-columns",
        help="comma-separated manifest columns with captions "
        "(several give up to K captions per record; empty cells are "
        "left out); parquet: the token column",
    )
    g.add_argument(
        "--image-root",
        help="folder that relative manifest image paths are under (default: the manifest's folder)",
    )
    g.add_argument(
        "--caption-dir",
        help="folder input: tree of .txt captions mirroring the image tree "
        "(several captions: STEM.txt, STEM.1.txt, STEM.2.txt, ...)",
    )
    g.add_argument(
        "--max-captions",
        type=int,
        default=MAX_CAPTIONS,
        metavar="K",
        help=f"records keep every caption of their row, 1 to K of them (default {MAX_CAPTIONS}); "
        "a row with more is skipped as too_many_captions",
    )
    g = p.add_argument_group("runs")
    g.add_argument(
        "--max-skip-fraction",
        type=finite_float,
        default=DEFAULT_MAX_SKIP_FRACTION,
        metavar="F",
        help=f"if more than this share of the rows is skipped (default {DEFAULT_MAX_SKIP_FRACTION:g}), "
        "exit with status 4 after writing every valid row and the report; counted over this "
        "output (this machine's part of a split, rows converted before a resume included)",
    )
    g.add_argument(
        "--no-resume",
        dest="resume",
        action="store_false",
        help="ignore a previous run's state (default: resume it when the arguments match)",
    )
    g.add_argument("--overwrite", action="store_true", help="replace existing outputs at OUT")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    g.add_argument(
        "--verify",
        metavar="OUT",
        help="re-read the finished shards at OUT and report, and say "
        "whether the conversion finished; no conversion",
    )
    g.add_argument("--decode", action="store_true", help="with --verify: also decode every image")
    add_hub_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_from_hub(args) if args.from_hub else run(args)


if __name__ == "__main__":
    sys.exit(main())
