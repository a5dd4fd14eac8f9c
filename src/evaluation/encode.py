"""Embeddings the evaluations compare: images batch by batch (skipping unreadable ones), and the
class embeddings of prompts, spread over the ranks of a process group."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from src.evaluation.datasets import ImageSource, preprocess_batch
from src.evaluation.images import Batch, skipping_loader
from src.evaluation.sharding import SINGLE, Shard
from src.open_alip.model import unwrap_model
from src.open_alip.zero_shot import Tokenizer, class_prompts, encode_texts, ensemble_prompts


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """The model in eval mode, its mode restored afterwards (train.py evaluates mid-training)."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def image_batches(
    images: Sequence[ImageSource],
    labels: Sequence[int] | None,
    input_size: int,
    device: torch.device | str,
    batch_size: int,
    workers: int,
    dali: bool = False,
) -> Iterable[Batch]:
    """`Batch`es of `images`, unreadable ones skipped: through the skipping loader, or (`dali`,
    the original's ImageNet resize) through DALI."""
    if not dali:
        return skipping_loader(images, labels, input_size, batch_size, device, workers)
    from src.evaluation.dali_val import dali_val_batches

    return dali_val_batches(images, labels, input_size, batch_size, device, workers)


def encoded_batches(
    model: torch.nn.Module,
    batches: Iterable[Batch],
    input_size: int,
    device: torch.device | str,
    progress: bool = False,
    desc: str = "images",
) -> Iterator[tuple[torch.Tensor | None, Batch]]:
    """(L2-normalised float32 embeddings of the batch's readable images, the batch) per batch;
    None in place of the embeddings when no image of the batch could be read."""
    if progress:
        from tqdm import tqdm

        batches = tqdm(batches, desc=desc, unit="batch", leave=False)
    encoder = unwrap_model(model)
    for batch in batches:
        if not batch.positions:
            yield None, batch
            continue
        pixels = preprocess_batch(batch.images, device)
        yield F.normalize(encoder.encode_image(pixels).float(), dim=-1), batch


@torch.no_grad()
def encode_images(
    model: torch.nn.Module,
    images: Sequence[ImageSource],
    input_size: int,
    device: torch.device | str,
    batch_size: int = 64,
    workers: int = 0,
    progress: bool = False,
    desc: str = "images",
) -> tuple[torch.Tensor | None, list[int], list[tuple[int, str]]]:
    """(embeddings [N_read, D] or None if none was read, the positions they belong to, the
    (position, reason) pairs of the images that could not be read)."""
    features, positions, failed = [], [], []
    batches = image_batches(images, None, input_size, device, batch_size, workers)
    for emb, batch in encoded_batches(model, batches, input_size, device, progress, desc):
        failed += batch.failed
        if emb is not None:
            features.append(emb)
            positions += batch.positions
    return (torch.cat(features) if features else None), positions, failed


@torch.no_grad()
def sharded_class_embeddings(
    model: torch.nn.Module,
    classnames: Sequence[str],
    templates: Sequence[str],
    device: torch.device | str,
    shard: Shard = SINGLE,
    tokenizer: Tokenizer | None = None,
) -> torch.Tensor:
    """`build_class_embeddings`, with the prompts (1000 x 80 for ImageNet) spread over the ranks."""
    prompts = class_prompts(classnames, templates)
    start, stop = shard.range(len(prompts))
    local = encode_texts(model, prompts[start:stop], device, tokenizer=tokenizer) if stop > start else None
    if local is None:  # more ranks than prompts: an empty slice of the right width
        width = encode_texts(model, prompts[:1], device, tokenizer=tokenizer).shape[1]
        local = torch.empty((0, width), device=device)
    return ensemble_prompts(shard.gather(local, len(prompts), device), len(classnames), len(templates))
