"""RWKV-CLIP: the two towers, model configs and checkpoint loading.

    model = create_model("RWKV_CLIP_B32", pretrained="RWKV-CLIP-B32-YFCC15M.pt")
    image_features, text_features, logit_scale = model(images, tokens)

As in open_clip, `model(image, text)` returns L2-normalised features and exp(logit_scale), and
`encode_image` / `encode_text` return raw embeddings unless given `normalize=True`. The trainer asks
for raw ones (`normalize=False`): its loss normalises them in float32 (loss.py). docs/model.md lists
the open_clip conventions this class follows and the few it cannot.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ModelConfigError
from .mix import check_mix_impl
from .paths import not_a_file
from .rwkv6 import TimeMix
from .text_rwkv import TextRWKV
from .vision_rwkv import VisionRWKV
from .wkv import WKV_IMPL_CHOICES

CONFIG_DIR = Path(__file__).resolve().parent / "model_configs"

# Keys every model config must give (they fix tensor shapes).
REQUIRED_KEYS = (
    "input_size",
    "image_depth",
    "image_embed_dims",
    "image_patch_size",
    "image_hidden_rate",
    "image_num_heads",
    "ctx_len",
    "vocab_size",
    "head_size",
    "n_layer",
    "n_embd",
)
# Optional keys with the released models' values; 0 for dim_att / dim_ffn means "derive".
DEFAULTS: dict[str, Any] = {
    "image_output_cls_token": False,
    "image_with_cls_token": False,
    "drop_path_rate": 0.0,
    "head_size_divisor": 8,
    "dim_att": 0,
    "dim_ffn": 0,
    "text_num_head": 0,
    "pos_emb": 0,
    "head_qk": 0,
    "tiny_att_dim": 0,
    "tiny_att_layer": -999,
    "dropout": 0.0,
    "with_cp": False,
    "text_initialization": True,
}
# Run settings that older configs and checkpoints carry beside the architecture (the original
# kept everything in one namespace). They are dropped on reading: the trainer owns them now.
RUN_SETTING_KEYS = ("precision", "workers", "data_type")


class CheckpointMismatchError(RuntimeError):
    """A checkpoint whose tensors do not fit the model (names the offending keys); `counts` is
    (missing, unexpected, mis-shaped) where known."""

    counts: tuple[int, int, int] | None = None


def list_models() -> list[str]:
    """Names of the shipped model configs (usable with `get_model_config`/`create_model`)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def _read_config(source: str | os.PathLike) -> dict[str, Any]:
    name = str(source)
    path = CONFIG_DIR / f"{name}.json" if name in list_models() else Path(name)
    if not path.is_file():
        raise FileNotFoundError(
            f"model config {name!r} is neither a shipped model ({', '.join(list_models())}) nor a JSON file"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"model config {path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"model config {path} must hold a JSON object")
    return unwrap_config(data)


def unwrap_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """The architecture inside a file that holds more: train.py's params.json keeps it under
    "model", open_clip's open_clip_config.json (and this project's hub export) under "model_cfg"."""
    for key in ("model", "model_cfg"):
        inner = data.get(key)
        if isinstance(inner, Mapping) and not any(k in data for k in REQUIRED_KEYS):
            return dict(inner)
    return dict(data)


def get_model_config(config: str | os.PathLike | Mapping[str, Any], **overrides: Any) -> dict[str, Any]:
    """Resolve a shipped name, a JSON path or a dict into a complete config dict.

    Missing optional keys take the released defaults; `dim_att` and `dim_ffn` given
    as 0 are derived (n_embd and int(n_embd * 3.5 // 32 * 32)); `overrides` replace
    values (unknown override keys are an error, to catch typos). The run settings of
    older configs (RUN_SETTING_KEYS) are dropped without a word.
    """
    cfg = unwrap_config(config) if isinstance(config, Mapping) else _read_config(config)
    for key in RUN_SETTING_KEYS:
        cfg.pop(key, None)
    known = set(REQUIRED_KEYS) | set(DEFAULTS)
    run_keys = sorted(set(overrides) & set(RUN_SETTING_KEYS))
    if run_keys:
        raise ValueError(f"{run_keys} are run settings, not model config keys; give them to the trainer")
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown model config key(s) {unknown}; known keys: {sorted(known)}")
    cfg.update(overrides)
    missing = [k for k in REQUIRED_KEYS if k not in cfg]
    if missing:
        raise ValueError(f"model config lacks required key(s) {missing}")
    for key, value in DEFAULTS.items():
        cfg.setdefault(key, value)
    _check_values(cfg)
    if not cfg["dim_att"]:
        cfg["dim_att"] = cfg["n_embd"]
    if not cfg["dim_ffn"]:
        cfg["dim_ffn"] = int((cfg["n_embd"] * 3.5) // 32 * 32)
    # Features of the original code base that the released models never use.
    if cfg["head_qk"] or cfg["tiny_att_dim"] > 0 or cfg["pos_emb"]:
        raise ValueError("head_qk, tiny_att_dim and pos_emb are not supported (the released models use 0)")
    # The original enables the cls token only for the *string* "True", which a JSON
    # bool never equals: the released models have none. Mirror that for bools.
    if cfg["image_with_cls_token"] == "True":
        raise ValueError(
            "image_with_cls_token 'True' (a cls token) is not supported; the released models use none"
        )
    cfg["image_with_cls_token"] = False
    return cfg


# What each value must be, checked when a config is resolved, so that a wrong one is a
# ModelConfigError naming its key instead of a TypeError or a kernel-size error deep in a tower.
_AT_LEAST_1 = (
    "input_size",
    "image_depth",
    "image_embed_dims",
    "image_patch_size",
    "image_hidden_rate",
    "image_num_heads",
    "ctx_len",
    "vocab_size",
    "head_size",
    "head_size_divisor",
    "n_layer",
    "n_embd",
)
_AT_LEAST_0 = (
    "dim_att",
    "dim_ffn",
    "text_num_head",
    "pos_emb",
    "head_qk",
    "tiny_att_dim",
)  # 0: derived or off
_WHOLE = ("tiny_att_layer",)
_FRACTIONS = ("drop_path_rate", "dropout")  # probabilities, in [0, 1)


def _check_values(cfg: Mapping[str, Any]) -> None:
    def bad(key: str, why: str) -> ModelConfigError:
        return ModelConfigError(f"model config key {key} {cfg[key]!r}: {why}", key=key)

    for key in _AT_LEAST_1 + _AT_LEAST_0 + _WHOLE:
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], int):
            raise bad(key, "must be a whole number")
    for key in _AT_LEAST_1:
        if cfg[key] < 1:
            raise bad(key, "must be at least 1")
    for key in _AT_LEAST_0:
        if cfg[key] < 0:
            raise bad(key, "must not be negative")
    for key in _FRACTIONS:
        value = cfg[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(key, "must be a number")
        if not (math.isfinite(value) and 0 <= value < 1):
            raise bad(key, "must be in [0, 1)")
    if cfg["input_size"] % cfg["image_patch_size"]:
        raise bad("input_size", f"must be a multiple of image_patch_size {cfg['image_patch_size']}")
    heads, width = cfg["image_num_heads"], cfg["image_embed_dims"]
    if width % heads or (width // heads) % 4:
        raise bad(
            "image_embed_dims", f"must split into image_num_heads {heads} heads whose size is a multiple of 4"
        )
    head = cfg["head_size"]
    if head % 2:
        raise bad("head_size", "must be even")
    for key in ("n_embd", "dim_att"):
        if cfg[key] % head:
            raise bad(key, f"must be a multiple of head_size {head}")


def _lock(groups: list[list[nn.Module | nn.Parameter]], unlocked: int) -> None:
    """Freeze every parameter of `groups`, then unfreeze those of the last `unlocked` groups
    (open_clip's grouping for LiT: embeddings, one group per block, last block + final norm)."""
    if not 0 <= unlocked <= len(groups):
        raise ValueError(f"unlocked groups/layers must be between 0 and {len(groups)}, got {unlocked}")
    for index, group in enumerate(groups):
        for item in group:
            params = [item] if isinstance(item, nn.Parameter) else list(item.parameters())
            for p in params:
                p.requires_grad = index >= len(groups) - unlocked


class RWKV_CLIP(nn.Module):  # noqa: N801 - the original class name, kept for users' scripts
    """Image and text RWKV towers plus a learnable temperature.

    `output_dict=True` makes `forward` return open_clip's dict (`image_features`, `text_features`,
    `logit_scale`) instead of the tuple; it can also be set later as `model.output_dict`.
    """

    def __init__(self, config: Mapping[str, Any], output_dict: bool = False):
        super().__init__()
        cfg = get_model_config(config)
        self.config = cfg
        self.output_dict = output_dict
        # Registration order fixes the state_dict order: logit_scale, text_model, image_model.
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.text_model = TextRWKV(
            vocab_size=cfg["vocab_size"],
            n_embd=cfg["n_embd"],
            dim_att=cfg["dim_att"],
            dim_ffn=cfg["dim_ffn"],
            n_layer=cfg["n_layer"],
            head_size=cfg["head_size"],
            head_size_divisor=cfg["head_size_divisor"],
            dropout=cfg["dropout"],
            with_cp=bool(cfg["with_cp"]),
            text_initialization=bool(cfg["text_initialization"]),
        )
        self.image_model = VisionRWKV(
            img_size=cfg["input_size"],
            patch_size=cfg["image_patch_size"],
            embed_dims=cfg["image_embed_dims"],
            depth=cfg["image_depth"],
            num_heads=cfg["image_num_heads"],
            hidden_rate=cfg["image_hidden_rate"],
            drop_path_rate=cfg["drop_path_rate"],
            with_cp=bool(cfg["with_cp"]),
        )
        self.context_length = cfg["ctx_len"]

    # open_clip's tower names, as aliases: a submodule under a new name would change the
    # state_dict keys of the released checkpoints (tests/open_alip/test_model.py).
    @property
    def visual(self) -> VisionRWKV:
        """The image tower (`image_model`), under open_clip's name."""
        return self.image_model

    @property
    def text(self) -> TextRWKV:
        """The text tower (`text_model`), under the name open_clip's CustomTextCLIP uses."""
        return self.text_model

    @property
    def image_embed_dim(self) -> int:
        return self.image_model.embed_dims

    @property
    def text_embed_dim(self) -> int:
        return self.text_model.n_embd

    @property
    def embed_dim(self) -> int:
        if self.image_embed_dim != self.text_embed_dim:
            raise ValueError("the towers have different widths")
        return self.image_embed_dim

    def set_text_decay_dtype(self, dtype: torch.dtype) -> None:
        """Store the text tower's `time_decay` and `time_faaaa` in `dtype`.

        float32 (the default) keeps master copies that small optimizer steps can move; the
        forward pass casts them to the compute dtype, so a bf16 forward sees the same values
        as the original's. bfloat16 is the original's storage, reproduced exactly: AdamW
        steps below half a bf16 step at the decays' magnitudes (-6 to -1) round away, so
        those decays stay where they were initialised. Call before building the optimizer.
        """
        self.text_model.set_decay_dtype(dtype)

    def released_state_dict(self) -> dict[str, torch.Tensor]:
        """`state_dict()` in the released checkpoints' layout: same keys and shapes, and the
        text decays in bfloat16 as the original stores them (docs/model.md)."""
        state = self.state_dict()
        for key in self.text_model.decay_keys(prefix="text_model."):
            state[key] = state[key].to(torch.bfloat16)
        return state

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.image_model.set_with_cp(enable)
        self.text_model.set_with_cp(enable)

    def lock_image_tower(self, unlocked_groups: int = 0, freeze_bn_stats: bool = False) -> None:
        """Freeze the image tower (LiT), leaving its last `unlocked_groups` groups trainable.

        The groups are open_clip's: [patch embedding, position embedding], each block but the
        last, [last block, final norm] (the tower has no projection). `freeze_bn_stats` is
        accepted for open_clip's signature; the tower has no batch norm.
        """
        tower = self.image_model
        _lock(
            [
                [tower.patch_embed, tower.pos_embed],
                *([b] for b in tower.layers[:-1]),
                [tower.layers[-1], tower.ln1],
            ],
            unlocked_groups,
        )

    def lock_text_tower(self, unlocked_layers: int = 0, freeze_layer_norm: bool = True) -> None:
        """Freeze the text tower, leaving its last `unlocked_layers` groups trainable: open_clip's
        [token embedding], each block but the last, [last block, final norm]. As in open_clip,
        only `freeze_layer_norm=True` is supported."""
        if not freeze_layer_norm:
            raise ValueError(
                "freeze_layer_norm=False is not supported (open_clip does not support it either)"
            )
        tower = self.text_model
        _lock(
            [[tower.emb], *([b] for b in tower.blocks[:-1]), [tower.blocks[-1], tower.ln_out]],
            unlocked_layers,
        )

    def set_wkv_impl(self, impl: str) -> None:
        """Choose the WKV implementation of every layer: a name from `wkv.WKV_IMPL_CHOICES`.

        "auto" (the default) runs fla's kernels on CUDA when fla-core imports and the
        chunked PyTorch form otherwise. Only the name is checked here; whether it can
        run is known once the model's device is (`wkv.resolve_wkv_impl(impl, device)`
        tells up front; a forward on an unusable device raises the same ValueError).
        """
        if impl not in WKV_IMPL_CHOICES:
            raise ValueError(
                f"unknown wkv implementation {impl!r}; choose one of {', '.join(WKV_IMPL_CHOICES)}"
            )
        for module in self.modules():
            if isinstance(module, TimeMix):
                module.wkv_impl = impl

    def set_mix_impl(self, impl: str) -> None:
        """Choose how every block computes its token-shift mixes: "torch" (eager expressions,
        the default) or "triton" (one fused kernel pair per mix site, `mix.py`: CUDA, or CPU
        under TRITON_INTERPRET=1; a forward where it cannot run raises ValueError)."""
        check_mix_impl(impl)
        for module in self.modules():
            if hasattr(module, "mix_impl"):
                module.mix_impl = impl

    def encode_image(self, image: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """`[B, 3, S, S]` -> `[B, D]` image embeddings in the model's dtype, L2-normalised when asked.

        Float pixels are cast to the weights' dtype first, so the float32 output of the transforms
        feeds a model built with precision "bf16"/"fp16" as it is (a no-op for float32 weights,
        also under autocast, where the weights stay float32).
        """
        if image.is_floating_point():
            image = image.to(self.image_model.pos_embed.dtype)
        features = self.image_model(image)
        return F.normalize(features, dim=-1) if normalize else features

    def encode_text(self, text: torch.Tensor, normalize: bool = False) -> torch.Tensor:
        """int64 token ids `[B, ctx_len]` -> `[B, D]` text embeddings, L2-normalised when asked."""
        features = self.text_model(text)
        return F.normalize(features, dim=-1) if normalize else features

    def get_logits(self, image: torch.Tensor, text: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """open_clip's (image_logits `[B_img, B_txt]`, text_logits = its transpose)."""
        image_logits = (
            self.logit_scale.exp()
            * self.encode_image(image, normalize=True)
            @ self.encode_text(text, normalize=True).T
        )
        return image_logits, image_logits.T

    def forward(
        self, image: torch.Tensor | None = None, text: torch.Tensor | None = None, *, normalize: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor] | dict[str, torch.Tensor | None]:
        """(image_features, text_features, exp(logit_scale)), as open_clip returns them: features
        L2-normalised, None for an input not given; a dict when `output_dict` is set.

        `normalize=False` (not in open_clip) returns the raw embeddings; the trainer uses it so
        that its loss normalises in float32 also when the towers run in bf16.
        """
        image_features = self.encode_image(image, normalize=normalize) if image is not None else None
        text_features = self.encode_text(text, normalize=normalize) if text is not None else None
        logit_scale = self.logit_scale.exp()
        if self.output_dict:
            return {
                "image_features": image_features,
                "text_features": text_features,
                "logit_scale": logit_scale,
            }
        return image_features, text_features, logit_scale


def create_model(
    config: str | os.PathLike | Mapping[str, Any],
    pretrained: str | os.PathLike | None = None,
    wkv_impl: str = "auto",
    output_dict: bool = False,
    **overrides: Any,
) -> RWKV_CLIP:
    """Build RWKV_CLIP from a shipped name, JSON path or dict; optionally load weights.

    Device and dtype are left to the caller (`model.to(...)`). `wkv_impl` is passed to
    `RWKV_CLIP.set_wkv_impl`; `output_dict` to RWKV_CLIP.
    """
    model = RWKV_CLIP(get_model_config(config, **overrides), output_dict=output_dict)
    model.set_wkv_impl(wkv_impl)
    if pretrained is not None:
        load_checkpoint(model, pretrained, strict=True)
    return model


def strip_wrapper_prefixes(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """The keys without the `module.` (DDP, DataParallel) and `_orig_mod.` (torch.compile)
    prefixes that saving a wrapped model adds, in any nesting."""
    out = {}
    for key, value in state_dict.items():
        while key.startswith(("module.", "_orig_mod.")):
            key = key.split(".", 1)[1]
        out[key] = value
    return out


def _tensor_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def _extract_state_dict(obj: Any, where: str) -> dict[str, torch.Tensor]:
    if isinstance(obj, Mapping) and _tensor_dict(obj.get("state_dict")):
        # A training checkpoint keeps the released layout under "state_dict" and the full-
        # precision copies of what that layout rounds under "master_params"; take the latter.
        state = dict(obj["state_dict"])
        masters = obj.get("master_params")
        if _tensor_dict(masters):
            state.update(masters)
        return state
    if isinstance(obj, Mapping) and _tensor_dict(obj.get("model")):
        return dict(obj["model"])
    if _tensor_dict(obj):
        return dict(obj)
    raise CheckpointMismatchError(
        f"{where} holds no state_dict (expected a dict of tensors, or one under 'state_dict' or 'model')"
    )


def checkpoint_state_dict(obj: Any, where: str = "the given checkpoint") -> dict[str, torch.Tensor]:
    """The model tensors of anything load_checkpoint takes in memory, without wrapper prefixes."""
    return strip_wrapper_prefixes(_extract_state_dict(obj, where))


def _summarise(kind: str, keys: list[str], limit: int = 12) -> str:
    shown = ", ".join(keys[:limit])
    more = f" ... and {len(keys) - limit} more" if len(keys) > limit else ""
    return f"{len(keys)} {kind}: {shown}{more}"


def unwrap_model(model: nn.Module) -> nn.Module:
    """The bare model inside DistributedDataParallel/DataParallel and torch.compile wrappers."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif isinstance(getattr(model, "_orig_mod", None), nn.Module):
            model = model._orig_mod
        else:
            return model


def _compare(
    own: Mapping[str, torch.Tensor], state: Mapping[str, Any]
) -> tuple[list[str], list[str], list[str]]:
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    mismatched = [
        f"{k} (checkpoint {tuple(state[k].shape)}, model {tuple(own[k].shape)})"
        for k in own
        if k in state and state[k].shape != own[k].shape
    ]
    return missing, unexpected, mismatched


def _mismatch_message(
    where: str, what: str, missing: list[str], unexpected: list[str], mismatched: list[str], limit: int = 12
) -> str:
    parts = [
        _summarise(kind, keys, limit)
        for kind, keys in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatches", mismatched),
        )
        if keys
    ]
    return f"{where} does not fit {what}: " + "; ".join(parts)


class _SkipRandomInit(torch.overrides.TorchFunctionMode):
    """Leaves out the random initialisers while a model is built on the meta device (the towers skip
    their own init there too). They fill nothing there, and torch's meta version of `normal_` imports
    torch._dynamo on its first call: 2 of the 4.3 s zero_shot.py took on the demo's model."""

    _SKIPPED = frozenset(
        (
            torch.Tensor.normal_,
            torch.Tensor.uniform_,
            *(
                getattr(nn.init, name)
                for name in (
                    "normal_",
                    "uniform_",
                    "trunc_normal_",
                    "orthogonal_",
                    "kaiming_normal_",
                    "kaiming_uniform_",
                    "xavier_normal_",
                    "xavier_uniform_",
                )
            ),
        )
    )

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self._SKIPPED:
            tensor = args[0] if args else kwargs.get("tensor", kwargs.get("self"))
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
        return func(*args, **kwargs)


def check_fits(
    config: Mapping[str, Any], checkpoint: Mapping[str, Any], where: str = "the given checkpoint"
) -> None:
    """Raise CheckpointMismatchError unless `checkpoint` (anything load_checkpoint takes in memory)
    loads into RWKV_CLIP(config), without building it: the shapes come from a model on the meta
    device, which allocates and initialises nothing (benchmarks/config_check.py: 61x faster than
    building a B/32)."""
    state = strip_wrapper_prefixes(_extract_state_dict(checkpoint, where))
    with torch.device("meta"), _SkipRandomInit():
        own = RWKV_CLIP(config).state_dict()
    missing, unexpected, mismatched = _compare(own, state)
    if missing or unexpected or mismatched:
        # Only what differs, a few names of each kind: the caller's message already names the weights
        # and the model, and says which config they fit.
        error = CheckpointMismatchError(
            _mismatch_message(where, "RWKV_CLIP", missing, unexpected, mismatched, limit=2).split(": ", 1)[1]
        )
        error.counts = (len(missing), len(unexpected), len(mismatched))
        raise error


def shipped_configs_that_fit(checkpoint: Mapping[str, Any]) -> list[str]:
    """The shipped configs whose shapes `checkpoint` fits (a hint for weights that record none)."""
    fitting = []
    for name in list_models():
        try:
            check_fits(get_model_config(name), checkpoint)
        except CheckpointMismatchError:
            continue
        fitting.append(name)
    return fitting


def config_in_checkpoint(checkpoint: Any) -> dict[str, Any] | None:
    """The architecture a train.py checkpoint records ("config", or its run's "model"); None
    for a bare state dict."""
    if not isinstance(checkpoint, Mapping):
        return None
    run = checkpoint.get("run")
    for candidate in (checkpoint.get("config"), run.get("model") if isinstance(run, Mapping) else None):
        if isinstance(candidate, Mapping) and all(k in candidate for k in REQUIRED_KEYS):
            return dict(candidate)
    return None


def config_name(config: Mapping[str, Any]) -> str | None:
    """The shipped config equal to `config`, if any."""
    try:
        resolved = get_model_config(config)
    except (ValueError, FileNotFoundError):
        return None
    return next((name for name in list_models() if get_model_config(name) == resolved), None)


def load_checkpoint(
    model: nn.Module, path_or_state_dict: str | os.PathLike | Mapping[str, Any], strict: bool = True
) -> tuple[list[str], list[str], list[str]]:
    """Load original or our own checkpoints into `model`.

    `model` may be wrapped in DDP/DataParallel or torch.compile. Accepts a path
    (read with weights_only=True) or an in-memory dict: a raw
    state_dict or one under "state_dict"/"model" (a training checkpoint's "master_params"
    replace the rounded tensors they belong to). `module.` and `_orig_mod.`
    prefixes are stripped and tensors are cast to the model's dtypes. With `strict`
    any missing, unexpected or shape-mismatched key raises CheckpointMismatchError
    naming them and nothing is loaded; otherwise the fitting tensors are loaded and
    the lists (missing, unexpected, mismatched) are returned.
    """
    if isinstance(path_or_state_dict, Mapping):
        where = "the given checkpoint"
        raw = path_or_state_dict
    else:
        path = Path(path_or_state_dict)
        where = f"checkpoint {path}"
        what = not_a_file(path, "a checkpoint file")
        if what is not None:
            raise FileNotFoundError(f"checkpoint {path} {what}")
        try:
            raw = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises several types for corrupt or unsafe files
            raise CheckpointMismatchError(f"cannot read {where}: {type(exc).__name__}: {exc}") from None
    state = strip_wrapper_prefixes(_extract_state_dict(raw, where))
    model = unwrap_model(model)

    own = model.state_dict()
    missing, unexpected, mismatched = _compare(own, state)
    if strict and (missing or unexpected or mismatched):
        raise CheckpointMismatchError(
            _mismatch_message(where, type(model).__name__, missing, unexpected, mismatched)
        )

    fitting = {
        k: state[k].to(dtype=own[k].dtype) for k in own if k in state and state[k].shape == own[k].shape
    }
    model.load_state_dict(fitting, strict=False)
    return missing, unexpected, mismatched
