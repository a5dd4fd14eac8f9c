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
Own labels: --images DIR_OR_FILES --labels "cat,dog,car" (or --labels @labels.txt, one per line)
prints each image's top label.
"""


def _add_dataset_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--classnames",
        nargs="*",
        default=None,
        metavar="NAME=FILE",
        help="class-name file per dataset (.txt one per line or 'folder name' lines, or .json)",
    )
    p.add_argument(
        "--templates",
        nargs="*",
        default=None,
        metavar="NAME=FILE",
        help="prompt templates per dataset (.txt one per line or .json list), each with '{}'",
    )
    p.add_argument(
        "--list-datasets",
        action="store_true",
        help="print the paper's datasets (classes, templates, test images, metric, layout) and exit",
    )
    p.add_argument(
        "--csv",
        type=Path,
        default=None,
        metavar="FILE",
        help="append the original's result line (the scores, comma-separated, in --datasets order)",
    )
    p.add_argument(
        "--images",
        nargs="+",
        type=Path,
        default=None,
        metavar="PATH",
        help="image files or folders to classify against --labels (instead of --datasets)",
    )
    p.add_argument(
        "--labels",
        default=None,
        help="two or more labels for --images: comma-separated, e.g. 'cat,dog,car', or @FILE with one "
        "label per line",
    )
    p.add_argument(
        "--label-templates",
        type=Path,
        default=None,
        metavar="FILE",
        help="templates for --labels (default: CLIP's 80 ImageNet templates)",
    )


def build_parser() -> argparse.ArgumentParser:
    return eval_cli.build_parser(
        "zero_shot.py",
        "Zero-shot classification: class embeddings from prompt templates x class names, "
        "then top-1/top-5 accuracy and mean per-class recall for each dataset.",
        EPILOG,
        _add_dataset_options,
    )


def main(argv: list[str] | None = None) -> int:
    from src.evaluation.commands import zero_shot

    return zero_shot(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
