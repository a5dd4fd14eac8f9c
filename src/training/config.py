"""The run's settings: one typed object, built once from the command line and passed down.

`TrainConfig` holds every setting of a training run except the model's architecture,
which lives in `model` (a resolved model config: the `--config` JSON plus any model flag).
The loader, the optimizer, the schedule and the checkpoints all read from it; nothing
reaches them through the model config.

Field names equal train.py's argparse destinations, so code written against the old
`argparse.Namespace` (e.g. an epoch-end hook reading `args.workers`) keeps working.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dataloaders.base import DEFAULT_MAX_BAD_RECORDS
from src.training.errors import TrainingError

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DECAY_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class TrainConfig:
    # data and output
    train_data: tuple[str, ...]
    output: Path
    train_num_samples: int | None = None
    workers: int = 4
    data_backend: str = "dali"
    max_bad_records: int = DEFAULT_MAX_BAD_RECORDS
    # model
    config: str = "RWKV_CLIP_B32"
    model: dict[str, Any] = field(default_factory=dict)  # the resolved architecture
    pretrained: str | None = None
    text_decay_dtype: str = "fp32"
    wkv_impl: str = "auto"
    # batch: see src/training/batching.py for how these three resolve
    batch_size: int | None = 512  # None: --batch-size auto (the cost model's choice on a GPU)
    global_batch_size: int | None = None
    accum_freq: int | None = None
    # optimisation
    epochs: int = 32
    max_steps: int | None = None
    lr: float = 1e-3
    lr_scheduler: str = "cosine"
    warmup: float = 0.1
    optimizer: str = "adamw"
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 0.2
    grad_clip_norm: float = 1.0
    precision: str = "bf16"
    local_loss: bool = False
    gather_with_grad: bool = False
    seed: int = 0
    compile: bool = False
    compile_backend: str = "inductor"
    # process group, checkpoints, logging, evaluation
    device: str = "auto"
    dist_timeout: int = 1800
    resume: str | None = None
    save_every_n_steps: int = 2000
    keep_checkpoints: int = 2
    log_every_n_steps: int = 50
    zeroshot_data: str | None = None
    zeroshot_frequency: int = 1
    # Which optimisation settings were given on the command line (for notices).
    given: frozenset[str] = frozenset()

    def to_json(self) -> dict[str, Any]:
        """Plain JSON values (params.json, the checkpoint's "run")."""
        out = asdict(self)
        out["output"] = str(self.output)
        out["train_data"] = list(self.train_data)
        out["given"] = sorted(self.given)
        return out


# Settings whose omission means "the default"; kept apart so that notices can tell a
# value the user chose from one the run filled in.
_NONE_DEFAULTS = {"warmup": 0.1, "beta1": 0.9}


def _check_ranges(args: argparse.Namespace) -> None:
    """Impossible values, one clear sentence each."""
    for name in ("batch_size", "epochs", "log_every_n_steps", "zeroshot_frequency", "workers", "dist_timeout"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise TrainingError(f"--{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    for name in ("accum_freq", "global_batch_size", "max_steps", "train_num_samples"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise TrainingError(f"--{name.replace('_', '-')} {value}: must be at least 1")
    for name in ("lr", "weight_decay", "save_every_n_steps", "max_bad_records", "eps"):
        if getattr(args, name) < 0:
            raise TrainingError(f"--{name.replace('_', '-')} {getattr(args, name)}: must not be negative")
    if args.warmup is not None and args.warmup < 0:
        raise TrainingError(f"--warmup {args.warmup}: must not be negative")
    for name in ("beta1", "beta2"):
        value = getattr(args, name)
        if value is not None and not 0 <= value < 1:
            raise TrainingError(f"--{name} {value}: must be in [0, 1)")


def _check_output(output: Path) -> None:
    if output.exists() and not output.is_dir():
        raise TrainingError(f"--output {output} is a file; pass a folder for the run's checkpoints and logs")


def resolve_model(args: argparse.Namespace, overrides: dict[str, Any]) -> dict[str, Any]:
    """The architecture: the --config JSON (or name) with the model flags given."""
    from src.open_alip.model import get_model_config

    try:
        cfg = get_model_config(args.config, **overrides)
    except (FileNotFoundError, ValueError) as exc:
        raise TrainingError(f"--config {args.config}: {exc}") from exc
    if cfg["image_embed_dims"] != cfg["n_embd"]:
        raise TrainingError(
            f"--image-embed-dims {cfg['image_embed_dims']} differs from --n-embd {cfg['n_embd']}: "
            "the towers must be equally wide"
        )
    return cfg


def build_config(args: argparse.Namespace, model_overrides: dict[str, Any]) -> TrainConfig:
    """Validate the parsed command line and resolve it into a TrainConfig (TrainingError if wrong)."""
    _check_ranges(args)
    output = Path(args.output)
    _check_output(output)
    given = frozenset(name for name in _NONE_DEFAULTS if getattr(args, name) is not None)
    values = {name: (default if getattr(args, name) is None else getattr(args, name))
              for name, default in _NONE_DEFAULTS.items()}
    plain = {f for f in TrainConfig.__dataclass_fields__ if f not in ("model", "given", "output", "train_data")}
    kwargs = {name: getattr(args, name) for name in plain if name not in values}
    return TrainConfig(
        train_data=tuple(args.train_data),
        output=output,
        model=resolve_model(args, model_overrides),
        given=given,
        **values,
        **kwargs,
    )
