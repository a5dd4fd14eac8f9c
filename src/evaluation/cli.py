"""What the evaluation CLIs (zero_shot.py, retrieval.py) share: their common options and the run
over datasets. Each CLI keeps only what differs: its dataset options, checks and metric.

Torch and the model code are imported only once a run starts, so that `--help` answers at once.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any


def build_parser(
    prog: str, description: str, epilog: str, add_dataset_options: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    """The common options, with the CLI's own dataset options placed after --data-root (where --help
    has always listed them)."""
    p = argparse.ArgumentParser(
        prog=prog, description=description, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    p.add_argument("--model-name", "--config", dest="config", default="RWKV_CLIP_B32",
                   help="model config: a shipped name (RWKV_CLIP_B32, RWKV_CLIP_B16, ...) or a JSON file")
    p.add_argument("--model-weight", "--pretrained", dest="checkpoint", type=Path, default=None,
                   help="checkpoint .pt (the released weights or one written by train.py)")
    p.add_argument("--datasets", "--dataset", dest="datasets", nargs="+", required=True,
                   help="NAME=PATH items (space- or comma-separated); see below")
    p.add_argument("--data-root", type=Path, default=None, help="folder for bare NAME items (PATH = ROOT/NAME)")
    add_dataset_options(p)
    p.add_argument("--output-dir", "--output", dest="output", type=Path, default=Path("eval_results"),
                   help="folder for the per-dataset JSON results (default: eval_results)")
    p.add_argument("--batch-size", type=int, default=128, help="images per forward pass (default 128)")
    p.add_argument("--workers", type=int, default=4, help="image decoding processes (default 4)")
    p.add_argument("--device", default="auto", help="auto (GPU if present), cpu, cuda or cuda:N")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def run(
    args: argparse.Namespace,
    prog: str,
    usage_error: Callable[[argparse.Namespace], str | None],
    configure: Callable[[argparse.Namespace, list], None],
    evaluate: Callable[[argparse.Namespace, Any, Any, int, Any], dict],
    summary: Callable[[dict], str],
) -> int:
    """Evaluate every dataset in args.datasets, write one JSON each and print the table.

    `usage_error` returns the message for option values out of range (checked before any dataset is
    read), `configure` fills the CLI's own fields of the parsed specs, `evaluate(args, model, spec,
    input_size, device)` returns the library's result dict and `summary` its one-line headline.
    A bad input ends the run with one `PROG: error: ...` line and exit status 2, not a traceback.
    """
    from src.devices import resolve_device
    from src.errors import UserError, report
    from src.evaluation.run import (
        EvalDataError,
        format_table,
        load_eval_model,
        parse_dataset_list,
        write_result,
    )

    tag = f"[{prog.removesuffix('.py')}]"
    try:
        message = usage_error(args)
        if message:
            raise EvalDataError(message)
        specs = parse_dataset_list(args.datasets, args.data_root)
        configure(args, specs)
        device = resolve_device(args.device)
        model = load_eval_model(args.config, args.checkpoint, device)
        input_size = model.config["input_size"]
        results = []
        for spec in specs:
            print(f"{tag} {spec.name}: {spec.path}", flush=True)
            result = evaluate(args, model, spec, input_size, device)
            result = {"dataset": result.pop("dataset"), "model": str(args.config),
                      "checkpoint": str(args.checkpoint) if args.checkpoint else None, **result}
            path = write_result(result, args.output)
            print(f"{tag} {spec.name}: {summary(result)} -> {path}", flush=True)
            results.append(result)
    except UserError as exc:
        return report(prog, exc)
    print(format_table(results))
    return 0
