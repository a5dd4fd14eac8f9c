"""Zero-shot image classification with an RWKV-CLIP checkpoint.

    python zero_shot.py --model-name RWKV_CLIP_B32 --model-weight RWKV-CLIP-B32-YFCC15M.pt \
        --datasets cifar10=/data food101=/data imagenet=/data/imagenet/val.rec --protocol original
    python zero_shot.py --list-datasets
    python zero_shot.py --model-weight W --images photos/ --labels "cat,dog,car"
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from src.evaluation import cli as eval_cli

EPILOG = """\
dataset forms (NAME=PATH; the kind follows from the name or the path):
  the paper's 11 datasets by name (see --list-datasets), read in torchvision's layouts with the
  original's test splits, class names and templates; PATH is torchvision's root (the folder that
  holds food-101/, dtd/, ...) or the dataset's own folder:
    cifar10 cifar100 food101 pets flowers sun397 stanford_car dtd caltech101 aircraft imagenet
  imagenet=PATH                val.rec (+ val.idx) as the original reads it, a folder holding val.rec,
                               or the val folder (1000 synset folders, or flat + LOC_val_solution.csv)
  NAME=DIR                     ImageFolder tree DIR/<class>/<image>; class names from --classnames
                               or the folder names (the bundled list for NAME only when the
                               folders are class indices 0..N-1 or 1..N)
  NAME=FILE.csv|.tsv|.jsonl    manifest with an image column and a label column (index or name)
Results: one JSON per dataset in --output-dir (classification_NAME.json), a printed table and, when
any of the paper's datasets ran, its row of the paper's table (headline metric: mean per-class
recall for pets, flowers, caltech101, aircraft; top-1 otherwise).
Own labels: --images DIR_OR_FILES --labels "cat,dog,car" prints each image's top label.
"""


def _add_dataset_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--classnames", nargs="*", default=None, metavar="NAME=FILE",
                   help="class-name file per dataset (.txt one per line or 'folder name' lines, or .json)")
    p.add_argument("--templates", nargs="*", default=None, metavar="NAME=FILE",
                   help="prompt templates per dataset (.txt one per line or .json list), each with '{}'")
    p.add_argument("--list-datasets", action="store_true",
                   help="print the paper's datasets (classes, templates, test images, metric, layout) and exit")
    p.add_argument("--csv", type=Path, default=None, metavar="FILE",
                   help="append the original's result line (the scores, comma-separated, in --datasets order)")
    p.add_argument("--images", nargs="+", type=Path, default=None, metavar="PATH",
                   help="image files or folders to classify against --labels (instead of --datasets)")
    p.add_argument("--labels", default=None, help="comma-separated labels for --images, e.g. 'cat,dog,car'")
    p.add_argument("--label-templates", type=Path, default=None, metavar="FILE",
                   help="templates for --labels (default: CLIP's 80 ImageNet templates)")


def build_parser() -> argparse.ArgumentParser:
    return eval_cli.build_parser(
        "zero_shot.py",
        "Zero-shot classification: class embeddings from prompt templates x class names, "
        "then top-1/top-5 accuracy and mean per-class recall for each dataset.",
        EPILOG,
        _add_dataset_options,
    )


def _usage_error(args: argparse.Namespace) -> str | None:
    if args.batch_size < 1 or args.workers < 0:
        return "--batch-size must be >= 1 and --workers >= 0"
    return None


def _configure(args: argparse.Namespace, specs: list) -> None:
    from src.evaluation.specs import parse_name_map

    classnames = parse_name_map(args.classnames, "--classnames")
    templates = parse_name_map(args.templates, "--templates")
    for spec in specs:
        spec.classnames = classnames.get(spec.name)
        spec.templates = templates.get(spec.name)
    if args.csv is not None:
        from src.evaluation.results import check_output_dir

        check_output_dir(args.csv.parent)


def _evaluate(args: argparse.Namespace, model, spec, input_size: int, device) -> dict:
    from src.evaluation.run import evaluate_classification

    return evaluate_classification(
        model, spec, input_size, device, args.batch_size, args.workers, progress=not args.no_progress,
        protocol=args.protocol,
    )


def _summary(result: dict) -> str:
    return f"{result['metric']} {result['score']:.2f}%"


def _finish(args: argparse.Namespace, results) -> None:
    from src.evaluation.model_loader import weights_label
    from src.evaluation.report import append_csv_line, format_paper_table, paper_scores

    if paper_scores(results):
        print(f"\nThe paper's table ({args.protocol} protocol):")
        print(format_paper_table(results, label=weights_label(args.checkpoint)))
    if args.csv is not None:
        print(f"[zero_shot] result line appended to {append_csv_line(args.csv, results)}")


def list_datasets() -> int:
    from src.evaluation.paper_datasets import describe
    from src.evaluation.results import format_rows

    header = ["name", "classes", "templates", "test images", "metric", "layout under ROOT"]
    print(format_rows(header, [[r["name"], r["classes"], r["templates"], f"{r['test_images']:,}", r["metric"], r["layout"]]
                               for r in describe()]))
    return 0


def _tsv(rows: list[tuple]) -> str:
    """Tab-separated rows, quoted where a cell holds a tab, newline or quote (a file name may)."""
    import csv
    import io

    out = io.StringIO()
    csv.writer(out, delimiter="\t", lineterminator="\n").writerows(rows)
    return out.getvalue()


def classify_labels(args: argparse.Namespace) -> int:
    """--images with --labels: print each image's top label and write labels.tsv to --output-dir;
    unreadable images are skipped, counted and named."""
    from src.errors import UserError, report
    from src.evaluation.datasets import EvalDataError
    from src.evaluation.images import list_images, skip_notice
    from src.evaluation.run import classify_images
    from src.evaluation.templates import read_templates
    from src.fsutil import atomic_write_text

    try:
        if args.datasets:
            raise EvalDataError("--images/--labels and --datasets exclude each other; run them separately")
        if not args.images or not args.labels:
            raise EvalDataError("--images and --labels go together, e.g. --images photos/ --labels 'cat,dog,car'")
        labels = [label.strip() for label in args.labels.split(",")]
        templates = read_templates(args.label_templates) if args.label_templates else None
        images = list_images(args.images)
        device, model = eval_cli.prepare(args, _usage_error)
        rows, skipped = classify_images(model, images, labels, model.config["input_size"], device, templates,
                                        args.batch_size, args.workers)
        table = _tsv([("image", "label", "probability")]
                     + [(str(r["image"]), r["label"], f"{r['probability']:.4f}") for r in rows])
        path = atomic_write_text(args.output / "labels.tsv", table)
        body = table.partition("\n")[2]
    except UserError as exc:
        return report("zero_shot.py", exc)
    print(body, end="")
    if skipped:
        print(skip_notice("[zero_shot]", skipped), file=sys.stderr)
    print(f"[zero_shot] {len(rows)} images -> {path}" + (f" ({len(skipped)} skipped)" if skipped else ""),
          file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list_datasets:
        return list_datasets()
    if args.images or args.labels:
        return classify_labels(args)
    return eval_cli.run(args, "zero_shot.py", _usage_error, _configure, _evaluate, _summary, _finish)


if __name__ == "__main__":
    sys.exit(main())
