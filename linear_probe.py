"""Linear probe of an RWKV-CLIP checkpoint: the paper's third table.

python linear_probe.py --model-weight RWKV-CLIP-B32-YFCC15M.pt --data-root /data
python linear_probe.py --model-weight W --datasets cifar10=/data dtd=/data --protocol clip_benchmark
python linear_probe.py --list-datasets
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from src.evaluation import cli as eval_cli
from src.evaluation.probe_settings import PROTOCOLS

EPILOG = """\
datasets (NAME=PATH; with only --data-root ROOT, every one of the paper's ten found under ROOT):
  the paper's linear-probe datasets by name (see --list-datasets), read in torchvision's layouts:
    cifar10 cifar100 food101 pets flowers sun397 stanford_car dtd caltech101 aircraft
  (and imagenet: ROOT/train/<synset>/ beside val/ or val.rec); test splits as zero_shot.py's,
  training splits as torchvision's (SUN397, Caltech101: the first piece of the original's seeded
  split), validation: the dataset's own (flowers, dtd, aircraft) or --val-fraction of train held out
  NAME=DIR                     your own images: DIR/train/<class>/<image>, DIR/test/<class>/<image>
                               and optionally DIR/val/<class>/<image>
protocols:
  paper (default)              L2-regularised logistic regression, full-batch L-BFGS on --device in
                               float32; its strength searched coarse-to-fine over 10^-6..10^6 (CLIP's
                               sweep) on the validation split, refitted on train + val, scored on test
  clip_benchmark               CLIP_benchmark 1.6.2's probe on the same features: mini-batch AdamW,
                               its weight-decay search (--cb-lr, --cb-epochs, --cb-batch-size, --seed)
Features are cached in --feature-cache per (weights, dataset, split, transform): a second probe
of the same weights reads them back instead of embedding the images again.
Results: one JSON per dataset in --output-dir (linear_probe_NAME.json), linear_probe.json with
every dataset's metrics, a printed table and the paper's linear-probe row (headline metric: mean
per-class recall for pets, flowers, caltech101, aircraft; top-1 otherwise).
"""

PROTOCOL_HELP = (
    "paper: the paper's and CLIP's L-BFGS logistic regression with its regularisation sweep; "
    "clip_benchmark: CLIP_benchmark 1.6.2's mini-batch probe on the same features "
    "(default: %(default)s)"
)


def _add_options(p: argparse.ArgumentParser) -> None:
    from src.evaluation.probe_settings import (
        CB_BATCH_SIZE,
        CB_EPOCHS,
        CB_LEARNING_RATE,
        MAX_ITER,
        SEED,
        VAL_FRACTION,
    )

    p.add_argument(
        "--list-datasets",
        action="store_true",
        help="print the linear-probe datasets (classes, split sizes, validation, metric, layout) and exit",
    )
    p.add_argument(
        "--feature-cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder of cached features (default: OUTPUT_DIR/features)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=SEED,
        help="seed of the validation split held out of train, and clip_benchmark's seed (default "
        "%(default)s)",
    )
    p.add_argument(
        "--val-fraction",
        type=float,
        default=VAL_FRACTION,
        help="share of train held out for validation where a dataset has no val split (default %(default)s)",
    )
    p.add_argument(
        "--max-iter",
        type=int,
        default=MAX_ITER,
        help="L-BFGS iterations per fit at most, paper protocol (default %(default)s, CLIP's)",
    )
    p.add_argument(
        "--cb-lr",
        type=float,
        default=CB_LEARNING_RATE,
        help="clip_benchmark protocol: learning rate (its --fewshot_lr, default %(default)s)",
    )
    p.add_argument(
        "--cb-epochs",
        type=int,
        default=CB_EPOCHS,
        help="clip_benchmark protocol: epochs per training run (its --fewshot_epochs, default %(default)s)",
    )
    p.add_argument(
        "--cb-batch-size",
        type=int,
        default=CB_BATCH_SIZE,
        help="clip_benchmark protocol: training batch (its --batch_size, default %(default)s)",
    )


def build_parser() -> argparse.ArgumentParser:
    return eval_cli.build_parser(
        "linear_probe.py",
        "Linear probe: frozen image features of each dataset's splits, a logistic-regression classifier "
        "fitted on train (+ val), top-1/top-5 accuracy and mean per-class recall on test.",
        EPILOG,
        _add_options,
        protocols=(PROTOCOLS, "paper", PROTOCOL_HELP),
    )


def main(argv: list[str] | None = None) -> int:
    from src.evaluation.probe_command import linear_probe

    return linear_probe(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
