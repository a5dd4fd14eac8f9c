"""Command-line parameters of train.py and their resolution against a model JSON.

Precedence, lowest first: the model config named by `--config` (a built-in name or a
JSON path), then any model flag given on the command line. Model flags default to
None so that "not given" and "given the default value" stay distinguishable.
"""

from __future__ import annotations

import argparse
from typing import Any

from src.training.errors import TrainingError
from src.training.schedule import SCHEDULES

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

# (flag, type, help). Every one of these is a key of the model JSON (docs/model.md).
_MODEL_FLAGS: list[tuple[str, Any, str]] = [
    ("--input-size", int, "image side in pixels (224)"),
    ("--image-depth", int, "image tower blocks"),
    ("--image-embed-dims", int, "image tower width; must equal --n-embd"),
    ("--image-patch-size", int, "patch side: 32 for B/32, 16 for B/16"),
    ("--image-hidden-rate", int, "image channel-mix expansion"),
    ("--image-num-heads", int, "image attention heads"),
    ("--drop-path-rate", float, "stochastic depth of the image tower"),
    ("--ctx-len", int, "text length in tokens (77)"),
    ("--vocab-size", int, "text vocabulary (49408)"),
    ("--head-size", int, "text head size"),
    ("--head-size-divisor", int, "text GroupNorm eps divisor"),
    ("--n-layer", int, "text tower blocks"),
    ("--n-embd", int, "text tower width"),
    ("--dim-att", int, "text attention width (0: n_embd)"),
    ("--dim-ffn", int, "text channel-mix width (0: 3.5 x n_embd)"),
    ("--text-num-head", int, "text heads (0: from --head-size)"),
    ("--pos-emb", int, "kept for compatibility with the original (0)"),
    ("--head-qk", int, "kept for compatibility with the original (0)"),
    ("--tiny-att-dim", int, "kept for compatibility with the original (0)"),
    ("--tiny-att-layer", int, "kept for compatibility with the original (-999)"),
    ("--dropout", float, "text dropout (0.0)"),
]
_MODEL_BOOL_FLAGS: list[tuple[str, str, str]] = [
    ("--text-initialization", "text_initialization", "re-initialise the text tower as the original (True)"),
    ("--image-output-cls-token", "image_output_cls_token", "kept for compatibility (False)"),
    ("--image-with-cls-token", "image_with_cls_token", "kept for compatibility (False)"),
    ("--grad-checkpointing", "with_cp", "gradient checkpointing: less memory, ~30%% more compute"),
]
# Alias of the original repository: `--open-checkpoint True`.
_ALIASES = {"--open-checkpoint": "with_cp"}

MODEL_KEYS = tuple(f[0][2:].replace("-", "_") for f in _MODEL_FLAGS) + tuple(f[1] for f in _MODEL_BOOL_FLAGS)


def str2bool(value: str) -> bool:
    """The original passes booleans as the strings True/False; accept the usual spellings."""
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "y", "on"):
        return True
    if v in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train.py",
        description=(
            "Train RWKV-CLIP on RecordIO shards written by data2rec.py. Run it with torchrun for "
            "several GPUs or nodes (NCCL on GPUs, gloo on CPUs), or as a plain `python train.py` "
            "for one process. Model hyper-parameters come from --config; any model flag given "
            "overrides the config's value."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        allow_abbrev=False,
    )
    g = p.add_argument_group("data and output")
    g.add_argument("--train-data", required=True, nargs="+", metavar="DATA",
                   help="training records: .rec paths or prefixes, folders of .rec/.idx shards, or globs")
    g.add_argument("--train-num-samples", type=int, default=None,
                   help="samples per epoch; checked against the records (default: all records)")
    g.add_argument("--output", required=True, help="run folder: checkpoints, logs, params.json, tensorboard/")
    g.add_argument("--workers", type=int, default=None, help="loader threads per process (default: config's or 4)")
    g.add_argument("--data-backend", choices=("dali", "torch"), default="dali", help="loader implementation")

    g = p.add_argument_group("optimisation")
    g.add_argument("--batch-size", type=int, default=512, help="batch per process (per GPU) per micro-step")
    g.add_argument("--accum-freq", "--gradient-acc", dest="accum_freq", type=int, default=1,
                   help="micro-batches per optimizer step; the loss contrasts all of them together")
    g.add_argument("--epochs", type=int, default=32)
    g.add_argument("--max-steps", type=int, default=None,
                   help="stop after this many optimizer steps in all (schedule still spans --epochs)")
    g.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    g.add_argument("--lr-scheduler", choices=SCHEDULES, default="cosine",
                   help="cosine/linear: linear warmup then decay to 0; onecycle: the original's OneCycleLR")
    g.add_argument("--warmup", type=float, default=0.1, help="warmup: a fraction of all steps if < 1, else steps")
    g.add_argument("--optimizer", choices=("adamw",), default="adamw")
    g.add_argument("--beta1", type=float, default=0.9, help="AdamW beta1")
    g.add_argument("--beta2", type=float, default=0.98, help="AdamW beta2")
    g.add_argument("--eps", type=float, default=1e-6, help="AdamW epsilon")
    g.add_argument("--weight-decay", type=float, default=0.2)
    g.add_argument("--grad-clip-norm", type=float, default=1.0, help="clip the global gradient norm (<= 0: off)")
    g.add_argument("--precision", choices=PRECISIONS, default=None,
                   help="bf16: bf16 autocast; fp16: autocast + grad scaler; tf32/fp32 (default: config's)")
    g.add_argument("--local-loss", action="store_true",
                   help="each rank computes logits of its own rows against the global batch only")
    g.add_argument("--gather-with-grad", action="store_true", help="backpropagate through the feature gather")
    g.add_argument("--compile", action="store_true", help="torch.compile the model")
    g.add_argument("--seed", type=int, default=0)

    g = p.add_argument_group("model")
    g.add_argument("--config", default="RWKV_CLIP_B32",
                   help="model config: a name (RWKV_CLIP_B32, RWKV_CLIP_B16, RWKV_CLIP_tiny) or a JSON path")
    g.add_argument("--pretrained", default=None, help="initialise from these weights (not a resume)")
    for flag, typ, help_ in _MODEL_FLAGS:
        g.add_argument(flag, type=typ, default=None, help=help_ + " (default: config's)")
    for flag, dest, help_ in _MODEL_BOOL_FLAGS:
        g.add_argument(flag, dest=dest, type=str2bool, default=None, metavar="BOOL", help=help_)
    for flag, dest in _ALIASES.items():
        g.add_argument(flag, dest=dest, type=str2bool, default=None, metavar="BOOL", help=argparse.SUPPRESS)

    g = p.add_argument_group("checkpoints, logging, evaluation")
    g.add_argument("--resume", default=None, help="'latest' (newest checkpoint in --output, if any) or a .pt path")
    g.add_argument("--save-every-n-steps", type=int, default=2000, help="step checkpoint interval (0: epochs only)")
    g.add_argument("--keep-checkpoints", type=int, default=2, help="step checkpoints kept (epoch ones are all kept)")
    g.add_argument("--log-every-n-steps", type=int, default=50, help="log line + TensorBoard interval")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda (this process's GPU: LOCAL_RANK) or cuda:N")
    g.add_argument("--zeroshot-data", default=None, metavar="SPEC",
                   help="zero-shot classification set evaluated at epoch ends, as zero_shot.py takes it "
                        "(e.g. imagenet=/data/imagenet/val, cifar10=/data/cifar-10-batches-py)")
    g.add_argument("--zeroshot-frequency", type=int, default=1, help="evaluate every N epochs")
    return p


def model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The model keys given explicitly on the command line."""
    return {k: getattr(args, k) for k in MODEL_KEYS if getattr(args, k, None) is not None}


def check_args(args: argparse.Namespace) -> None:
    """Reject impossible values with one clear sentence each (TrainingError)."""
    positive = ("batch_size", "accum_freq", "epochs", "log_every_n_steps", "zeroshot_frequency")
    for name in positive:
        if getattr(args, name) < 1:
            raise TrainingError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    for name in ("lr", "weight_decay", "save_every_n_steps"):
        if getattr(args, name) < 0:
            raise TrainingError(f"--{name.replace('_', '-')} {getattr(args, name)}: must not be negative")
    if args.max_steps is not None and args.max_steps < 1:
        raise TrainingError(f"--max-steps {args.max_steps}: must be at least 1")
    if args.train_num_samples is not None and args.train_num_samples < 1:
        raise TrainingError(f"--train-num-samples {args.train_num_samples}: must be at least 1")
    if args.warmup < 0:
        raise TrainingError(f"--warmup {args.warmup}: must not be negative")
    if args.workers is not None and args.workers < 1:
        raise TrainingError(f"--workers {args.workers}: must be at least 1")


def resolve_model_config(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    """Model config = `base` (the --config JSON) updated with explicit flags."""
    cfg = dict(base)
    cfg.update(model_overrides(args))
    if args.precision is not None:
        cfg["precision"] = args.precision
    cfg.setdefault("precision", "bf16")
    if cfg["precision"] not in PRECISIONS:
        raise TrainingError(f"precision {cfg['precision']!r} in the config: use one of {', '.join(PRECISIONS)}")
    if args.workers is not None:
        cfg["workers"] = args.workers
    e_img, e_txt = cfg.get("image_embed_dims"), cfg.get("n_embd")
    if e_img is not None and e_txt is not None and e_img != e_txt:
        raise TrainingError(f"--image-embed-dims {e_img} differs from --n-embd {e_txt}: the towers must be equally wide")
    return cfg


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    return args
