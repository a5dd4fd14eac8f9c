"""What zero_shot.py and retrieval.py run once their options are parsed: one plain function per
command (parse -> `zero_shot(args)` / `retrieval(args)` -> exit status). A bad input ends the
run with one `PROG: error: ...` line and exit status 2, not a traceback.

Torch and the model code are imported inside, so that `--help` answers at once.
"""

from __future__ import annotations

import argparse
import sys


def zero_shot(args: argparse.Namespace) -> int:
    """zero_shot.py: --list-datasets, --images with --labels, or --datasets."""
    if args.list_datasets:
        return list_datasets()
    if args.images or args.labels:
        return classify_labels(args)
    from src.errors import UserError, report
    from src.evaluation.cli import announce, prepare, record_result
    from src.evaluation.datasets import EvalDataError
    from src.evaluation.model_loader import weights_label
    from src.evaluation.report import append_csv_line, format_paper_table, paper_scores
    from src.evaluation.results import check_output_dir, format_table
    from src.evaluation.run import evaluate_classification
    from src.evaluation.specs import parse_dataset_list, parse_name_map

    try:
        if args.batch_size < 1 or args.workers < 0:
            raise EvalDataError("--batch-size must be >= 1 and --workers >= 0")
        specs = parse_dataset_list(args.datasets or [], args.data_root)
        classnames = parse_name_map(args.classnames, "--classnames")
        templates = parse_name_map(args.templates, "--templates")
        for spec in specs:
            spec.classnames = classnames.get(spec.name)
            spec.templates = templates.get(spec.name)
        if args.csv is not None:
            check_output_dir(args.csv.parent)
        device, model = prepare(args, "zero_shot.py")
        results = []
        for spec in specs:
            announce("zero_shot.py", spec)
            result = evaluate_classification(
                model,
                spec,
                model.config["input_size"],
                device,
                args.batch_size,
                args.workers,
                progress=not args.no_progress,
                protocol=args.protocol,
                return_predictions=True,
            )
            results.append(
                record_result(
                    args, "zero_shot.py", spec, result, f"{result['metric']} {result['score']:.2f}%"
                )
            )
        print(format_table(results))
        if paper_scores(results):
            print(f"\nThe paper's table ({args.protocol} protocol):")
            print(format_paper_table(results, label=weights_label(args.checkpoint)))
        if args.csv is not None:
            print(f"[zero_shot] result line appended to {append_csv_line(args.csv, results)}")
    except UserError as exc:
        return report("zero_shot.py", exc)
    return 0


def retrieval(args: argparse.Namespace) -> int:
    """retrieval.py: image<->text recall on each of --datasets."""
    from src.errors import UserError, report
    from src.evaluation.cli import announce, prepare, record_result
    from src.evaluation.datasets import EvalDataError
    from src.evaluation.results import format_table
    from src.evaluation.run import evaluate_retrieval
    from src.evaluation.specs import parse_dataset_list

    try:
        if (
            args.batch_size < 1
            or args.workers < 0
            or (args.captions_per_image is not None and args.captions_per_image < 1)
        ):
            raise EvalDataError("--batch-size and --captions-per-image must be >= 1, --workers >= 0")
        specs = parse_dataset_list(args.datasets or [], args.data_root)
        for spec in specs:
            spec.image_root = args.image_root
        device, model = prepare(args, "retrieval.py")
        results = []
        for spec in specs:
            announce("retrieval.py", spec)
            result = evaluate_retrieval(
                model,
                spec,
                model.config["input_size"],
                device,
                args.batch_size,
                args.workers,
                progress=not args.no_progress,
                captions_per_image=args.captions_per_image,
                protocol=args.protocol,
            )
            results.append(
                record_result(
                    args, "retrieval.py", spec, result, f"mean recall {result['metrics']['mean_recall']:.2f}%"
                )
            )
        print(format_table(results))
    except UserError as exc:
        return report("retrieval.py", exc)
    return 0


def list_datasets() -> int:
    from src.evaluation.paper_datasets import describe
    from src.evaluation.results import format_rows

    header = ["name", "classes", "templates", "test images", "metric", "layout under ROOT"]
    print(
        format_rows(
            header,
            [
                [r["name"], r["classes"], r["templates"], f"{r['test_images']:,}", r["metric"], r["layout"]]
                for r in describe()
            ],
        )
    )
    return 0


def classify_labels(args: argparse.Namespace) -> int:
    """--images with --labels: print each image's top label and write labels.tsv (with each image's
    top-k labels) and labels.json (the labels, the templates, how many images each label got) to
    --output-dir; unreadable images are skipped, counted and named."""
    from collections import Counter

    from src.errors import UserError, report
    from src.evaluation.cli import prepare
    from src.evaluation.datasets import EvalDataError
    from src.evaluation.images import list_images, skip_notice
    from src.evaluation.results import tsv
    from src.evaluation.run import classify_images
    from src.evaluation.templates import LABEL_TEMPLATES_FROM, read_labels, read_templates
    from src.fsutil import atomic_write_json, atomic_write_text, json_safe, printable
    from src.open_alip.zero_shot import load_metadata

    try:
        if args.datasets:
            raise EvalDataError("--images/--labels and --datasets exclude each other; run them separately")
        if not args.images or not args.labels:
            raise EvalDataError(
                "--images and --labels go together, e.g. --images photos/ --labels 'cat,dog,car'"
            )
        if args.batch_size < 1 or args.workers < 0:
            raise EvalDataError("--batch-size must be >= 1 and --workers >= 0")
        labels = read_labels(args.labels)  # before the model loads: a wrong --labels fails at once
        if args.label_templates:
            templates, source = read_templates(args.label_templates), f"the file {args.label_templates}"
        else:
            templates = list(load_metadata(LABEL_TEMPLATES_FROM)[1])
            source = "CLIP's ImageNet prompts (--label-templates FILE gives others)"
        images, not_read = list_images(args.images)
        device, model = prepare(args, "zero_shot.py", sys.stderr)  # stdout: the table alone
        rows, unreadable = classify_images(
            model,
            images,
            labels,
            model.config["input_size"],
            device,
            templates,
            args.batch_size,
            args.workers,
        )
        skipped = not_read + unreadable
        table = tsv(
            [("image", "label", "probability", "top-k, best first")]
            + [
                (
                    str(r["image"]),
                    r["label"],
                    f"{r['probability']:.4f}",
                    "; ".join(f"{label} {p:.4f}" for label, p in r["top_k"]),
                )
                for r in rows
            ]
        )
        path = atomic_write_text(args.output / "labels.tsv", table)
        counts = Counter(r["label"] for r in rows)
        summary = atomic_write_json(
            args.output / "labels.json",
            json_safe(
                {
                    "model": args.model_label,
                    "checkpoint": str(args.checkpoint) if args.checkpoint else None,
                    "labels": labels,
                    "images": len(rows),
                    "per_label": {label: counts[label] for label in labels},
                    "templates": templates,
                    "templates_from": source,
                    "skipped_images": skipped,
                }
            ),
            ensure_ascii=False,
        )
    except UserError as exc:
        return report("zero_shot.py", exc)
    # File names that are not UTF-8 as labels.tsv shows them (src/fsutil.py printable).
    print(printable(table.partition("\n")[2]), end="")
    if skipped:
        print(skip_notice("[zero_shot]", skipped), file=sys.stderr)
    print(f"[zero_shot] {len(templates)} template(s): {source}", file=sys.stderr)
    print(
        printable(
            f"[zero_shot] {len(rows)} images -> {path}, {summary}"
            + (f" ({len(skipped)} skipped)" if skipped else "")
        ),
        file=sys.stderr,
    )
    return 0
