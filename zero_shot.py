"""Zero-shot image classification with an RWKV-CLIP checkpoint.

    python zero_shot.py --model-name RWKV_CLIP_B32 --model-weight RWKV-CLIP-B32-YFCC15M.pt \
        --datasets cifar10=data/cifar-10-batches-py imagenet=data/imagenet/val --output-dir results
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zero_shot.py",
        description="Zero-shot classification: class embeddings from prompt templates x class names, "
        "then top-1/top-5 accuracy and mean per-class recall for each dataset.",
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
    p.add_argument("--classnames", nargs="*", default=None, metavar="NAME=FILE",
                   help="class-name file per dataset (.txt one per line or 'folder name' lines, or .json)")
    p.add_argument("--templates", nargs="*", default=None, metavar="NAME=FILE",
                   help="prompt templates per dataset (.txt one per line or .json list), each with '{}'")
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
        evaluate_classification,
        format_table,
        load_eval_model,
        parse_dataset_list,
        parse_name_map,
        resolve_device,
        write_result,
    )

    try:
        if args.batch_size < 1 or args.workers < 0:
            raise EvalDataError("--batch-size must be >= 1 and --workers >= 0")
        specs = parse_dataset_list(args.datasets, args.data_root)
        classnames = parse_name_map(args.classnames, "--classnames")
        templates = parse_name_map(args.templates, "--templates")
        for spec in specs:
            spec.classnames = classnames.get(spec.name)
            spec.templates = templates.get(spec.name)
        device = resolve_device(args.device)
        model = load_eval_model(args.config, args.checkpoint, device)
        input_size = model.config["input_size"]
        results = []
        for spec in specs:
            print(f"[zero_shot] {spec.name}: {spec.path}", flush=True)
            result = evaluate_classification(
                model, spec, input_size, device, args.batch_size, args.workers, progress=not args.no_progress
            )
            result = {"dataset": result.pop("dataset"), "model": str(args.config),
                      "checkpoint": str(args.checkpoint) if args.checkpoint else None, **result}
            path = write_result(result, args.output)
            print(f"[zero_shot] {spec.name}: top1 {result['metrics']['top1']:.2f}% -> {path}", flush=True)
            results.append(result)
    except (EvalDataError, CheckpointMismatchError, FileNotFoundError, ValueError) as exc:
        print(f"zero_shot.py: error: {exc}", file=sys.stderr)
        return 2
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
