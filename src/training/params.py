"""train.py's command line, generated from `TrainConfig` (config.py) and parsed once into one.

Each TrainConfig setting is the flag `--name-with-dashes`, with the field's type, default and
help text. Its parser default is SUPPRESS, so the parsed namespace holds only the settings the
command line gave; config.build_config lays them over the recipe's values and the defaults.

The model's architecture comes from `--config` (a shipped name or a JSON path); any model
flag given on the command line overrides the JSON's value. Model flags are the model JSON's
keys (docs/model.md), not run settings; they default to None so that "not given" and "given
the default value" stay distinguishable.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any

from src.errors import finite_float
from src.training.config import BATCH, GROUPS, MODEL, TrainConfig, build_config, flag_of, settings

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


_GROUP_HELP = {
    BATCH: "The loss contrasts the whole global batch of an optimizer step. With --global-batch-size, each "
    "process takes global/processes samples per step, in as few equal micro-batches of at most "
    "--batch-size as divide it (gradient accumulation): the same recipe on 1 GPU or 8. Without it, "
    "the global batch is --batch-size x processes x --accum-freq.",
}


def _arg_type(hint: Any) -> tuple[Any, str | None]:
    """(argparse type, nargs) of a field's annotation: `int | None` is int, `tuple[str, ...]` one or more."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], "+"
    return hint, None


def _help(f: dataclasses.Field) -> str:
    text = f.metadata["help"].replace("%", "%%")
    shown = f.default is not dataclasses.MISSING and f.default is not None and f.default is not False
    return f"{text} (default: {f.default})" if shown else text


def _add_setting(group: argparse._ArgumentGroup, f: dataclasses.Field, hint: Any, required: bool) -> None:
    meta = f.metadata
    kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": _help(f)}
    kind, nargs = _arg_type(hint)
    if kind is bool:
        # --no-X too: a recipe may switch a setting on (--compile) that a flag turns off.
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        if kind is float:
            kind = finite_float
        kwargs.update(
            type=meta["parse"] or kind, nargs=nargs, choices=meta["choices"], metavar=meta["metavar"]
        )
    group.add_argument(flag_of(f.name), *meta["aliases"], required=required, **kwargs)


def _add_model_flags(g: argparse._ArgumentGroup) -> None:
    for flag, typ, help_ in _MODEL_FLAGS:
        g.add_argument(
            flag,
            type=finite_float if typ is float else typ,
            default=None,
            help=help_ + " (default: config's)",
        )
    for flag, dest, help_ in _MODEL_BOOL_FLAGS:
        g.add_argument(flag, dest=dest, type=str2bool, default=None, metavar="BOOL", help=help_)
    for flag, dest in _ALIASES.items():
        g.add_argument(flag, dest=dest, type=str2bool, default=None, metavar="BOOL", help=argparse.SUPPRESS)


def build_parser(*, data_required: bool = True) -> argparse.ArgumentParser:
    """train.py's parser. `data_required=False`: --train-data may be left out (the launcher, which
    finds the records under DATA_ROOT then)."""
    p = argparse.ArgumentParser(
        prog="train.py",
        description=(
            "Train RWKV-CLIP on RecordIO shards written by data2rec.py. Run it with torchrun for "
            "several GPUs or nodes (NCCL on GPUs, gloo on CPUs), or as a plain `python train.py` "
            "for one process. The architecture comes from --config; any model flag given "
            "overrides the config's value. The optimisation defaults are the paper's B/32 run's; "
            "--recipe adds its global batch and the rest of its settings."
        ),
        allow_abbrev=False,
    )
    groups = {name: p.add_argument_group(name, _GROUP_HELP.get(name)) for name in GROUPS}
    hints = typing.get_type_hints(TrainConfig)
    for f in settings():
        required = f.default is dataclasses.MISSING and (data_required or f.name != "train_data")
        _add_setting(groups[f.metadata["group"]], f, hints[f.name], required)
    _add_model_flags(groups[MODEL])
    return p


def model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The model keys given explicitly on the command line."""
    return {k: getattr(args, k) for k in MODEL_KEYS if getattr(args, k, None) is not None}


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig settings the command line gave (the others are absent: SUPPRESS)."""
    return {f.name: getattr(args, f.name) for f in settings() if hasattr(args, f.name)}


def resolve(args: argparse.Namespace, **missing: Any) -> TrainConfig:
    """The TrainConfig of a parsed command line; `missing` fills settings it left out (the
    launcher's --train-data). Bad values raise TrainingError."""
    return build_config({**missing, **given_settings(args)}, model_overrides(args))


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Parse and resolve the command line. argparse errors exit 2; bad values raise TrainingError."""
    return resolve(build_parser().parse_args(argv))
