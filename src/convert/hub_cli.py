"""data2rec.py --from-hub: its flags, and the run with the same messages and exit statuses as a
conversion (src/convert/cli.py), plus 3 for a hub that cannot be listed or a shard that cannot be
downloaded after its retries."""

from __future__ import annotations

import argparse
from pathlib import Path

from src.shard_names import shard_names_text

from .cli import DEFAULT_NAME, _check_args, _fail, _summary, convert_options, report_or_status, say
from .onepass import DEFAULT_MAX_INFLIGHT, DEFAULT_TRIES, HubOptions, convert_from_hub, rate_lines
from .pipeline import output_prefix


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("one pass from the hub (download and convert, bounded disk)")
    g.add_argument(
        "--from-hub",
        metavar="ORG/NAME",
        help="download this hub dataset's parquet shards with data/hfd.sh (HF_ENDPOINT, HF_TOKEN as "
        "there) and convert each as soon as it is verified, deleting it once its records are "
        "written: peak disk is the records plus --max-inflight shards. Writes "
        f"{shard_names_text(Path('OUT'))}, one per hub shard (default --output: "
        f"NAME/{DEFAULT_NAME}); rerun the same command to resume",
    )
    g.add_argument(
        "--hub-include",
        nargs="+",
        metavar="PAT",
        default=[],
        help="only hub files matching these globs, as hfd.sh --include (e.g. 'data/train-0000*')",
    )
    g.add_argument(
        "--max-inflight",
        type=int,
        default=DEFAULT_MAX_INFLIGHT,
        metavar="N",
        help=f"shards on disk at once, downloading or converting (default {DEFAULT_MAX_INFLIGHT})",
    )
    g.add_argument(
        "--download-tries",
        type=int,
        default=DEFAULT_TRIES,
        metavar="N",
        help=f"hfd.sh runs per shard (each retrying itself) before the run stops with status 3 "
        f"(default {DEFAULT_TRIES})",
    )


def run_from_hub(args: argparse.Namespace) -> int:
    if args.inputs or args.verify:
        return _fail(
            "--from-hub downloads its own input: give no INPUT and no --verify (verify the output "
            "afterwards with --verify OUT)"
        )
    if not args.output:
        args.output = str(Path(args.from_hub.rsplit("/", 1)[-1]) / DEFAULT_NAME)
        say(f"no --output given: writing {shard_names_text(output_prefix(args.output))}")
    problem = _check_args(argparse.Namespace(**{**vars(args), "inputs": [args.from_hub]}))
    if problem:
        return _fail(problem)
    hub = HubOptions(
        args.from_hub, tuple(args.hub_include), max_inflight=args.max_inflight, tries=args.download_tries
    )
    report = report_or_status(
        args, lambda: convert_from_hub(hub, args.output, convert_options(args), say), "converted"
    )
    if isinstance(report, int):
        return report
    _summary(report, args)
    say(*rate_lines(report["rates"]))
    if report["written"] == 0:
        _fail("no record was written; see the skip reasons above", 1)
        return 1
    return 0
