"""Zero-shot image<->text retrieval with an RWKV-CLIP checkpoint (R@1/5/10 both ways).

    python retrieval.py --model-name RWKV_CLIP_B32 --model-weight RWKV-CLIP-B32-YFCC15M.pt \
        --protocol original \
        --datasets coco=data/coco/coco_test.json flickr30k=data/flickr30k/flickr30k_test.json \
        --output-dir results
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from src.evaluation import cli as eval_cli

EPILOG = """\
dataset forms (NAME=PATH):
  NAME=coco_test.json          ALBEF/BLIP test file [{"image": "val2014/x.jpg", "caption": [...]}, ...]
                               (what the original reads); images at IMAGE_ROOT/<image>, or at
                               IMAGE_ROOT/<image without its first folder>; every caption is kept
  NAME=dataset_coco.json       Karpathy split file; images at IMAGE_ROOT/<filepath>/<filename>
                               (COCO: val2014/...); the first five captions of each test image
  NAME=DIR                     a folder holding one dataset_*.json (e.g. dataset_flickr30k.json);
                               Flickr30k images may sit in DIR/ or DIR/flickr30k-images/
  NAME=coco_test_karpathy.json CLIP_benchmark's own files (COCO's caption layout; IMAGE.jpg,caption
  NAME=flickr30k_test_karpathy.txt  lines), read as it reads them, every caption kept; images at
                               IMAGE_ROOT/<file> or IMAGE_ROOT/val2014/ (COCO), IMAGE_ROOT/flickr30k-
                               images/ (Flickr). NAME=DIR holding one of them (its --dataset_root)
                               reads it under --protocol clip_benchmark
  NAME=FILE.csv|.tsv|.jsonl    manifest: an image column and caption columns (caption*, text*),
                               or a JSONL list of captions per image
IMAGE_ROOT is --image-root, by default the JSON's folder. Ranks are positions in the similarities
sorted stably: equal scores keep the dataset's order (the original's argsort and CLIP_benchmark's
topk agree without ties only; docs/evaluation.md).
Results: one JSON per dataset in --output-dir (retrieval_NAME.json) and a printed table.
"""


def _add_dataset_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--image-root",
        type=Path,
        default=None,
        help="image folder for ALBEF/BLIP and Karpathy JSON files (default: the JSON's folder)",
    )
    p.add_argument(
        "--captions-per-image",
        type=int,
        default=None,
        help="captions kept per image (default: all for ALBEF/BLIP files, as the original; "
        "5 for Karpathy files)",
    )


def build_parser() -> argparse.ArgumentParser:
    return eval_cli.build_parser(
        "retrieval.py",
        "Zero-shot retrieval: image->text and text->image Recall@1/5/10 on the Flickr30k/MSCOCO "
        "test splits (ALBEF/BLIP or Karpathy JSON) or your own image-caption manifest.",
        EPILOG,
        _add_dataset_options,
    )


def main(argv: list[str] | None = None) -> int:
    from src.evaluation.commands import retrieval

    return retrieval(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
