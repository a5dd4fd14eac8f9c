"""The run's settings, each defined once: `TrainConfig`, and the paper's recipes.

Every field of `TrainConfig` is one setting of a training run, with its name, type, default
and help text (the field's metadata). train.py's command line is generated from these
fields (params.py); a recipe (`RECIPES`) is a set of values for them, chosen with
`--recipe NAME`; params.json and the checkpoints record them. The model's architecture is
apart, in `model` (a resolved model config: the `--config` JSON plus any model flag).

Precedence: a flag given on the command line, else the recipe's value, else the default.

Field names equal train.py's argparse destinations, so code written against the old
`argparse.Namespace` (e.g. an epoch-end hook reading `args.workers`) keeps working.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dataloaders.limits import BACKENDS, DEFAULT_MAX_BAD_RECORDS, READER_WORKERS_HELP
from src.errors import flag_of
from src.open_alip.choices import MIX_IMPLS, WKV_IMPL_CHOICES
from src.training.errors import TrainingError
from src.training.schedule import SCHEDULES

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DECAY_DTYPES = ("fp32", "bf16")

# --- the paper's run ------------------------------------------------------------------------

# The original B/32 run (deepglint/RWKV-CLIP, shell/train_RWKV_CLIP_B32_YFCC15M.sh and the
# defaults of its train.py): 512 per GPU on 8 GPUs. Its optimisation settings are also
# TrainConfig's defaults, so a plain `train.py` optimises as the paper did.
PAPER_PER_GPU_BATCH = 512
PAPER_GPUS = 8
_PAPER_B32: dict[str, Any] = {
    "config": "RWKV_CLIP_B32",
    "global_batch_size": PAPER_PER_GPU_BATCH * PAPER_GPUS,
    "batch_size": None,  # --batch-size auto: what fits this GPU, accumulated up to the global batch
    "epochs": 32,
    "lr": 1e-3,
    "lr_scheduler": "cosine",
    "warmup": 0.1,
    "beta1": 0.9,
    "beta2": 0.98,
    "eps": 1e-8,  # torch's default: the original passes none
    "weight_decay": 0.2,
    "grad_clip_norm": 1.0,
    "precision": "bf16",
    "workers": 10,
    # Fused element-wise kernels: the eager step moves several times the bytes
    # (benchmarks/step_traffic.py). A compiler failure falls back to eager (src/training/loop.py).
    "compile": True,
}


@dataclass(frozen=True)
class Recipe:
    summary: str
    values: Mapping[str, Any]
    # Why changing a setting matters, said when a flag overrides the recipe's value.
    notes: Mapping[str, str] = field(default_factory=dict)
    # Settings a flag may change without a notice: they change speed and memory, not what is
    # trained (the global batch stays the recipe's whatever the micro-batch).
    free: frozenset[str] = frozenset({"batch_size", "workers", "compile", "compile_backend"})

    def as_flags(self) -> str:
        """The recipe as the train.py flags it stands for."""
        return " ".join(_flag(k, v) for k, v in self.values.items())


def _flag(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return flag_of(key) if value else f"--no-{flag_of(key)[2:]}"
    return f"{flag_of(key)} {'auto' if key == 'batch_size' and value is None else value}"


_GLOBAL_BATCH_NOTE = (
    f"({PAPER_PER_GPU_BATCH} per GPU x {PAPER_GPUS} GPUs in the paper's run); the contrastive "
    "batch, and so the results, will differ"
)
RECIPES: dict[str, Recipe] = {
    "rwkv_clip_b32_yfcc15m": Recipe(
        "the paper's B/32 run on YFCC15M, its global batch kept on any number of GPUs",
        _PAPER_B32,
        {"global_batch_size": _GLOBAL_BATCH_NOTE},
    ),
    "rwkv_clip_b16_yfcc15m": Recipe(
        "the B/32 recipe with the B/16 architecture",
        {**_PAPER_B32, "config": "RWKV_CLIP_B16"},
        {"global_batch_size": _GLOBAL_BATCH_NOTE},
    ),
}


# --- the settings ---------------------------------------------------------------------------

# --help's groups, in this order.
GROUPS = RECIPE, DATA, BATCH, OPTIM, SPEED, MODEL, RUN = (
    "recipe",
    "data and output",
    "batch",
    "optimisation",
    "speed",
    "model",
    "checkpoints, logging, evaluation, processes",
)
# Range rules: (test, what the message says).
AT_LEAST_1 = (lambda v: v >= 1, "must be at least 1")
NOT_NEGATIVE = (lambda v: v >= 0, "must not be negative")
FRACTION = (lambda v: 0 <= v < 1, "must be in [0, 1)")


def batch_size_arg(value: str) -> int | None:
    """`--batch-size N` or `--batch-size auto` (None)."""
    if value.strip().lower() == "auto":
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number or auto, got {value!r}") from None


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    group: str,
    aliases: tuple[str, ...] = (),
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    check: tuple[Callable[[Any], bool], str] | None = None,
) -> Any:
    """A TrainConfig field that is also a train.py flag (`--name-with-dashes`), described once.

    `parse` replaces the type taken from the annotation; `check` is a range rule (None passes).
    """
    meta = {
        "help": help,
        "group": group,
        "aliases": aliases,
        "choices": choices,
        "metavar": metavar,
        "parse": parse,
        "check": check,
    }
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class TrainConfig:
    # data and output
    train_data: tuple[str, ...] = setting(
        group=DATA,
        metavar="DATA",
        help="training records: .rec paths or prefixes, folders of .rec/.idx shards, or globs",
    )
    output: Path = setting(group=DATA, help="run folder: checkpoints, logs, params.json, tensorboard/")
    train_num_samples: int | None = setting(
        None,
        group=DATA,
        check=AT_LEAST_1,
        help="samples per epoch; checked against the records (default: all records)",
    )
    workers: int = setting(4, group=DATA, check=AT_LEAST_1, help="loader threads per process")
    data_backend: str = setting(BACKENDS[0], group=DATA, choices=BACKENDS, help="loader implementation")
    reader_workers: int | None = setting(
        None, group=DATA, metavar="N", check=NOT_NEGATIVE, help=READER_WORKERS_HELP
    )
    max_bad_records: int = setting(
        DEFAULT_MAX_BAD_RECORDS,
        group=DATA,
        metavar="N",
        check=NOT_NEGATIVE,
        help="records the loader may skip as undecodable (each is named once in the log and counted in the "
        "log line and metrics.jsonl) before the run stops; 0 stops at the first",
    )
    recipe: str | None = setting(
        None,
        group=RECIPE,
        choices=tuple(RECIPES),
        help="start from a named recipe's settings (flags given beside it win, and a changed one is "
        "announced): " + "; ".join(f"{name}: {r.summary} ({r.as_flags()})" for name, r in RECIPES.items()),
    )
    # batch: see src/training/batching.py for how these three resolve
    batch_size: int | None = setting(
        PAPER_PER_GPU_BATCH,
        group=BATCH,
        metavar="N|auto",
        parse=batch_size_arg,
        check=AT_LEAST_1,
        help="samples per process per micro-batch (with --global-batch-size: the most); auto: on a GPU the "
        "largest micro-batch the cost model predicts fits its memory, with gradient checkpointing when "
        f"that is cheaper than accumulating (the recipes' choice); on a CPU {PAPER_PER_GPU_BATCH}",
    )
    global_batch_size: int | None = setting(
        None,
        group=BATCH,
        metavar="N",
        check=AT_LEAST_1,
        help=f"samples per optimizer step over all processes (the recipes: {_PAPER_B32['global_batch_size']} "
        f"= {PAPER_PER_GPU_BATCH} x {PAPER_GPUS} GPUs)",
    )
    accum_freq: int | None = setting(
        None,
        group=BATCH,
        aliases=("--gradient-acc",),
        check=AT_LEAST_1,
        help="micro-batches per optimizer step (default: 1, or what --global-batch-size needs)",
    )
    # optimisation
    epochs: int = setting(_PAPER_B32["epochs"], group=OPTIM, check=AT_LEAST_1, help="passes over the data")
    max_steps: int | None = setting(
        None,
        group=OPTIM,
        check=AT_LEAST_1,
        help="stop after this many optimizer steps in all (schedule still spans --epochs)",
    )
    lr: float = setting(_PAPER_B32["lr"], group=OPTIM, check=NOT_NEGATIVE, help="peak learning rate")
    lr_scheduler: str = setting(
        _PAPER_B32["lr_scheduler"],
        group=OPTIM,
        choices=SCHEDULES,
        help="cosine (= onecycle): the original's OneCycleLR, cosine rise over --warmup then cosine fall, "
        "beta1 cycling 0.95-0.85; linear: the original's linear decay to 0 without warmup; warmup-cosine / "
        "warmup-linear: linear warmup then cosine / linear decay to 0 (this toolkit's former 'cosine' / "
        "'linear'); const",
    )
    warmup: float = setting(
        _PAPER_B32["warmup"],
        group=OPTIM,
        check=NOT_NEGATIVE,
        help="rise or warmup: a fraction of all steps if < 1, else steps",
    )
    optimizer: str = setting("adamw", group=OPTIM, choices=("adamw",), help="the optimizer")
    beta1: float = setting(
        _PAPER_B32["beta1"],
        group=OPTIM,
        check=FRACTION,
        help="AdamW beta1 (the cosine/onecycle schedule cycles it instead)",
    )
    beta2: float = setting(_PAPER_B32["beta2"], group=OPTIM, check=FRACTION, help="AdamW beta2")
    eps: float = setting(
        _PAPER_B32["eps"],
        group=OPTIM,
        check=NOT_NEGATIVE,
        help="AdamW epsilon (torch's default, as the original)",
    )
    weight_decay: float = setting(
        _PAPER_B32["weight_decay"], group=OPTIM, check=NOT_NEGATIVE, help="AdamW weight decay"
    )
    grad_clip_norm: float = setting(
        _PAPER_B32["grad_clip_norm"], group=OPTIM, help="clip the global gradient norm (<= 0: off)"
    )
    precision: str = setting(
        _PAPER_B32["precision"],
        group=OPTIM,
        choices=PRECISIONS,
        help="bf16: bf16 autocast (the WKV and the loss stay fp32); fp16: autocast + grad scaler; tf32/fp32",
    )
    local_loss: bool = setting(
        False, group=OPTIM, help="each rank computes logits of its own rows against the global batch only"
    )
    gather_with_grad: bool = setting(False, group=OPTIM, help="backpropagate through the feature gather")
    seed: int = setting(0, group=OPTIM, help="random seed (each rank adds its rank)")
    # speed
    wkv_impl: str = setting(
        "auto",
        group=SPEED,
        choices=WKV_IMPL_CHOICES,
        help="WKV implementation (src/open_alip/wkv.py): auto takes fla's Triton kernels on CUDA when "
        "fla-core imports, else chunked (PyTorch); reference is the slow exact recurrence; bi_triton is our "
        "own kernel pair for both directions (reads bf16, less memory traffic; opt-in until timed against "
        "fla)",
    )
    mix_impl: str = setting(
        "torch",
        group=SPEED,
        choices=MIX_IMPLS,
        help="token-shift mixes (src/open_alip/mix.py): torch runs them as eager ops; triton fuses each mix "
        "site into one kernel pair (CUDA; 2.6x less element-wise traffic per B/32 pair by "
        "benchmarks/step_traffic.py; opt-in until timed on a GPU)",
    )
    compile: bool = setting(
        False,
        group=SPEED,
        help="torch.compile the model (DDP included; the recipes: on, --no-compile turns it off); "
        "if the compiler fails the run warns once and continues eagerly",
    )
    compile_backend: str = setting(
        "inductor", group=SPEED, help="torch.compile backend; aot_eager compiles quickly (tests, debugging)"
    )
    # model (the architecture's own flags are params.py's: they are the model JSON's keys)
    config: str = setting(
        _PAPER_B32["config"],
        group=MODEL,
        help="model config: a name (RWKV_CLIP_B32, RWKV_CLIP_B16, RWKV_CLIP_tiny) or a JSON path",
    )
    pretrained: str | None = setting(None, group=MODEL, help="initialise from these weights (not a resume)")
    text_decay_dtype: str = setting(
        "fp32",
        group=MODEL,
        choices=DECAY_DTYPES,
        help="storage of the text tower's time_decay/time_faaaa: fp32 master copies, cast to the compute "
        "dtype in the forward pass (they train); bf16 reproduces the original exactly, where AdamW steps "
        "round away and the decays stay frozen at their initial values",
    )
    # checkpoints, logging, evaluation, processes
    resume: str | None = setting(
        None,
        group=RUN,
        help="'latest' (newest readable checkpoint in --output, if any) or a .pt path; the run continues "
        "with the optimizer and schedule settings given now",
    )
    save_every_n_steps: int = setting(
        2000, group=RUN, check=NOT_NEGATIVE, help="step checkpoint interval (0: epochs only)"
    )
    keep_checkpoints: int = setting(2, group=RUN, help="step checkpoints kept (epoch ones are all kept)")
    log_every_n_steps: int = setting(
        50,
        group=RUN,
        check=AT_LEAST_1,
        help="log line + TensorBoard interval (the loss is read from the device only then)",
    )
    log_every_s: float = setting(
        30.0,
        group=RUN,
        metavar="SECONDS",
        check=NOT_NEGATIVE,
        help="also log about this often, whatever the steps (the first line comes after "
        "the first step, the second about 10 s later); 0: by steps only",
    )
    device: str = setting(
        "auto", group=RUN, help="auto, cpu, cuda (this process's GPU: LOCAL_RANK) or cuda:N"
    )
    dist_timeout: int = setting(
        1800,
        group=RUN,
        metavar="SECONDS",
        check=AT_LEAST_1,
        help="how long a rank waits in a collective (e.g. for an epoch-end evaluation) before failing",
    )
    zeroshot_data: str | None = setting(
        None,
        group=RUN,
        metavar="SPEC",
        help="zero-shot classification set evaluated at epoch ends, as zero_shot.py takes it "
        "(e.g. imagenet=/data/imagenet/val, cifar10=/data/cifar-10-batches-py)",
    )
    zeroshot_frequency: int = setting(1, group=RUN, check=AT_LEAST_1, help="evaluate every N epochs")
    # Not flags: the resolved architecture, and which settings the command line gave (for notices).
    model: dict[str, Any] = field(default_factory=dict)
    given: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (params.json, the checkpoint's "run")."""
        out = asdict(self)
        out["output"] = str(self.output)
        out["train_data"] = list(self.train_data)
        out["given"] = sorted(self.given)
        return out


def settings() -> list[dataclasses.Field]:
    """The fields that are train.py flags, in --help's order."""
    return [f for f in dataclasses.fields(TrainConfig) if "help" in f.metadata]


# --- resolving a command line ---------------------------------------------------------------


def _check_ranges(values: Mapping[str, Any]) -> None:
    """Impossible values, one clear sentence each. A float must be finite (train.py's parser refuses
    inf and nan already, src/errors.py finite_float; a recipe or a caller's value is checked here)."""
    for f in settings():
        rule, value = f.metadata["check"], values[f.name]
        if isinstance(value, float) and not math.isfinite(value):
            raise TrainingError(f"{flag_of(f.name)} {value}: must be a finite number")
        if rule is not None and value is not None and not rule[0](value):
            raise TrainingError(f"{flag_of(f.name)} {value}: {rule[1]}")


def _check_output(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise TrainingError(f"--output {output} is a file; pass a folder for the run's checkpoints and logs")


def resolve_model(config: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The architecture: the --config JSON (or name) with the model flags given."""
    from src.open_alip.model import get_model_config

    try:
        cfg = get_model_config(config, **overrides)
    except (FileNotFoundError, ValueError) as exc:
        key = getattr(exc, "key", None)
        if key in overrides:  # a model flag's value: name the flag, not the config
            reason = str(exc).split(": ", 1)[-1]
            raise TrainingError(f"{flag_of(key)} {overrides[key]}: {reason}") from None
        raise TrainingError(f"--config {config}: {exc}") from None
    if cfg["image_embed_dims"] != cfg["n_embd"]:
        raise TrainingError(
            f"--image-embed-dims {cfg['image_embed_dims']} differs from --n-embd {cfg['n_embd']}: "
            "the towers must be equally wide"
        )
    return cfg


def build_config(given: Mapping[str, Any], model_overrides: dict[str, Any]) -> TrainConfig:
    """The settings given on the command line over the recipe's over the defaults, validated
    (TrainingError if wrong). `given` holds only the settings the command line named."""
    recipe = RECIPES[given["recipe"]].values if given.get("recipe") else {}
    defaults = {f.name: f.default for f in settings() if f.default is not dataclasses.MISSING}
    values = {**defaults, **recipe, **given}
    _check_ranges(values)
    values["output"] = Path(values["output"])
    _check_output(values["output"])
    values["train_data"] = tuple(values["train_data"])
    return TrainConfig(
        **values, model=resolve_model(values["config"], model_overrides), given=frozenset(given)
    )


def recipe_notices(cfg: TrainConfig) -> list[str]:
    """A sentence for each recipe value a flag replaced (the launcher prints them, the run logs them)."""
    if cfg.recipe is None:
        return []
    recipe = RECIPES[cfg.recipe]
    notices = []
    for name, value in recipe.values.items():
        now = getattr(cfg, name)
        if name in cfg.given and name not in recipe.free and now != value:
            note = recipe.notes.get(name)
            notices.append(
                f"{flag_of(name)} {now} replaces the recipe's {value}" + (f" {note}" if note else "")
            )
    return notices
