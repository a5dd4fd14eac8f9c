"""The released RWKV-CLIP weights, by open_clip-style (config, tag) pairs.

    list_pretrained()  # [("RWKV_CLIP_B16", "laion10m"), ("RWKV_CLIP_B32", "laion10m"), ...]
    create_model_and_transforms("RWKV_CLIP_B32", pretrained="yfcc15m")

The authors publish each model as `model_31.pt` (the last of 32 epochs) in its own hub repo
(github deepglint/RWKV-CLIP, README "Pretrained Model Weights"). No sha256 of those files is
published: `sha256` stays None until one is measured, and the download is then checked against
the sha256 the hub gives for the file (pretrained.py), as every hf-hub: download is.
`register_pretrained` adds a tag, e.g. for weights on a private hub.
"""

from __future__ import annotations

from typing import NamedTuple

from .errors import PretrainedError


class ReleasedWeights(NamedTuple):
    config: str  # a shipped model config (model.list_models())
    tag: str  # the training data, lower case
    hub_repo: str  # ORG/REPO on the Hugging Face hub
    filename: str  # the weights file in that repo
    sha256: str | None = None  # of the file, where known; None: the hub's own hash is checked

    @property
    def hub_spec(self) -> str:
        return f"hf-hub:{self.hub_repo}/{self.filename}"


_RELEASED: list[ReleasedWeights] = [
    ReleasedWeights("RWKV_CLIP_B32", "yfcc15m", "Kaichengalex/RWKV-CLIP-B32-YFCC15M", "model_31.pt"),
    ReleasedWeights("RWKV_CLIP_B32", "laion10m", "Kaichengalex/RWKV-CLIP-B32-LAION10M", "model_31.pt"),
    ReleasedWeights("RWKV_CLIP_B32", "laion30m", "Kaichengalex/RWKV-CLIP-B32-LAION30M", "model_31.pt"),
    ReleasedWeights("RWKV_CLIP_B16", "laion10m", "Kaichengalex/RWKV-CLIP-B16-LAION10M", "model_31.pt"),
]


def _clean(tag: str) -> str:
    return tag.strip().lower()


def list_pretrained(as_str: bool = False, details: bool = False) -> list:
    """open_clip's list: (config, tag) pairs, or "config:tag" strings with `as_str`; `details`
    gives the ReleasedWeights records (hub repo, file, sha256) instead."""
    entries = sorted(_RELEASED, key=lambda e: (e.config, e.tag))
    if details:
        return entries
    return [f"{e.config}:{e.tag}" if as_str else (e.config, e.tag) for e in entries]


def list_pretrained_tags_by_model(config: str) -> list[str]:
    return sorted(e.tag for e in _RELEASED if e.config == config)


def list_pretrained_models_by_tag(tag: str) -> list[str]:
    return sorted(e.config for e in _RELEASED if e.tag == _clean(tag))


def is_pretrained_tag(tag: str) -> bool:
    return any(e.tag == _clean(tag) for e in _RELEASED)


def get_pretrained_cfg(config: str, tag: str) -> ReleasedWeights:
    """The record of `config` trained as `tag`; PretrainedError naming the tags there are."""
    for entry in _RELEASED:
        if entry.config == config and entry.tag == _clean(tag):
            return entry
    tags = list_pretrained_tags_by_model(config)
    released = (
        f"its tags: {', '.join(tags)}"
        if tags
        else (
            "it has no released weights; "
            + ", ".join(f"{c}:{t}" for c, t in list_pretrained(as_str=False))
            + " do"
        )
    )
    raise PretrainedError(f"pretrained tag {tag!r} is not released for model {config}; {released}")


def register_pretrained(
    config: str, tag: str, hub_repo: str, filename: str, sha256: str | None = None
) -> ReleasedWeights:
    """Add (or replace) a tag, so that `pretrained=tag` finds weights published elsewhere."""
    if "/" not in hub_repo or hub_repo.count("/") != 1:
        raise PretrainedError(f"hub repo {hub_repo!r}: expected ORG/REPO")
    if sha256 is not None and (len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256)):
        raise PretrainedError(f"sha256 {sha256!r}: expected 64 lower-case hex digits")
    entry = ReleasedWeights(config, _clean(tag), hub_repo, filename, sha256)
    _RELEASED[:] = [e for e in _RELEASED if (e.config, e.tag) != (entry.config, entry.tag)] + [entry]
    return entry
