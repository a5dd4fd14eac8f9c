"""Zero-shot maths: class embeddings from prompt templates, classification and retrieval metrics,
and the class names and templates bundled for well-known datasets.

The functions take a model with `encode_image(images)` and `encode_text(tokens)` (RWKV_CLIP, or
one wrapped by DDP or torch.compile) and tensors, and return tensors or plain dicts, so that they
serve any evaluation loop (the toolkit's own lives in src/evaluation/). Metrics are in percent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from .model import unwrap_model

DATA_DIR = Path(__file__).resolve().parent / "zero_shot_data"
DEFAULT_TEMPLATES = ("a photo of a {}.",)
# Names the original scripts use for the same bundled metadata.
ALIASES = {
    "imagenet": "imagenet1k",
    "cars": "stanford_car",
    "fgvc_aircraft": "aircraft",
    "flowers102": "flowers",
}

Tokenizer = Callable[[Sequence[str]], torch.Tensor]


def list_metadata() -> list[str]:
    """Dataset names with bundled class names and/or templates."""
    return sorted(p.stem for p in DATA_DIR.glob("*.json"))


def load_metadata(name: str) -> tuple[list[str] | None, list[str] | None]:
    """(classnames, templates) bundled for `name`, each None when not bundled."""
    path = DATA_DIR / f"{ALIASES.get(name, name)}.json"
    if not path.is_file():
        return None, None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data.get("classnames"), data.get("templates")


# ---------------------------------------------------------------------------------------------
# embeddings


def _default_tokenizer() -> Tokenizer:
    from .tokenizer import tokenize

    return tokenize


@torch.no_grad()
def encode_texts(
    model: torch.nn.Module,
    texts: Sequence[str],
    device: torch.device | str,
    batch_size: int = 256,
    tokenizer: Tokenizer | None = None,
) -> torch.Tensor:
    """L2-normalised text embeddings [N, D] (float32, on `device`)."""
    tokenizer = tokenizer or _default_tokenizer()
    model = unwrap_model(model)
    out = []
    for start in range(0, len(texts), batch_size):
        tokens = tokenizer(list(texts[start : start + batch_size])).to(device)
        out.append(F.normalize(model.encode_text(tokens).float(), dim=-1))
    return torch.cat(out)


@torch.no_grad()
def build_class_embeddings(
    model: torch.nn.Module,
    classnames: Sequence[str],
    templates: Sequence[str],
    device: torch.device | str,
    batch_size: int = 256,
    tokenizer: Tokenizer | None = None,
) -> torch.Tensor:
    """Zero-shot classifier weights [D, C]: for each class, the mean of its normalised
    prompt embeddings (one per template), re-normalised (the CLIP paper's ensembling)."""
    prompts = class_prompts(classnames, templates)
    emb = encode_texts(model, prompts, device, batch_size, tokenizer)
    return ensemble_prompts(emb, len(classnames), len(templates))


def class_prompts(classnames: Sequence[str], templates: Sequence[str]) -> list[str]:
    """Every template filled with every class name, class-major (the order `ensemble_prompts` expects)."""
    if not classnames or not templates:
        raise ValueError("need at least one class name and one template")
    return [t.format(c) for c in classnames for t in templates]


def ensemble_prompts(prompt_embeddings: torch.Tensor, num_classes: int, num_templates: int) -> torch.Tensor:
    """Classifier weights [D, C] from the normalised embeddings of `class_prompts`: per class the mean
    over its templates, normalised again."""
    emb = prompt_embeddings.view(num_classes, num_templates, -1).mean(dim=1)
    return F.normalize(emb, dim=-1).t().contiguous()


# ---------------------------------------------------------------------------------------------
# metrics


def class_logits(features: torch.Tensor, classifier: torch.Tensor, integer: bool = False) -> torch.Tensor:
    """100 x cosine of each image with each class, [N, C].

    `integer` reproduces the original evaluation, which writes these logits into an int64 tensor:
    the cast truncates toward zero (25.9 -> 25), so classes within one point of each other tie.
    """
    logits = 100.0 * features.float() @ classifier.float()
    return logits.long() if integer else logits


def top_predictions(logits: torch.Tensor, k: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """(top-1 class [N], top-k classes [N, k]) on CPU, k capped at the class count.

    Both come from `topk(.., dim=1, largest=True, sorted=True)` on CPU, as the original ranks its
    integer logits; top-1 is its own k=1 call because with ties the first of a top-5 call need not
    be the class a top-1 call picks. Rows are independent, so batches can be ranked separately.
    """
    logits = logits.cpu()
    top1 = logits.topk(1, dim=1, largest=True, sorted=True).indices[:, 0]
    topk = logits.topk(min(k, logits.shape[1]), dim=1, largest=True, sorted=True).indices
    return top1, topk


def prediction_metrics(
    top1: torch.Tensor, topk: torch.Tensor, targets: torch.Tensor, num_classes: int
) -> dict[str, float]:
    """Top-1 / top-k accuracy and mean per-class recall (the mean over classes that have samples of
    their top-1 accuracy; the original's "mean per-class accuracy"), in %."""
    targets = targets.cpu().long()
    hit1 = top1.cpu().eq(targets).float()
    per_class_hits = torch.zeros(num_classes).index_add_(0, targets, hit1)
    per_class_total = torch.bincount(targets, minlength=num_classes).float()
    present = per_class_total > 0
    return {
        "top1": 100.0 * hit1.mean().item(),
        "top5": 100.0 * topk.cpu().eq(targets.unsqueeze(1)).any(dim=1).float().mean().item(),
        "mean_per_class_recall": 100.0 * (per_class_hits[present] / per_class_total[present]).mean().item(),
    }


def classification_metrics(
    logits: torch.Tensor, targets: torch.Tensor, num_classes: int | None = None
) -> dict:
    """Top-1 / top-5 accuracy and mean per-class recall (classes without samples are skipped), in %."""
    top1, topk = top_predictions(logits)
    return prediction_metrics(top1, topk, targets, num_classes or logits.shape[1])


def _positions(sim: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Position of candidate `target[q]` in query q's ranking: a descending sort of `sim[q]` in
    which equal scores keep the candidates' order (a stable sort)."""
    score = sim.gather(1, target.unsqueeze(1))
    candidates = torch.arange(sim.shape[1], device=sim.device)
    earlier_tie = (sim == score) & (candidates < target.unsqueeze(1))
    return (sim > score).sum(dim=1) + earlier_tie.sum(dim=1)


def retrieval_metrics(
    image_emb: torch.Tensor,
    text_emb: torch.Tensor,
    caption_image: torch.Tensor | Sequence[int],
    ks: Sequence[int] = (1, 5, 10),
    chunk: int = 1024,
) -> dict:
    """Recall@K both ways, in %.

    Ranks are positions in each query's candidates sorted by similarity, ties broken by order: of
    equally similar candidates, the one listed first in the dataset ranks first. That is exactly
    `torch.sort(descending=True, stable=True)` (or numpy's stable argsort of the negated scores).
    Without ties it is also what the original's `argsort(descending=True)` and CLIP_benchmark's
    `topk` give; among tied scores those two return an unspecified order (with torch 2.13 on CPU,
    argsort stops following the candidates' order from 17 values per row and topk already below
    that; on CUDA it depends on the kernel), so on sets with duplicate captions or images their
    numbers may differ from these, and between devices and versions.
    image->text: the rank of the image's best-placed caption; text->image: the rank of its image.
    """
    device = image_emb.device
    caption_image = torch.as_tensor(caption_image, device=device).long()
    n_img, n_txt = image_emb.shape[0], text_emb.shape[0]
    i2t_rank = torch.empty(n_img, dtype=torch.long, device=device)
    t2i_rank = torch.empty(n_txt, dtype=torch.long, device=device)
    text_index = torch.arange(n_txt, device=device)
    for start in range(0, n_img, chunk):
        sim = image_emb[start : start + chunk] @ text_emb.t()
        images = torch.arange(start, start + sim.shape[0], device=device)
        mine = caption_image.unsqueeze(0) == images.unsqueeze(1)
        # The best-placed own caption: the highest score, the first listed among equals.
        best = sim.masked_fill(~mine, -math.inf).max(dim=1, keepdim=True).values
        first_best = torch.where(mine & (sim == best), text_index, n_txt).min(dim=1).values
        i2t_rank[start : start + chunk] = _positions(sim, first_best)
    for start in range(0, n_txt, chunk):
        sim = text_emb[start : start + chunk] @ image_emb.t()
        t2i_rank[start : start + chunk] = _positions(sim, caption_image[start : start + chunk])
    metrics = {}
    for k in ks:
        metrics[f"image_to_text_R@{k}"] = 100.0 * (i2t_rank < k).float().mean().item()
    for k in ks:
        metrics[f"text_to_image_R@{k}"] = 100.0 * (t2i_rank < k).float().mean().item()
    metrics["mean_recall"] = sum(metrics.values()) / len(metrics)
    return metrics
