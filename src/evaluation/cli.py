"""What the evaluation CLIs (zero_shot.py, retrieval.py) share: their common options (the model and
run options embed.py takes too), loading the model, and recording each dataset's result. Their runs
are src/evaluation/commands.py.

Torch and the model code are imported only once a run starts, so that `--help` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from src.evaluation.model_loader import MODEL_NAME_HELP

# Torch-free, so --help stays instant.
WEIGHTS_HELP = (
    "weights: a .pt or .safetensors file (the released weights, or a checkpoint written by train.py) or "
    "hf-hub:ORG/REPO[/FILE] (fetched through huggingface_hub: HF_ENDPOINT, HF_TOKEN, the hub cache; "
    "HF_HUB_OFFLINE=1 uses the cache only); required unless --random-init"
)
WEIGHTS_EPILOG = """\
weights (--model-weight): a .pt or .safetensors file (raw state dict, DDP-saved, or a train.py
checkpoint), or hf-hub:ORG/REPO (the repo's single weights file) or hf-hub:ORG/REPO/FILE, fetched
through huggingface_hub (HF_ENDPOINT, HF_TOKEN, the hub cache or --cache-dir; HF_HUB_OFFLINE=1
uses the cache only). Images that cannot be read are skipped, counted and named.
"""

PROTOCOL_HELP = (
    "original: the paper's numbers (integer-truncated logits, the original's ImageNet DALI resize and "
    "counted padding rows, 'a photo of ' before captions); standard: float logits, open_clip's "
    "transform, captions as written, on the original's dataset definitions; clip_benchmark: as standard, "
    "on CLIP_benchmark's dataset definitions (SUN397 and Caltech101 whole, Caltech101's background class, "
    "its class names), comparable with `clip_benchmark eval` (docs/evaluation.md) (default: %(default)s)"
)


def add_model_options(p: argparse.ArgumentParser, random_init_help: str) -> None:
    """--model-name, --model-weight and --random-init, as every inference CLI spells them."""
    p.add_argument("--model-name", "--config", dest="config", default=None, help=MODEL_NAME_HELP)
    p.add_argument(
        "--model-weight",
        "--pretrained",
        dest="checkpoint",
        default=None,
        metavar="WEIGHTS",
        help=WEIGHTS_HELP,
    )
    p.add_argument("--random-init", action="store_true", help=random_init_help)


def add_run_options(
    p: argparse.ArgumentParser, workers_help: str = "image decoding processes (default 4)"
) -> None:
    """--workers, --device, --wkv-impl, --cache-dir and --no-progress, as every inference CLI spells them."""
    p.add_argument("--workers", type=int, default=4, help=workers_help)
    p.add_argument("--device", default="auto", help="auto (GPU if present), cpu, cuda or cuda:N")
    p.add_argument(
        "--wkv-impl",
        default="auto",
        metavar="IMPL",
        help="WKV implementation: auto (fla's kernels on a GPU when fla-core imports, else chunked) "
        "or a name from WKV_IMPL_CHOICES in src/open_alip/choices.py (an unknown name is refused "
        "with the list)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="hub cache folder for hf-hub: weights (default: huggingface_hub's, under HF_HOME)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser(
    prog: str,
    description: str,
    epilog: str,
    add_dataset_options: Callable[[argparse.ArgumentParser], None],
    protocols: tuple[tuple[str, ...], str, str] = (
        ("original", "standard", "clip_benchmark"),
        "standard",
        PROTOCOL_HELP,
    ),
) -> argparse.ArgumentParser:
    """The common options, with the CLI's own dataset options placed after --data-root (where --help
    has always listed them); `protocols` is the CLI's (choices, default, help) of --protocol."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog=epilog + WEIGHTS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    add_model_options(
        p,
        "evaluate randomly initialised weights (a baseline); without it a missing --model-weight is an error",
    )
    p.add_argument(
        "--datasets",
        "--dataset",
        dest="datasets",
        nargs="+",
        default=None,
        help="NAME=PATH items (space- or comma-separated); see below",
    )
    p.add_argument(
        "--data-root",
        type=Path,
        default=None,
        help="folder for bare NAME items: torchvision's root for the paper's datasets, else ROOT/NAME",
    )
    add_dataset_options(p)
    p.add_argument("--protocol", choices=protocols[0], default=protocols[1], help=protocols[2])
    p.add_argument(
        "--output-dir",
        "--output",
        dest="output",
        type=Path,
        default=Path("eval_results"),
        help="folder for the per-dataset JSON results, checked writable before anything runs "
        "(default: eval_results)",
    )
    p.add_argument("--batch-size", type=int, default=128, help="images per forward pass (default 128)")
    add_run_options(p)
    return p


def prepare(args: argparse.Namespace, prog: str | None = None, stream=None):
    """Checks that need no model (weights given, output folder writable), then the device and the
    model (src/evaluation/model_loader.py): returns (device, model), and names the config used
    (as `[PROG] model: ...` on `stream`, stdout by default, and as `args.model_label` for the
    results). Raises UserError."""
    import sys

    from src.devices import resolve_device
    from src.evaluation.model_loader import check_weights_given, load_model, model_label
    from src.evaluation.results import check_output_dir

    check_weights_given(args.checkpoint, args.random_init)
    check_output_dir(args.output)
    device = resolve_device(args.device)
    model = load_model(args.config, args.checkpoint, device, args.wkv_impl, args.random_init, args.cache_dir)
    args.model_label = model_label(args.config, model)
    if prog:
        print(
            f"[{prog.removesuffix('.py')}] model: {model.config_source}",
            file=stream or sys.stdout,
            flush=True,
        )
    return device, model


def announce(prog: str, spec: Any) -> None:
    print(f"[{prog.removesuffix('.py')}] {spec.name}: {spec.path}", flush=True)


def record_result(args: argparse.Namespace, prog: str, spec: Any, result: dict, headline: str) -> dict:
    """The result with the model and weights it came from, written to --output-dir as one JSON,
    its skipped images and `headline` printed; returns it."""
    from src.evaluation.images import skip_notice
    from src.evaluation.results import write_classification_details, write_result

    tag = f"[{prog.removesuffix('.py')}]"
    result = {
        "dataset": result.pop("dataset"),
        "model": getattr(args, "model_label", str(args.config)),
        "checkpoint": str(args.checkpoint) if args.checkpoint else None,
        **result,
    }
    if "confusion_matrix" in result:  # a classification with its predictions: the files beside the JSON
        result["files"] = write_classification_details(result, args.output)
    path = write_result(result, args.output)
    for warning in result.get("warnings", []):
        print(f"{tag} {spec.name}: warning: {warning}", file=sys.stderr, flush=True)
    if result.get("skipped_images"):
        print(skip_notice(f"{tag} {spec.name}:", result["skipped_images"]), flush=True)
    if "templates" in result:
        print(
            f"{tag} {spec.name}: {len(result['templates'])} template(s), {result['templates_from']}",
            flush=True,
        )
    if "per_class" in result:
        print(f"{tag} {spec.name}: {per_class_line(result['per_class'])}", flush=True)
    for notice in result.get("notices", []):
        print(f"{tag} {spec.name}: NOTICE: {notice}", flush=True)
    print(f"{tag} {spec.name}: {headline} -> {path}", flush=True)
    for what, where in result.get("files", {}).items():
        print(f"{tag} {spec.name}: {what.replace('_', ' ')}: {where}", flush=True)
    return result


def per_class_line(per_class: list[dict], shown: int = 10) -> str:
    """Each class's top-1 accuracy, or the lowest `shown` of many."""
    scored = [c for c in per_class if c["top1"] is not None]
    if len(scored) > shown:
        scored = sorted(scored, key=lambda c: c["top1"])[:shown]
        head = f"the {shown} lowest of {len(per_class)} classes by top-1"
    else:
        head = "top-1 per class"
    return head + ": " + ", ".join(f"{c['class']} {c['top1']:.1f}% of {c['images']}" for c in scored)
