"""One zero-shot evaluation of one dataset: read it, embed its images and texts, score it.

`evaluate_classification` / `evaluate_retrieval` take a model with `encode_image` and
`encode_text` (RWKV_CLIP, or one wrapped by DDP or torch.compile) and a dataset spec, and
return plain dicts, so the same code serves the CLIs (zero_shot.py, retrieval.py), the
demo and train.py's epoch-end hook. Which reader reads a dataset is specs.py's; the embeddings
are encode.py's; the maths (class embeddings, metrics) the model library's
(src/open_alip/zero_shot.py). Metrics are in percent. Images that cannot be read are left out
and listed under "skipped_images" (src/evaluation/images.py).

A classification can be spread over the ranks of a process group (`shard`): each rank embeds
its slice of the prompts and of the images, and the predictions are gathered, so every rank
returns the same result.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from src.evaluation.clip_benchmark_protocol import (
    clip_benchmark_metrics,
    clip_benchmark_notices,
    clip_benchmark_retrieval_metrics,
)
from src.evaluation.datasets import ClassificationData, EvalDataError, ImageSource
from src.evaluation.encode import (
    encode_images,
    encoded_batches,
    eval_mode,
    image_batches,
    sharded_class_embeddings,
)
from src.evaluation.images import PIL_PREPROCESSING, skipped_list
from src.evaluation.protocol import STANDARD, Protocol, get_protocol, original_padding_rows
from src.evaluation.sharding import SINGLE, Shard
from src.evaluation.specs import (
    DatasetSpec,
    as_spec,
    load_classification_data,
    load_retrieval_data,
    paper_dataset_of,
    templates_source,
)
from src.evaluation.templates import LABEL_TEMPLATES_FROM, repeated_names
from src.open_alip.zero_shot import (
    Tokenizer,
    class_logits,
    encode_texts,
    load_metadata,
    prediction_metrics,
    retrieval_metrics,
    top_predictions,
)

_SKIPPED = -1  # the top-1 column of an image that could not be read


def _prediction_rows(
    model: torch.nn.Module,
    data: ClassificationData,
    classifier: torch.Tensor,
    start: int,
    stop: int,
    protocol: Protocol,
    dali: bool,
    input_size: int,
    device,
    batch_size: int,
    workers: int,
    progress: bool,
) -> tuple[torch.Tensor, dict[int, str]]:
    """One row per image of [start, stop), in order: top-1 class, label, top-k classes (what the
    metrics need, and small to gather); an unreadable image's row is all `_SKIPPED`. Also the
    reasons of this rank's unreadable images, by dataset position."""
    width = 2 + min(5, len(data.classnames))
    rows = torch.full((stop - start, width), _SKIPPED, dtype=torch.long)
    reasons: dict[int, str] = {}
    if stop <= start:
        return rows, reasons
    batches = image_batches(
        data.images[start:stop], data.labels[start:stop], input_size, device, batch_size, workers, dali
    )
    for features, batch in encoded_batches(model, batches, input_size, device, progress, data.name):
        reasons.update((start + i, why) for i, why in batch.failed)
        if features is not None:
            top1, topk = top_predictions(class_logits(features, classifier, protocol.integer_logits))
            rows[batch.positions] = torch.cat(
                [top1[:, None], batch.labels.long()[:, None], topk], dim=1
            ).cpu()
    return rows, reasons


@torch.no_grad()
def evaluate_classification(
    model: torch.nn.Module,
    dataset_spec: DatasetSpec | str | Path,
    input_size: int,
    device: torch.device | str,
    batch_size: int = 64,
    workers: int = 0,
    tokenizer: Tokenizer | None = None,
    progress: bool = False,
    return_predictions: bool = False,
    protocol: Protocol | str = STANDARD,
    shard: Shard = SINGLE,
) -> dict:
    """Zero-shot classification of one dataset.

    Returns ``{"dataset", "task": "classification", "protocol", "num_images", "num_classes",
    "num_templates", "templates", "templates_from", "chance_top1", "metric", "score", "metrics":
    {"top1", "top5", "mean_per_class_recall"}, "per_class": [{"class", "images", "top1"}]}``
    (percent). "metric" names the dataset's headline metric (mean per-class recall for aircraft,
    pets, flowers and caltech101, top-1 otherwise) and "score" is its value. Under the original
    protocol ImageNet also reports "padded_rows" and "metrics_without_padding". Unreadable images
    are left out of "num_images" and the metrics and listed as "skipped_images" ([{"image",
    "error"}]). With `return_predictions` the dict also holds "predictions" (top-1 class per
    image, -1 for a skipped one), "top_k" (the top-k classes per image, best first; [] for a
    skipped one), "confusion_matrix" (counts, [true class][predicted class]) and "data" (the
    dataset). With a `shard`, every rank of the process group must call this; all return the same
    dict.
    """
    spec = as_spec(dataset_spec)
    protocol = get_protocol(protocol)
    data, templates = load_classification_data(spec, protocol)
    entry = paper_dataset_of(spec)
    imagenet = entry is not None and entry.name == "imagenet"
    dali = imagenet and protocol.imagenet_dali_resize
    count, num_classes = len(data.images), len(data.classnames)
    start, stop = shard.range(count)
    with eval_mode(model):
        classifier = sharded_class_embeddings(model, data.classnames, templates, device, shard, tokenizer)
        local, reasons = _prediction_rows(
            model,
            data,
            classifier,
            start,
            stop,
            protocol,
            dali,
            input_size,
            device,
            batch_size,
            workers,
            progress and shard.rank == 0,
        )
    gathered = shard.gather(local, count, device).cpu()
    read = gathered[:, 0] != _SKIPPED
    skipped = [
        {"image": str(data.images[i]), "error": reasons.get(i, "unreadable (read on another rank)")}
        for i in torch.nonzero(~read).flatten().tolist()
    ]
    if not read.any():
        raise EvalDataError(
            f"dataset {data.name}: none of its {count} images could be read "
            f"(e.g. {skipped[0]['image']}: {skipped[0]['error']})"
        )
    top1_all, labels_all, topk_all = gathered[read, 0], gathered[read, 1], gathered[read, 2:]
    if (labels_all < 0).any() or (labels_all >= num_classes).any():
        raise EvalDataError(f"dataset {data.name}: a stored label is outside 0..{num_classes - 1}")
    metrics = prediction_metrics(top1_all, topk_all, labels_all, num_classes)
    result = {
        "dataset": data.name,
        "task": "classification",
        "protocol": protocol.name,
        "num_images": len(top1_all),
        "num_classes": num_classes,
        "num_templates": len(templates),
        "templates": list(templates),
        "templates_from": templates_source(spec),
        "chance_top1": 100.0 / num_classes,
        "preprocessing": _preprocessing(dali, input_size, device),
    }
    confusion = torch.bincount(labels_all * num_classes + top1_all, minlength=num_classes**2).view(
        num_classes, num_classes
    )
    if imagenet and protocol.imagenet_padding_launch:
        padding = original_padding_rows(len(top1_all), protocol.imagenet_padding_launch)
        # The original's unfilled rows: zero logits, target 0, ranked like every row.
        pad1, padk = top_predictions(
            torch.zeros(1, num_classes, dtype=torch.long if protocol.integer_logits else None)
        )
        result["padded_rows"] = padding
        result["metrics_without_padding"] = metrics
        metrics = prediction_metrics(
            torch.cat([top1_all, pad1.expand(padding)]),
            torch.cat([topk_all, padk.expand(padding, -1)]),
            torch.cat([labels_all, torch.zeros(padding, dtype=torch.long)]),
            num_classes,
        )
    headline = "mean_per_class_recall" if entry is not None and entry.metric == "mean_per_class" else "top1"
    if (
        protocol.dataset_definitions == "clip_benchmark"
    ):  # it has no per-dataset headline; its tables rank by acc1
        headline = "top1"
        result["clip_benchmark_metrics"] = clip_benchmark_metrics(metrics, num_classes)
        if entry is not None and clip_benchmark_notices(entry.name, data):
            result["notices"] = clip_benchmark_notices(entry.name, data)
    result.update(metric=headline, score=metrics[headline], metrics=metrics)
    result["per_class"] = per_class_accuracy(confusion, data.classnames)
    repeated = repeated_names(data.classnames)
    if repeated:
        result["warnings"] = [repeated]
    if skipped:
        result["skipped_images"] = skipped
    if return_predictions:
        result["predictions"] = gathered[:, 0].tolist()
        result["top_k"] = [row[2:].tolist() if row[0] != _SKIPPED else [] for row in gathered]
        result["confusion_matrix"] = confusion.tolist()
        result["data"] = data
    return result


def per_class_accuracy(confusion: torch.Tensor, classnames: Sequence[str]) -> list[dict]:
    """Each class's images and top-1 accuracy (its recall, %; None for a class without images),
    from the confusion matrix [true][predicted]."""
    totals = confusion.sum(dim=1).tolist()
    hits = confusion.diagonal().tolist()
    return [
        {"class": name, "images": n, "top1": 100.0 * h / n if n else None}
        for name, n, h in zip(classnames, totals, hits)
    ]


def _preprocessing(dali: bool, input_size: int, device: torch.device | str) -> str:
    if not dali:
        return PIL_PREPROCESSING
    from src.evaluation.dali_val import dali_preprocessing  # DALI is imported only where it runs

    return dali_preprocessing(input_size, device)


def evaluate_retrieval(
    model: torch.nn.Module,
    dataset_spec: DatasetSpec | str | Path,
    input_size: int,
    device: torch.device | str,
    batch_size: int = 64,
    workers: int = 0,
    tokenizer: Tokenizer | None = None,
    progress: bool = False,
    captions_per_image: int | None = None,
    protocol: Protocol | str = STANDARD,
) -> dict:
    """Image<->text retrieval of one dataset: ``{"dataset", "task": "retrieval", "protocol",
    "num_images", "num_captions", "metrics": {"image_to_text_R@1", ..., "text_to_image_R@10",
    "mean_recall"}}``. The original protocol prefixes every caption with "a photo of ". An image
    that cannot be read is left out with its captions and listed under "skipped_images"."""
    protocol = get_protocol(protocol)
    data = load_retrieval_data(dataset_spec, captions_per_image, protocol)
    with eval_mode(model):
        image_emb, positions, failed = encode_images(
            model, data.images, input_size, device, batch_size, workers, progress, desc=data.name
        )
        if image_emb is None:
            first = skipped_list(data.images, failed)[0]
            raise EvalDataError(
                f"dataset {data.name}: none of its {len(data.images)} images could be read "
                f"(e.g. {first['image']}: {first['error']})"
            )
        new_index = {old: new for new, old in enumerate(positions)}
        kept = [j for j, i in enumerate(data.caption_image) if i in new_index]
        captions = [protocol.caption_prefix + data.captions[j] for j in kept]
        text_emb = encode_texts(model, captions, device, tokenizer=tokenizer)
    result = {
        "dataset": data.name,
        "task": "retrieval",
        "protocol": protocol.name,
        "num_images": len(positions),
        "num_captions": len(captions),
        "preprocessing": PIL_PREPROCESSING,
        "metrics": retrieval_metrics(image_emb, text_emb, [new_index[data.caption_image[j]] for j in kept]),
    }
    if protocol.dataset_definitions == "clip_benchmark":
        result["clip_benchmark_metrics"] = clip_benchmark_retrieval_metrics(result["metrics"])
    if failed:
        result["skipped_images"] = skipped_list(data.images, failed)
    return result


@torch.no_grad()
def classify_images(
    model: torch.nn.Module,
    images: Sequence[ImageSource],
    labels: Sequence[str],
    input_size: int,
    device: torch.device | str,
    templates: Sequence[str] | None = None,
    batch_size: int = 64,
    workers: int = 0,
    tokenizer: Tokenizer | None = None,
) -> tuple[list[dict], list[dict]]:
    """The top label of each readable image among `labels` (prompted with `templates`, by default
    CLIP's 80 ImageNet ones): ``[{"image", "label", "probability", "top_k": [(label,
    probability), ...]}]``, the probability a softmax over the labels at CLIP's scale of 100, top_k
    the best min(5, labels) of them; and the unreadable images, ``[{"image", "error"}]``."""
    if len(set(labels)) != len(labels) or not all(label.strip() for label in labels):
        raise EvalDataError("--labels: give distinct, non-empty labels, e.g. --labels 'cat,dog,car'")
    templates = list(templates or load_metadata(LABEL_TEMPLATES_FROM)[1])
    with eval_mode(model):
        classifier = sharded_class_embeddings(model, labels, templates, device, tokenizer=tokenizer)
        features, positions, failed = encode_images(model, images, input_size, device, batch_size, workers)
    skipped = skipped_list(images, failed)
    if features is None:
        raise EvalDataError(
            f"--images: none of the {len(images)} images could be read "
            f"(e.g. {skipped[0]['image']}: {skipped[0]['error']})"
        )
    probabilities = class_logits(features, classifier).softmax(dim=1).cpu()
    best = probabilities.topk(min(5, len(labels)), dim=1)
    rows = [
        {
            "image": str(images[pos]),
            "label": labels[int(i[0])],
            "probability": float(p[0]),
            "top_k": [(labels[int(j)], float(q)) for j, q in zip(i, p)],
        }
        for pos, i, p in zip(positions, best.indices, best.values)
    ]
    return rows, skipped
