#!/usr/bin/env python3
"""data2rec: convert image-text pairs into MXNet RecordIO shards (.rec/.idx) for DALI training.

Examples:
  python data2rec.py                                   # ./YFCC15M -> YFCC15M/datarec.rec + datarec.idx
  python data2rec.py YFCC15M/data --output rec/yfcc --shard-size 100000
  python data2rec.py img_folder --output rec/mine                      # img/ + captions/ layout
  python data2rec.py cc3m.tsv --image-column filepath --caption-columns caption --output rec/cc3m
  python data2rec.py shards/ --output rec/laion --num-machines 4 --machine-id 2 --shard-size 50000
  python data2rec.py --verify rec/yfcc --decode

Exit status:
  0    done (or, with --verify, everything checked out)
  1    --verify found a problem or an unfinished conversion; or no record could be written
  2    bad arguments or input, or the output is busy: one line says what to fix
  4    more than --max-skip-fraction of the rows were skipped; every valid row and the
       report are written all the same (rerun with a higher fraction to accept them)
  130  interrupted by Ctrl-C, 143 by SIGTERM: finished shards are kept, rerun the same
       command to resume
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from src.convert import (
    DEFAULT_MAX_SKIP_FRACTION,
    MAX_CAPTIONS,
    MAX_WORKERS_PER_CORE,
    SOURCES,
    VALIDATE_LEVELS,
    ConvertOptions,
    ImageOptions,
    SourceOptions,
    Terminated,
    TooManySkipped,
    convert,
    output_prefix,
    sigterm_as_interrupt,
    verify,
)
from src.errors import UserError

PROG = "data2rec"
# The how-to guide's `python data2rec.py`: the dataset folder the download made, and the names
# dali.py --data-dir YFCC15M --rec-file datarec.rec and the launcher's DATA_ROOT=YFCC15M look for.
DEFAULT_INPUT = Path("YFCC15M")
DEFAULT_NAME = "datarec"


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
                        f"(or one folder of images with .txt captions); none: ./{DEFAULT_INPUT}, written to "
                        f"{DEFAULT_INPUT}/{DEFAULT_NAME}.rec/.idx")
    p.add_argument("--output", "-o", help="output prefix: writes OUT.rec/.idx, or OUT-00000.rec/.idx ... "
                                          "with --shard-size, plus OUT.report.json and OUT.state.json "
                                          "(and OUT.lock while running)")
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
                   help="added to every sample id (ids are the global input position; default 0; "
                        "ids are uint64, so offset + rows must stay below 2^64)")
    g.add_argument("--workers", type=int, default=0, metavar="N",
                   help=f"worker processes (default 0: all usable cores; 1: no subprocesses; "
                        f"at most {MAX_WORKERS_PER_CORE} per usable core)")
    g = p.add_argument_group("images")
    g.add_argument("--validate", default="quick", choices=VALIDATE_LEVELS,
                   help="what a stored image is guaranteed to pass. off: byte checks and header only, no "
                        "decode. quick (default): + a decode by PIL at 1/8 scale (all of the compressed data "
                        "is read), so PIL, the torch loader's decoder, reads every stored JPEG; DALI's CPU "
                        "decoder is more lenient than PIL on every fault we know. full: + a full-size PIL "
                        "decode and a decode by DALI's CPU decoder itself (when DALI is installed). No level "
                        "can test the GPU decoder without a GPU")
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
                                             "(several give up to K captions per record; empty cells are "
                                             "left out); parquet: the token column")
    g.add_argument("--image-root", help="folder that relative manifest image paths are under "
                                        "(default: the manifest's folder)")
    g.add_argument("--caption-dir", help="folder input: tree of .txt captions mirroring the image tree "
                                         "(several captions: STEM.txt, STEM.1.txt, STEM.2.txt, ...)")
    g.add_argument("--max-captions", type=int, default=MAX_CAPTIONS, metavar="K",
                   help=f"records keep every caption of their row, 1 to K of them (default {MAX_CAPTIONS}); "
                        "a row with more is skipped as too_many_captions")
    g = p.add_argument_group("runs")
    g.add_argument("--max-skip-fraction", type=float, default=DEFAULT_MAX_SKIP_FRACTION, metavar="F",
                   help=f"if more than this share of the rows is skipped (default {DEFAULT_MAX_SKIP_FRACTION:g}), "
                        "exit with status 4 after writing every valid row and the report; counted over this "
                        "output (this machine's part of a split, rows converted before a resume included)")
    g.add_argument("--no-resume", dest="resume", action="store_false",
                   help="ignore a previous run's state (default: resume it when the arguments match)")
    g.add_argument("--overwrite", action="store_true", help="replace existing outputs at OUT")
    g.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    g.add_argument("--verify", metavar="OUT", help="re-read the finished shards at OUT and report, and say "
                                                   "whether the conversion finished; no conversion")
    g.add_argument("--decode", action="store_true", help="with --verify: also decode every image")
    return p


class _Out:
    """stdout that survives a full disk or a closed pipe: a failed write is reported once on
    stderr instead of a traceback, and nothing is left to fail again at exit."""

    failed: str | None = None

    def __call__(self, *lines: str) -> None:
        if self.failed:
            return
        try:
            for line in lines:
                print(line)
            sys.stdout.flush()
        except OSError as exc:
            self.failed = exc.strerror or str(exc)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # the exit-time flush then has nowhere to fail
            os.close(devnull)
            _err(f"warning: cannot write to standard output ({self.failed}); the report file has everything")


say = _Out()


def _err(*lines: str) -> None:
    try:
        print(*(f"{PROG}: {line}" if i == 0 else line for i, line in enumerate(lines)), sep="\n", file=sys.stderr)
    except OSError:
        pass


def _fail(message: str, code: int = 2) -> int:
    _err(f"error: {message}")
    return code


def _default_input(args: argparse.Namespace) -> str | None:
    """The guide's `python data2rec.py`: convert ./YFCC15M into YFCC15M/datarec.*; an error text if
    there is no ./YFCC15M."""
    if not DEFAULT_INPUT.is_dir():
        return (f"no INPUT given and there is no ./{DEFAULT_INPUT} folder here to convert; download it first "
                f"(bash data/download_YFCC15M.sh) or pass the files or folders to convert (see --help)")
    args.inputs = [str(DEFAULT_INPUT)]
    args.output = args.output or str(DEFAULT_INPUT / DEFAULT_NAME)
    rec = output_prefix(args.output, args.num_machines, args.machine_id).with_suffix(".rec")
    shown = rec if args.shard_size == 0 else f"{rec.with_suffix('')}-NNNNN.rec"
    say(f"no input given: converting ./{DEFAULT_INPUT} -> {shown}")
    return None


def _check_args(args: argparse.Namespace) -> str | None:
    if args.verify:
        return None
    checks = [
        (args.resize_short >= 0, f"--resize-short {args.resize_short} must be >= 0"),
        (args.quality is None or 1 <= args.quality <= 100, f"--quality {args.quality} must be 1..100"),
        (args.max_pixels >= 0, f"--max-pixels {args.max_pixels} must be >= 0"),
    ]
    problem = next((msg for ok, msg in checks if not ok), None)
    if problem:
        return problem
    if not args.inputs:
        return _default_input(args)
    if not args.output:
        return "--output is required; give a prefix such as rec/yfcc"
    return None


def run_verify(args: argparse.Namespace) -> int:
    result = verify(args.verify, decode=args.decode, progress=args.progress)
    for error in result["errors"][:20]:
        _err(f"  {error}")
    if result["unfinished"]:
        status = "UNFINISHED (see above; rerun the conversion command to finish it)"
    else:
        status = "OK" if result["ok"] else f"FAILED ({len(result['errors'])} problems)"
    counts = ", ".join(f"{k} caption(s): {n}" for k, n in result["records_by_caption_count"].items())
    say(f"verify {args.verify}: {len(result['shards'])} shards, {result['records']} records"
        + (f" ({counts})" if counts else "") + f": {status}")
    return 0 if result["ok"] else 1


def _mass_skip(exc: TooManySkipped) -> int:
    from src.convert.report import Report

    report = exc.report
    rec = Path(report["output"]).name
    written = (f"every valid row is written ({report['written']} records in {rec}*.rec)" if report["written"]
               else "no row was valid, so no record was written")
    _err(f"error: {exc}",
         "  top reasons:", *Report.from_dict(report).reason_lines(3),
         f"  {written} and the report is {report['output']}.report.json; check the input kind, columns and "
         f"files. If these skips are expected, rerun the same command with --max-skip-fraction "
         f"{min(1.0, report['skipped'] / report['seen'] + 0.005):.2f} (nothing is converted again)")
    return exc.exit_code


def _summary(report: dict, args: argparse.Namespace) -> None:
    from src.convert.report import Report

    r = Report.from_dict(report)
    say(f"{report['output']}: {len(report['shards'])} shard(s); {r.caption_counts()}",
        r.summary(), f"report: {report['output']}.report.json")
    if report.get("resumed"):
        say("(nothing to do: this run was already complete)")


def convert_cli(args: argparse.Namespace) -> int:
    opts = ConvertOptions(
        kind=args.format,
        source=SourceOptions(
            image_column=args.image_column,
            caption_columns=tuple(c.strip() for c in (args.caption_columns or "").split(",") if c.strip()),
            image_root=args.image_root,
            caption_dir=args.caption_dir,
        ),
        image=ImageOptions(args.validate, args.resize_short, args.quality, args.max_pixels),
        shard_size=args.shard_size,
        num_machines=args.num_machines,
        machine_id=args.machine_id,
        id_offset=args.id_offset,
        workers=args.workers,
        max_captions=args.max_captions,
        max_skip_fraction=args.max_skip_fraction,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=args.progress,
    )
    if args.validate == "full":
        from src.convert.dali_check import dali_available

        if not dali_available():
            _err("note: DALI is not installed, so --validate full checks each image with PIL only")
    try:
        with sigterm_as_interrupt():
            report = convert(args.inputs, args.output, opts)
    except TooManySkipped as exc:
        _summary(exc.report, args)
        return _mass_skip(exc)
    except UserError as exc:
        return _fail(str(exc), exc.exit_code)
    except OSError as exc:  # disk full, permissions changed mid-run, ...
        where = exc.filename or output_prefix(args.output).parent
        return _fail(f"writing {where}: {exc.strerror or exc}; fix that and rerun the same command to resume")
    except (KeyboardInterrupt, Terminated) as exc:
        name = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
        _fail(f"interrupted by {name}; the finished shards are kept, rerun the same command to resume")
        return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    _summary(report, args)
    units = report.get("units") or {}
    if units.get("this_machine") == 0:
        say(f"machine {args.machine_id} of {args.num_machines} has no input: the input has only "
            f"{units.get('all')} unit(s) (files, or folder slices of 10000 images)")
        return 0
    if report["written"] == 0:
        _err("no record was written; see the skip reasons above")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    problem = _check_args(args)
    if problem:
        return _fail(problem)
    if args.verify:
        return run_verify(args)
    return convert_cli(args)


if __name__ == "__main__":
    sys.exit(main())
