"""Zero-shot image classification with an RWKV-CLIP checkpoint.

    python zero_shot.py --model-name RWKV_CLIP_B32 --model-weight RWKV-CLIP-B32-YFCC15M.pt \
        --datasets cifar10=data/cifar-10-batches-py imagenet=data/imagenet/val --output-dir results
"""

from __future__ import annotations

import argparse
import sys

from src.evaluation import cli as eval_cli

EPILOG = """\
dataset forms (NAME=PATH; the kind follows from the name or the path):
  cifar10=DIR / cifar100=DIR   CIFAR python pickles (cifar-10-batches-py, cifar-100-python)
  imagenet=DIR                 ImageNet val: 1000 synset folders, or flat + LOC_val_solution.csv
  NAME=DIR                     ImageFolder tree DIR/<class>/<image>; class names from --classnames
                               or the folder names (the bundled list for NAME only when the
                               folders are class indices 0..N-1 or 1..N)
  NAME=FILE.csv|.tsv|.jsonl    manifest with an image column and a label column (index or name)
bundled class names/templates: imagenet1k (1000 classes, CLIP's 80 templates), cifar10, cifar100,
  food101, flowers, pets, caltech101; templates only: sun397, stanford_car, aircraft, dtd.
Results: one JSON per dataset in --output-dir (classification_NAME.json) and a printed table.
"""


def _add_dataset_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--classnames", nargs="*", default=None, metavar="NAME=FILE",
                   help="class-name file per dataset (.txt one per line or 'folder name' lines, or .json)")
    p.add_argument("--templates", nargs="*", default=None, metavar="NAME=FILE",
                   help="prompt templates per dataset (.txt one per line or .json list), each with '{}'")


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
    from src.evaluation.run import parse_name_map

    classnames = parse_name_map(args.classnames, "--classnames")
    templates = parse_name_map(args.templates, "--templates")
    for spec in specs:
        spec.classnames = classnames.get(spec.name)
        spec.templates = templates.get(spec.name)


def _evaluate(args: argparse.Namespace, model, spec, input_size: int, device) -> dict:
    from src.evaluation.run import evaluate_classification

    return evaluate_classification(
        model, spec, input_size, device, args.batch_size, args.workers, progress=not args.no_progress
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return eval_cli.run(args, "zero_shot.py", _usage_error, _configure, _evaluate,
                        lambda result: f"top1 {result['metrics']['top1']:.2f}%")


if __name__ == "__main__":
    sys.exit(main())
