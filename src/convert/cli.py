"""What data2rec.py runs once its arguments are parsed: the argument checks, the guide's default
input, the conversion or the verification, and the lines that report them (a summary on
stdout; errors, one line each, on stderr) with the documented exit status."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from src.errors import UserError
from src.fsutil import printable
from src.shard_names import DEFAULT_DATASET as DEFAULT_INPUT
from src.shard_names import DEFAULT_OUTPUT_NAME as DEFAULT_NAME
from src.shard_names import REC, REPORT, shard_names_text, side_file

from .images import ImageOptions
from .pipeline import ConvertOptions, TooManySkipped, UnreadableInputs, convert, output_prefix
from .processes import Terminated, sigterm_as_interrupt
from .sources import SourceOptions
from .verify import verify

PROG = "data2rec"


class _Out:
    """stdout that survives a full disk or a closed pipe: a failed write is reported once on
    stderr instead of a traceback, and nothing is left to fail again at exit."""

    failed: str | None = None

    def __call__(self, *lines: str) -> None:
        if self.failed:
            return
        try:
            for line in lines:
                print(printable(line))
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
        print(
            *(printable(f"{PROG}: {line}" if i == 0 else line) for i, line in enumerate(lines)),
            sep="\n",
            file=sys.stderr,
        )
    except OSError:
        pass


def _fail(message: str, code: int = 2) -> int:
    _err(f"error: {message}")
    return code


def _default_input(args: argparse.Namespace) -> str | None:
    """The guide's `python data2rec.py`: convert ./YFCC15M into YFCC15M/datarec.*; an error text if
    there is no ./YFCC15M."""
    if not DEFAULT_INPUT.is_dir():
        return (
            f"no INPUT given and there is no ./{DEFAULT_INPUT} folder here to convert; download it first "
            f"(bash data/download_YFCC15M.sh) or pass the files or folders to convert (see --help)"
        )
    args.inputs = [str(DEFAULT_INPUT)]
    args.output = args.output or str(DEFAULT_INPUT / DEFAULT_NAME)
    prefix = output_prefix(args.output, args.num_machines, args.machine_id)
    shown = shard_names_text(prefix, args.shard_size > 0)
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
    for note in result["notes"]:
        _err(f"note: {note}")
    if result["unfinished"]:
        status = "UNFINISHED (see above; rerun the conversion command to finish it)"
    else:
        status = "OK" if result["ok"] else f"FAILED ({len(result['errors'])} problems)"
    counts = ", ".join(f"{k} caption(s): {n}" for k, n in result["records_by_caption_count"].items())
    say(
        f"verify {args.verify}: {len(result['shards'])} shards, {result['records']} records"
        + (f" ({counts})" if counts else "")
        + f": {status}"
    )
    return 0 if result["ok"] else 1


def _mass_skip(exc: TooManySkipped) -> int:
    from src.convert.report import Report

    report = exc.report
    rec = Path(report["output"]).name
    written = (
        f"every valid row is written ({report['written']} records in {rec}*{REC})"
        if report["written"]
        else "no row was valid, so no record was written"
    )
    _err(
        f"error: {exc}",
        "  top reasons:",
        *Report.from_dict(report).reason_lines(3),
        f"  {written} and the report is {side_file(Path(report['output']), REPORT)}; check the input kind, "
        "columns and files. If these skips are expected, rerun the same command with --max-skip-fraction "
        f"{min(1.0, report['skipped'] / report['seen'] + 0.005):.2f} (nothing is converted again)",
    )
    return exc.exit_code


def _summary(report: dict, args: argparse.Namespace) -> None:
    from src.convert.report import Report

    r = Report.from_dict(report)
    say(
        f"{report['output']}: {len(report['shards'])} shard(s); {r.caption_counts()}",
        r.summary(),
        f"report: {side_file(Path(report['output']), REPORT)}",
    )
    if report.get("resumed"):
        say("(nothing to do: this run was already complete)")


def convert_options(args: argparse.Namespace) -> ConvertOptions:
    """data2rec's parsed flags as the pipeline's options (also those of --from-hub)."""
    return ConvertOptions(
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
        max_file_bytes=args.max_file_bytes,
        max_skip_fraction=args.max_skip_fraction,
        resume=args.resume,
        overwrite=args.overwrite,
        progress=args.progress,
    )


def report_or_status(args: argparse.Namespace, start: Callable[[], dict], kept: str) -> dict | int:
    """`start()`'s report, or the exit status after its failure is said in one line (also for
    --from-hub): too many skips, a user error, a write error, or an interruption (the `kept`
    shards stay for the rerun)."""
    try:
        with sigterm_as_interrupt():
            return start()
    except TooManySkipped as exc:
        _summary(exc.report, args)
        return _mass_skip(exc)
    except UnreadableInputs as exc:
        _summary(exc.report, args)
        return _fail(str(exc), exc.exit_code)
    except UserError as exc:
        return _fail(str(exc), exc.exit_code)
    except OSError as exc:  # disk full, permissions changed mid-run, ...
        where = exc.filename or output_prefix(args.output).parent
        return _fail(f"writing {where}: {exc.strerror or exc}; fix that and rerun the same command to resume")
    except (KeyboardInterrupt, Terminated) as exc:
        name = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
        _fail(f"interrupted by {name}; the {kept} shards are kept, rerun the same command to resume")
        return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)


def convert_cli(args: argparse.Namespace) -> int:
    opts = convert_options(args)
    if opts.image.validate.decodes_in_dali:
        from src.convert.dali_check import dali_available

        if not dali_available():
            _err("note: DALI is not installed, so --validate full checks each image with PIL only")
    report = report_or_status(args, lambda: convert(args.inputs, args.output, opts), "finished")
    if isinstance(report, int):
        return report
    _summary(report, args)
    units = report.get("units") or {}
    if units.get("this_machine") == 0:
        say(
            f"machine {args.machine_id} of {args.num_machines} has no input: the input has only "
            f"{units.get('all')} unit(s) (files, or folder slices of 10000 images)"
        )
        return 0
    if report["written"] == 0:
        _err("no record was written; see the skip reasons above")
        return 1
    return 0


def run(args: argparse.Namespace) -> int:
    """Check `args` (data2rec.py's parser), then verify or convert; the exit status."""
    problem = _check_args(args)
    if problem:
        return _fail(problem)
    if args.verify:
        return run_verify(args)
    return convert_cli(args)
