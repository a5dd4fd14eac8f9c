"""The evaluation protocols: `original` reproduces the RWKV-CLIP paper's numbers, `standard` is
the plain CLIP protocol on the original's dataset definitions, `clip_benchmark` is the plain CLIP
protocol on CLIP_benchmark 1.6.2's dataset definitions (src/evaluation/clip_benchmark_protocol.py).

`original` and `standard` use the same datasets, splits, class names, templates, metrics and
ranks; they differ only in what docs/evaluation.md lists as the original's quirks:

classification logits
    original: 100 x cosine written into an int64 tensor (truncated toward zero), top-k on CPU
    standard: float
    clip_benchmark: float
ImageNet preprocessing
    original: DALI: triangular resize of the shorter side to 256/224 x size, centre crop
    standard: open_clip eval transform
    clip_benchmark: open_clip eval transform
ImageNet zero rows
    original: the original's 8 ranks x batch 120 leave 880 zero rows, counted with target 0
    standard: none
    clip_benchmark: none
retrieval captions
    original: "a photo of " + caption
    standard: caption
    clip_benchmark: caption
dataset definitions
    original: the original's
    standard: the original's
    clip_benchmark: CLIP_benchmark's
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from src.evaluation.datasets import EvalDataError


@dataclass(frozen=True)
class Protocol:
    name: str
    integer_logits: bool
    imagenet_dali_resize: bool  # the original's DALI val pipeline for ImageNet
    # The original's launch (shell/test_zero_shot_classificaiton.sh: 8 ranks, batch 120), whose
    # unfilled logit rows it counts; None: count only real images.
    imagenet_padding_launch: tuple[int, int] | None
    caption_prefix: str
    # Whose splits, class names and headline metrics the paper's datasets get: "original" or "clip_benchmark".
    dataset_definitions: str = "original"


ORIGINAL = Protocol("original", True, True, (8, 120), "a photo of ")
STANDARD = Protocol("standard", False, False, None, "")
CLIP_BENCHMARK = Protocol("clip_benchmark", False, False, None, "", dataset_definitions="clip_benchmark")
PROTOCOLS = {p.name: p for p in (ORIGINAL, STANDARD, CLIP_BENCHMARK)}


def get_protocol(name: str | Protocol) -> Protocol:
    if isinstance(name, Protocol):
        return name
    try:
        return PROTOCOLS[name]
    except KeyError:
        raise EvalDataError(f"--protocol {name!r}: choose one of {', '.join(PROTOCOLS)}") from None


def original_padding_rows(num_images: int, launch: tuple[int, int]) -> int:
    """Logit rows the original allocates but never fills for a DALI dataset of `num_images`.

    Each of `ranks` processes allocates len(loader) x batch rows; DALI's iterator (PARTIAL last
    batch, no padding) is ceil(ceil(N / ranks) / batch) batches long, so the unfilled rows are
    ranks x that x batch - N. The rows stay zero with target 0 and are counted.
    """
    ranks, batch = launch
    per_rank_batches = math.ceil(math.ceil(num_images / ranks) / batch)
    return ranks * per_rank_batches * batch - num_images
