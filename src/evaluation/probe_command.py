"""What linear_probe.py runs once its options are parsed: `linear_probe(args)` -> exit status. A bad
input ends the run with one `linear_probe.py: error: ...` line and exit status 2, before the model
is loaded where it can be found out before.

Torch and the model code are imported inside, so that `--help` answers at once.
"""

from __future__ import annotations

import argparse
from pathlib import Path

PROG = "linear_probe.py"


def _log(name: str):
    def log(line: str) -> None:
        print(f"[linear_probe] {name}: {line}", flush=True)

    return log


def _specs(args: argparse.Namespace) -> list:
    """--datasets as given, or with only --data-root every linear-probe dataset found under it."""
    from src.evaluation.datasets import EvalDataError
    from src.evaluation.paper_datasets import PAPER_DATASETS, locate
    from src.evaluation.probe_settings import LINEAR_PROBE_DATASETS
    from src.evaluation.specs import DatasetSpec, parse_dataset_list

    if args.datasets:
        return parse_dataset_list(args.datasets, args.data_root)
    if args.data_root is None:
        raise EvalDataError(
            "no datasets given; use --datasets NAME=PATH [...] or --data-root ROOT (every "
            "linear-probe dataset found under torchvision's ROOT)"
        )
    found = []
    for name in LINEAR_PROBE_DATASETS:
        try:
            locate(PAPER_DATASETS[name], args.data_root)
        except EvalDataError:
            continue
        found.append(DatasetSpec(name, Path(args.data_root)))
    if not found:
        raise EvalDataError(
            f"--data-root {args.data_root}: none of the linear-probe datasets is there "
            f"({', '.join(LINEAR_PROBE_DATASETS)}); `python linear_probe.py --list-datasets` shows "
            "their layouts"
        )
    return found


def _check(args: argparse.Namespace) -> None:
    from src.evaluation.datasets import EvalDataError

    if args.batch_size < 1 or args.workers < 0:
        raise EvalDataError("--batch-size must be >= 1 and --workers >= 0")
    if not 0 < args.val_fraction < 1:
        raise EvalDataError(f"--val-fraction {args.val_fraction}: give a fraction between 0 and 1, e.g. 0.2")
    if args.max_iter < 1 or args.cb_epochs < 1 or args.cb_batch_size < 1 or not args.cb_lr > 0:
        raise EvalDataError("--max-iter, --cb-epochs and --cb-batch-size must be >= 1 and --cb-lr > 0")


def linear_probe(args: argparse.Namespace) -> int:
    if args.list_datasets:
        return list_datasets()
    from src.errors import UserError, report
    from src.evaluation.cli import announce, prepare, record_result
    from src.evaluation.datasets import EvalDataError
    from src.evaluation.feature_cache import weights_digest
    from src.evaluation.linear_probe import Extraction, evaluate_linear_probe
    from src.evaluation.model_loader import weights_label
    from src.evaluation.probe_data import probe_dataset
    from src.evaluation.probe_settings import LINEAR_PROBE_DATASETS, ProbeSettings
    from src.evaluation.report import format_paper_table, paper_scores
    from src.evaluation.results import check_output_dir, format_table
    from src.fsutil import atomic_write_json

    try:
        _check(args)
        datasets = [probe_dataset(spec) for spec in _specs(args)]
        cache_dir = args.feature_cache if args.feature_cache is not None else args.output / "features"
        check_output_dir(args.output)
        try:
            check_output_dir(cache_dir)
        except EvalDataError:
            raise EvalDataError(
                f"--feature-cache {cache_dir}: cannot write there; pass a writable folder"
            ) from None
        device, model = prepare(args, PROG)
        print(
            f"[linear_probe] weights {args.checkpoint or 'random init'}: hashing them for the feature cache",
            flush=True,
        )
        extraction = Extraction(
            model,
            weights_digest(model),
            dict(model.config),
            Path(cache_dir),
            model.config["input_size"],
            device,
            args.batch_size,
            args.workers,
            not args.no_progress,
        )
        settings = ProbeSettings(
            args.protocol,
            args.seed,
            args.val_fraction,
            args.max_iter,
            args.cb_lr,
            args.cb_epochs,
            args.cb_batch_size,
        )
        results = []
        for dataset in datasets:
            announce(PROG, dataset.spec)
            result = evaluate_linear_probe(dataset, extraction, settings, _log(dataset.name))
            seconds = result["seconds"]
            results.append(
                record_result(
                    args,
                    PROG,
                    dataset.spec,
                    result,
                    f"{result['metric']} {result['score']:.2f}% (features {seconds['features']:.1f} s, "
                    f"probe {seconds['probe']:.1f} s)",
                )
            )
        summary = atomic_write_json(
            args.output / "linear_probe.json", {r["dataset"]: r["metrics"] for r in results}
        )
        print(format_table(results))
        if paper_scores(results, "linear_probe"):
            print(f"\nThe paper's linear-probe table ({args.protocol} protocol):")
            print(
                format_paper_table(
                    results, weights_label(args.checkpoint), "linear_probe", LINEAR_PROBE_DATASETS
                )
            )
        print(f"[linear_probe] metrics of every dataset -> {summary}")
    except UserError as exc:
        return report(PROG, exc)
    return 0


def list_datasets() -> int:
    from src.evaluation.paper_datasets import PAPER_DATASETS
    from src.evaluation.probe_data import describe_splits
    from src.evaluation.probe_settings import LINEAR_PROBE_DATASETS
    from src.evaluation.results import format_rows

    rows = []
    for name in LINEAR_PROBE_DATASETS:
        d = PAPER_DATASETS[name]
        sizes = dict(zip(d.splits, d.split_sizes))
        rows.append(
            [
                name,
                d.num_classes,
                f"{sizes['train']:,}",
                f"{sizes['val']:,}" if "val" in sizes else "-",
                f"{sizes['test']:,}",
                describe_splits(d.splits),
                "mean per class" if d.metric == "mean_per_class" else "top-1",
                d.layout,
            ]
        )
    print(
        format_rows(
            ["name", "classes", "train", "val", "test", "validation", "metric", "layout under ROOT"], rows
        )
    )
    return 0
