"""Zero-shot image<->text retrieval with an RWKV-CLIP checkpoint (R@1/5/10 both ways).

    python retrieval.py --model-name RWKV_CLIP_B32 --model-weight RWKV-CLIP-B32-YFCC15M.pt \
        --datasets coco=data/coco/dataset_coco.json flickr30k=data/flickr30k --output-dir results
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

EPILOG = """\
dataset forms (NAME=PATH):
  NAME=dataset_coco.json       Karpathy split file; images at IMAGE_ROOT/<filepath>/<filename>
                               (COCO: val2014/...), IMAGE_ROOT defaults to the JSON's folder
  NAME=DIR                     a folder holding one dataset_*.json (e.g. dataset_flickr30k.json);
                               Flickr30k images may sit in DIR/ or DIR/flickr30k-images/
  NAME=FILE.csv|.tsv|.jsonl    manifest: an image column and caption columns (caption*, text*),
                               or a JSONL list of captions per image
The Karpathy test split is used with the first five captions of each image (the standard protocol).
Results: one JSON per dataset in --output-dir (retrieval_NAME.json) and a printed table.
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="retrieval.py",
        description="Zero-shot retrieval: image->text and text->image Recall@1/5/10 on Flickr30k/MSCOCO "
        "Karpathy test splits or your own image-caption manifest.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model-name", "--config", dest="config", default="RWKV_CLIP_B32",
                   help="model config: a shipped name (RWKV_CLIP_B32, RWKV_CLIP_B16, ...) or a JSON file")
    p.add_argument("--model-weight", "--pretrained", dest="checkpoint", type=Path, default=None,
                   help="checkpoint .pt (the released weights or one written by train.py)")
    p.add_argument("--datasets", "--dataset", dest="datasets", nargs="+", required=True,
                   help="NAME=PATH items (space- or comma-separated); see below")
    p.add_argument("--data-root", type=Path, default=None, help="folder for bare NAME items (PATH = ROOT/NAME)")
    p.add_argument("--image-root", type=Path, default=None,
                   help="image folder for Karpathy JSON files (default: the JSON's folder)")
    p.add_argument("--captions-per-image", type=int, default=5,
                   help="captions kept per image from Karpathy files (default 5; 0 keeps all)")
    p.add_argument("--output-dir", "--output", dest="output", type=Path, default=Path("eval_results"),
                   help="folder for the per-dataset JSON results (default: eval_results)")
    p.add_argument("--batch-size", type=int, default=128, help="images per forward pass (default 128)")
    p.add_argument("--workers", type=int, default=4, help="image decoding processes (default 4)")
    p.add_argument("--device", default="auto", help="auto (GPU if present), cpu, cuda or cuda:N")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from src.open_alip.model import CheckpointMismatchError
    from src.open_alip.zero_shot import (
        EvalDataError,
        evaluate_retrieval,
        format_table,
        load_eval_model,
        parse_dataset_list,
        resolve_device,
        write_result,
    )

    try:
        if args.batch_size < 1 or args.workers < 0 or args.captions_per_image < 0:
            raise EvalDataError("--batch-size must be >= 1, --workers and --captions-per-image >= 0")
        specs = parse_dataset_list(args.datasets, args.data_root)
        for spec in specs:
            spec.image_root = args.image_root
        device = resolve_device(args.device)
        model = load_eval_model(args.config, args.checkpoint, device)
        input_size = model.config["input_size"]
        results = []
        for spec in specs:
            print(f"[retrieval] {spec.name}: {spec.path}", flush=True)
            result = evaluate_retrieval(
                model, spec, input_size, device, args.batch_size, args.workers,
                progress=not args.no_progress, captions_per_image=args.captions_per_image or None,
            )
            result = {"dataset": result.pop("dataset"), "model": str(args.config),
                      "checkpoint": str(args.checkpoint) if args.checkpoint else None, **result}
            path = write_result(result, args.output)
            print(f"[retrieval] {spec.name}: mean recall {result['metrics']['mean_recall']:.2f}% -> {path}", flush=True)
            results.append(result)
    except (EvalDataError, CheckpointMismatchError, FileNotFoundError, ValueError) as exc:
        print(f"retrieval.py: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
