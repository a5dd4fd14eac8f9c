"""Embed a folder of images, an image list or a text file with RWKV-CLIP.

python embed.py --model-weight RWKV-CLIP-B32-YFCC15M.pt --images photos/ --output photos.npy
python embed.py --model-weight hf-hub:ORG/REPO --texts captions.txt --output captions.npy
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from src.evaluation.cli import add_model_options, add_run_options

# A backslash at a line's end joins the next source line: the help keeps the line as it was.
EPILOG = """\
inputs:
  --images DIR          every image under DIR (recursively, sorted by path; hidden files left out)
  --images LIST.txt     one image path per line; relative paths are relative to the list's folder
  --images FILE.csv|.tsv|.jsonl
                        a manifest; the image column is image/filepath/path/file/filename/file_name \
or --image-column
  --texts FILE          one text per line (UTF-8); blank lines are skipped
Images that are missing or cannot be decoded are skipped and counted; so is any path named like an
image that is no file to read (a FIFO, a device, a broken link, a folder named x.jpg), never read
and listed under "skipped" with what it is.

outputs, for --output OUT.npy:
  OUT.npy               float32 [N, D], rows L2-normalised (cosine similarity = dot product)
  OUT.index.json        {"kind", "model", "weights", "count", "dim", "root", "items", "skipped"}:
                        items[i] is the input of row i (path relative to root, or the text)
Both appear only when complete.

weights (--model-weight): a .pt or .safetensors file (raw state dict, DDP-saved, or a train.py
checkpoint), or hf-hub:ORG/REPO (the repo's single weights file) or hf-hub:ORG/REPO/FILE, fetched
through huggingface_hub (HF_ENDPOINT, HF_TOKEN, the hub cache; HF_HUB_OFFLINE=1 uses the cache only).
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="embed.py",
        description="Write L2-normalised RWKV-CLIP embeddings of images or texts to a .npy file, with an "
        "index of the inputs beside it.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_model_options(p, "embed with untrained random weights (for testing a setup, never for real use)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--images", type=Path, help="a folder of images, or a .txt/.csv/.tsv/.jsonl list of them"
    )
    what.add_argument("--texts", type=Path, help="a UTF-8 text file, one text per line")
    p.add_argument("--image-column", default=None, help="the image column of a CSV/TSV/JSONL manifest")
    p.add_argument(
        "--output", required=True, type=Path, help="embeddings file OUT.npy (OUT.index.json goes beside it)"
    )
    p.add_argument("--batch-size", type=int, default=64, help="inputs per forward pass (default 64)")
    add_run_options(p, "image decoding processes (default 4; 0 decodes in this one)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Torch and the model load only once the arguments parse, so --help answers at once.
    from src.devices import resolve_device
    from src.errors import UserError, report
    from src.evaluation.export_embeddings import run_embed

    try:
        device = resolve_device(args.device)
        summary = run_embed(
            model_name=args.config,
            weights=args.checkpoint,
            output=args.output,
            images=args.images,
            texts=args.texts,
            image_column=args.image_column,
            device=device,
            batch_size=args.batch_size,
            workers=args.workers,
            random_init=args.random_init,
            cache_dir=args.cache_dir,
            wkv_impl=args.wkv_impl,
            progress=not args.no_progress,
        )
    except UserError as exc:
        return report("embed.py", exc)
    skipped = summary["skipped"]
    print(
        f"[embed] {summary['count']} {summary['kind']} x {summary['dim']} -> {args.output} "
        f"(index: {summary['index']})"
    )
    if skipped:
        print(
            f"[embed] skipped {len(skipped)} unreadable image(s), e.g. {skipped[0]['item']}: "
            f"{skipped[0]['error']}; "
            'all are listed under "skipped" in the index'
        )
    if summary.get("blank_lines"):
        print(f"[embed] skipped {summary['blank_lines']} blank line(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
