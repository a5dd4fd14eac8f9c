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
ALIASES = {"imagenet": "imagenet1k", "cars": "stanford_car", "fgvc_aircraft": "aircraft", "flowers102": "flowers"}

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
    if not classnames or not templates:
        raise ValueError("need at least one class name and one template")
    prompts = [t.format(c) for c in classnames for t in templates]
    emb = encode_texts(model, prompts, device, batch_size, tokenizer)
    emb = emb.view(len(classnames), len(templates), -1).mean(dim=1)
    return F.normalize(emb, dim=-1).t().contiguous()


# ---------------------------------------------------------------------------------------------
# metrics


def classification_metrics(logits: torch.Tensor, targets: torch.Tensor, num_classes: int | None = None) -> dict:
    """Top-1 / top-5 accuracy and mean per-class recall (classes without samples are skipped), in %."""
    num_classes = num_classes or logits.shape[1]
    targets = targets.to(logits.device).long()
    k = min(5, logits.shape[1])
    topk = logits.topk(k, dim=1).indices
    hit = topk.eq(targets.unsqueeze(1))
    top1 = hit[:, 0].float()
    per_class_hits = torch.zeros(num_classes, device=logits.device).index_add_(0, targets, top1)
    per_class_total = torch.bincount(targets, minlength=num_classes).float()
    present = per_class_total > 0
    recall = (per_class_hits[present] / per_class_total[present]).mean()
    return {
        "top1": 100.0 * top1.mean().item(),
        "top5": 100.0 * hit.any(dim=1).float().mean().item(),
        "mean_per_class_recall": 100.0 * recall.item(),
    }


def retrieval_metrics(
    image_emb: torch.Tensor,
    text_emb: torch.Tensor,
    caption_image: torch.Tensor | Sequence[int],
    ks: Sequence[int] = (1, 5, 10),
    chunk: int = 1024,
) -> dict:
    """Recall@K both ways, in %.

    image->text: an image is a hit at K when any of its captions is among the K most similar texts.
    text->image: a caption is a hit at K when its image is among the K most similar images.
    Ranks count strictly better-scoring candidates, so ties resolve in the query's favour.
    """
    caption_image = torch.as_tensor(caption_image, device=image_emb.device).long()
    n_img, n_txt = image_emb.shape[0], text_emb.shape[0]
    i2t_rank = torch.empty(n_img, dtype=torch.long, device=image_emb.device)
    t2i_rank = torch.empty(n_txt, dtype=torch.long, device=image_emb.device)
    owner = torch.zeros(n_img, n_txt, dtype=torch.bool, device=image_emb.device)
    owner[caption_image, torch.arange(n_txt, device=image_emb.device)] = True
    for start in range(0, n_img, chunk):
        sim = image_emb[start : start + chunk] @ text_emb.t()
        mine = owner[start : start + chunk]
        best = sim.masked_fill(~mine, -math.inf).max(dim=1, keepdim=True).values
        i2t_rank[start : start + chunk] = (sim > best).sum(dim=1)
    for start in range(0, n_txt, chunk):
        sim = text_emb[start : start + chunk] @ image_emb.t()
        idx = caption_image[start : start + chunk]
        correct = sim.gather(1, idx.unsqueeze(1))
        t2i_rank[start : start + chunk] = (sim > correct).sum(dim=1)
    metrics = {}
    for k in ks:
        metrics[f"image_to_text_R@{k}"] = 100.0 * (i2t_rank < k).float().mean().item()
    for k in ks:
        metrics[f"text_to_image_R@{k}"] = 100.0 * (t2i_rank < k).float().mean().item()
    metrics["mean_recall"] = sum(metrics.values()) / len(metrics)
    return metrics
