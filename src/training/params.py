"""train.py's command line, parsed once into a `TrainConfig` (config.py).

The model's architecture comes from `--config` (a shipped name or a JSON path); any model
flag given on the command line overrides the JSON's value. Model flags default to None
so that "not given" and "given the default value" stay distinguishable. Everything else
is a run setting and lives in TrainConfig, never in the model config.
"""

from __future__ import annotations

import argparse
from typing import Any

from src.open_alip.wkv import WKV_IMPL_CHOICES
from src.training.batching import AUTO_CPU_BATCH
from src.training.config import DECAY_DTYPES, DEFAULT_MAX_BAD_RECORDS, PRECISIONS, TrainConfig, build_config
from src.training.schedule import SCHEDULES

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


def _batch_size(value: str) -> int | None:
    """`--batch-size N` or `--batch-size auto` (None)."""
    if value.strip().lower() == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or auto, got {value!r}") from None


def str2bool(value: str) -> bool:
    """The original passes booleans as the strings True/False; accept the usual spellings."""
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "y", "on"):
        return True
    if v in ("0", "false", "no", "n", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected True or False, got {value!r}")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default only where there is one to show (None: the help says what happens)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train.py",
        description=(
            "Train RWKV-CLIP on RecordIO shards written by data2rec.py. Run it with torchrun for "
            "several GPUs or nodes (NCCL on GPUs, gloo on CPUs), or as a plain `python train.py` "
            "for one process. The architecture comes from --config; any model flag given "
            "overrides the config's value. Defaults are the original B/32 recipe's."
        ),
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    g = p.add_argument_group("data and output")
    g.add_argument("--train-data", required=True, nargs="+", metavar="DATA",
                   help="training records: .rec paths or prefixes, folders of .rec/.idx shards, or globs")
    g.add_argument("--train-num-samples", type=int, default=None,
                   help="samples per epoch; checked against the records (default: all records)")
    g.add_argument("--output", required=True, help="run folder: checkpoints, logs, params.json, tensorboard/")
    g.add_argument("--workers", type=int, default=4, help="loader threads per process")
    g.add_argument("--data-backend", choices=("dali", "torch"), default="dali", help="loader implementation")
    g.add_argument("--max-bad-records", type=int, default=DEFAULT_MAX_BAD_RECORDS, metavar="N",
                   help="records the loader may skip as undecodable (each is named once in the log and "
                        "counted in the log line and metrics.jsonl) before the run stops; 0 stops at the first")

    g = p.add_argument_group(
        "batch",
        "The loss contrasts the whole global batch of an optimizer step. With --global-batch-size, each "
        "process takes global/processes samples per step, in as few equal micro-batches of at most "
        "--batch-size as divide it (gradient accumulation): the same recipe on 1 GPU or 8. Without it, "
        "the global batch is --batch-size x processes x --accum-freq.",
    )
    g.add_argument("--batch-size", type=_batch_size, default=512, metavar="N|auto",
                   help="samples per process per micro-batch (with --global-batch-size: the most); auto: on a GPU "
                        "the largest micro-batch the cost model predicts fits its memory, with gradient "
                        "checkpointing when that is cheaper than accumulating (the launch scripts' choice); "
                        f"on a CPU {AUTO_CPU_BATCH}")
    g.add_argument("--global-batch-size", type=int, default=None, metavar="N",
                   help="samples per optimizer step over all processes (the B/32 recipe: 4096 = 512 x 8 GPUs)")
    g.add_argument("--accum-freq", "--gradient-acc", dest="accum_freq", type=int, default=None,
                   help="micro-batches per optimizer step (default: 1, or what --global-batch-size needs)")

    g = p.add_argument_group("optimisation")
    g.add_argument("--epochs", type=int, default=32)
    g.add_argument("--max-steps", type=int, default=None,
                   help="stop after this many optimizer steps in all (schedule still spans --epochs)")
    g.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    g.add_argument("--lr-scheduler", choices=SCHEDULES, default="cosine",
                   help="cosine (= onecycle): the original's OneCycleLR, cosine rise over --warmup then cosine "
                        "fall, beta1 cycling 0.95-0.85; linear: the original's linear decay to 0 without "
                        "warmup; warmup-cosine / warmup-linear: linear warmup then cosine / linear decay to 0 "
                        "(this toolkit's former 'cosine' / 'linear'); const")
    g.add_argument("--warmup", type=float, default=None,
                   help="rise or warmup: a fraction of all steps if < 1, else steps (default 0.1)")
    g.add_argument("--optimizer", choices=("adamw",), default="adamw")
    g.add_argument("--beta1", type=float, default=None,
                   help="AdamW beta1 (default 0.9; the cosine/onecycle schedule cycles it instead)")
    g.add_argument("--beta2", type=float, default=0.98, help="AdamW beta2")
    g.add_argument("--eps", type=float, default=1e-8, help="AdamW epsilon (torch's default, as the original)")
    g.add_argument("--weight-decay", type=float, default=0.2)
    g.add_argument("--grad-clip-norm", type=float, default=1.0, help="clip the global gradient norm (<= 0: off)")
    g.add_argument("--precision", choices=PRECISIONS, default="bf16",
                   help="bf16: bf16 autocast (the WKV and the loss stay fp32); fp16: autocast + grad scaler; "
                        "tf32/fp32")
    g.add_argument("--local-loss", action="store_true",
                   help="each rank computes logits of its own rows against the global batch only")
    g.add_argument("--gather-with-grad", action="store_true", help="backpropagate through the feature gather")
    g.add_argument("--seed", type=int, default=0)

    g = p.add_argument_group("speed")
    g.add_argument("--wkv-impl", choices=WKV_IMPL_CHOICES, default="auto",
                   help="WKV implementation (src/open_alip/wkv.py): auto takes fla's Triton kernels on CUDA when "
                        "fla-core imports, else chunked (PyTorch); reference is the slow exact recurrence; "
                        "bi_triton is our own kernel pair for both directions (reads bf16, less memory traffic; "
                        "opt-in until timed against fla)")
    g.add_argument("--compile", action="store_true", help="torch.compile the model (DDP included)")
    g.add_argument("--compile-backend", default="inductor",
                   help="torch.compile backend; aot_eager compiles quickly (tests, debugging)")

    g = p.add_argument_group("model")
    g.add_argument("--config", default="RWKV_CLIP_B32",
                   help="model config: a name (RWKV_CLIP_B32, RWKV_CLIP_B16, RWKV_CLIP_tiny) or a JSON path")
    g.add_argument("--pretrained", default=None, help="initialise from these weights (not a resume)")
    g.add_argument("--text-decay-dtype", choices=DECAY_DTYPES, default="fp32",
                   help="storage of the text tower's time_decay/time_faaaa: fp32 master copies, cast to the "
                        "compute dtype in the forward pass (they train); bf16 reproduces the original exactly, "
                        "where AdamW steps round away and the decays stay frozen at their initial values")
    for flag, typ, help_ in _MODEL_FLAGS:
        g.add_argument(flag, type=typ, default=None, help=help_ + " (default: config's)")
    for flag, dest, help_ in _MODEL_BOOL_FLAGS:
        g.add_argument(flag, dest=dest, type=str2bool, default=None, metavar="BOOL", help=help_)
    for flag, dest in _ALIASES.items():
        g.add_argument(flag, dest=dest, type=str2bool, default=None, metavar="BOOL", help=argparse.SUPPRESS)

    g = p.add_argument_group("checkpoints, logging, evaluation, processes")
    g.add_argument("--resume", default=None,
                   help="'latest' (newest readable checkpoint in --output, if any) or a .pt path; the run "
                        "continues with the optimizer and schedule settings given now")
    g.add_argument("--save-every-n-steps", type=int, default=2000, help="step checkpoint interval (0: epochs only)")
    g.add_argument("--keep-checkpoints", type=int, default=2, help="step checkpoints kept (epoch ones are all kept)")
    g.add_argument("--log-every-n-steps", type=int, default=50,
                   help="log line + TensorBoard interval (the loss is read from the device only then)")
    g.add_argument("--device", default="auto", help="auto, cpu, cuda (this process's GPU: LOCAL_RANK) or cuda:N")
    g.add_argument("--dist-timeout", type=int, default=1800, metavar="SECONDS",
                   help="how long a rank waits in a collective (e.g. for an epoch-end evaluation) before failing")
    g.add_argument("--zeroshot-data", default=None, metavar="SPEC",
                   help="zero-shot classification set evaluated at epoch ends, as zero_shot.py takes it "
                        "(e.g. imagenet=/data/imagenet/val, cifar10=/data/cifar-10-batches-py)")
    g.add_argument("--zeroshot-frequency", type=int, default=1, help="evaluate every N epochs")
    return p


def model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The model keys given explicitly on the command line."""
    return {k: getattr(args, k) for k in MODEL_KEYS if getattr(args, k, None) is not None}


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Parse and resolve the command line. argparse errors exit 2; bad values raise TrainingError."""
    args = build_parser().parse_args(argv)
    return build_config(args, model_overrides(args))
