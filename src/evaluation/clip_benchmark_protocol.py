"""The paper's datasets as CLIP_benchmark 1.6.2 defines them, for `--protocol clip_benchmark`.

`clip_benchmark eval --dataset NAME` builds each dataset with torchvision's class (its own copy for
Caltech101) and takes class names from those classes or from its bundled `en_classnames.json`, and
templates from its `en_zeroshot_classification_templates.json`. Where that differs from the
original's definitions (src/evaluation/paper_datasets.py), this module follows CLIP_benchmark:

- SUN397: every image, no split (its builder ignores --split); names with "_" and "/" as spaces.
- Caltech101: every image, the BACKGROUND_Google folder kept as class 0 ("background", 102 names);
  each class folder holds image_0001.jpg .. image_N.jpg, N its number of .jpg files.
- Pets: torchvision's names, made from the image ids of annotations/test.txt (without the
  original's two typos).
- CIFAR: the names as the pickles spell them (CIFAR-100's keep their underscores); Food101: the
  class keys with "_" as spaces; Cars, Aircraft, DTD: the names in the dataset's own files.
- Flowers and ImageNet: its bundled names, which are the original's.
The splits of the other datasets, and every dataset's templates, are the original's (the same
files and lists). CLIP_benchmark reports top-1, top-5 and mean per-class recall for every dataset,
as fractions; `clip_benchmark_metrics` gives them in its form, and the headline is top-1.
Retrieval is the standard protocol's (captions as written) on CLIP_benchmark's own annotation
files (coco_test_karpathy.json, flickr30k_test_karpathy.txt; datasets.py reads them, every caption
kept); `clip_benchmark_retrieval_metrics` gives its recalls in CLIP_benchmark's form.

One CLIP_benchmark behaviour is not copied: for Flowers it subtracts one from every label when the
first test image's label is 1, a repair for torchvision's 1-based Flowers102 labels of before 0.13,
which today's 0-based labels trip whenever the first test image is of class 1. Ours are the
dataset's labels, never shifted; `clip_benchmark_notices` says when CLIP_benchmark would shift them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from src.evaluation.datasets import ClassificationData, EvalDataError, ImageSource
from src.evaluation.paper_datasets import PaperDataset, locate, sun397_images
from src.open_alip.zero_shot import load_metadata

# Our name -> the name `clip_benchmark eval --dataset` takes.
CLIP_BENCHMARK_NAMES = {
    "cifar10": "cifar10",
    "cifar100": "cifar100",
    "food101": "food101",
    "pets": "pets",
    "flowers": "flowers",
    "sun397": "sun397",
    "stanford_car": "cars",
    "dtd": "dtd",
    "caltech101": "caltech101",
    "aircraft": "fgvc_aircraft",
    "imagenet": "imagenet1k",
}
CALTECH101_BACKGROUND = "BACKGROUND_Google"
NUM_CLASSES = {"caltech101": 102}  # where CLIP_benchmark's class count differs from the original's


def read_caltech101_all(folder: Path) -> ClassificationData:
    """Every image of 101_ObjectCategories, background included, class-major in sorted folder order."""
    folders = sorted(os.listdir(folder))
    names, _ = load_metadata("caltech101")
    if CALTECH101_BACKGROUND not in folders:
        raise EvalDataError(
            f"caltech101: {folder} has no {CALTECH101_BACKGROUND}/; CLIP_benchmark counts it as a class"
        )
    images: list[ImageSource] = []
    labels: list[int] = []
    for label, cls in enumerate(folders):
        class_dir = folder / cls
        if not class_dir.is_dir():
            raise EvalDataError(
                f"caltech101: {class_dir} is not a class folder; 101_ObjectCategories holds only those"
            )
        count = sum(1 for f in os.listdir(class_dir) if f.endswith(".jpg"))
        for i in range(1, count + 1):
            path = class_dir / f"image_{i:04d}.jpg"
            if not path.is_file():
                raise EvalDataError(
                    f"caltech101: {path} is missing; each class folder must hold exactly image_0001.jpg.. "
                    f"image_{count:04d}.jpg (CLIP_benchmark counts its .jpg files)"
                )
            images.append(path)
            labels.append(label)
    return ClassificationData("caltech101", images, labels, ["background", *(names or [])])


def _pets_names(data: ClassificationData, num_classes: int) -> list[str]:
    """torchvision's: per label, the image id without its number, each "_"-part title-cased."""
    by_label: dict[int, str] = {}
    for image, label in zip(data.images, data.labels):
        raw = Path(str(image)).stem.rsplit("_", 1)[0]
        by_label.setdefault(label, " ".join(part.title() for part in raw.split("_")))
    if sorted(by_label) != list(range(num_classes)):
        raise EvalDataError(
            f"pets: annotations/test.txt names images of {len(by_label)} of the {num_classes} breeds; "
            "CLIP_benchmark takes the class names from it, so it must be the complete file"
        )
    return [by_label[i] for i in range(num_classes)]


def _names_from(data: ClassificationData, entry: PaperDataset) -> list[str]:
    name = entry.name
    if name in ("cifar10", "cifar100"):
        return list(data.file_classnames or data.classnames)
    if name == "food101":
        return [c.replace("_", " ") for c in data.classnames]
    if name == "sun397":
        return [c.replace("_", " ").replace("/", " ") for c in data.classnames]
    if name == "pets":
        return _pets_names(data, entry.num_classes)
    if name in ("flowers", "imagenet"):
        return list(load_metadata(name)[0] or [])
    return list(
        data.classnames
    )  # caltech101 (set by its reader), stanford_car, aircraft, dtd: the files' names


_READERS: dict[str, Callable[[Path], ClassificationData]] = {
    "sun397": sun397_images,
    "caltech101": read_caltech101_all,
}


def read_clip_benchmark_dataset(entry: PaperDataset, path: Path) -> tuple[ClassificationData, list[str]]:
    """The dataset as `clip_benchmark eval --dataset NAME` evaluates it, and its templates."""
    path = Path(path)
    if not path.exists():
        raise EvalDataError(f"{entry.name}: {path} does not exist")
    folder = path if entry.name == "imagenet" else locate(entry, path)
    data = _READERS.get(entry.name, entry.read)(folder)
    names = _names_from(data, entry)
    expected = NUM_CLASSES.get(entry.name, entry.num_classes)
    if len(names) != expected:
        raise EvalDataError(
            f"{entry.name}: {folder} defines {len(names)} classes, CLIP_benchmark's has {expected}"
        )
    known = [label for label in data.labels if label >= 0]
    if known and not 0 <= min(known) <= max(known) < expected:
        raise EvalDataError(f"{entry.name}: {folder} has class labels outside 0..{expected - 1}")
    data.classnames = names
    data.file_classnames = None
    return data, list(load_metadata(entry.name)[1] or [])


def clip_benchmark_metrics(metrics: dict[str, float], num_classes: int) -> dict[str, float | None]:
    """Our percentages in CLIP_benchmark's result form: fractions named acc1, acc5 and
    mean_per_class_recall (acc5 None, its NaN, for fewer than 5 classes)."""
    return {
        "acc1": metrics["top1"] / 100.0,
        "acc5": metrics["top5"] / 100.0 if num_classes >= 5 else None,
        "mean_per_class_recall": metrics["mean_per_class_recall"] / 100.0,
    }


def clip_benchmark_retrieval_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Our retrieval recalls in CLIP_benchmark's form: fractions, "image_retrieval" for text -> image
    and "text_retrieval" for image -> text (it computes only R@5 unless --recall_k says more)."""
    out = {}
    for key, value in metrics.items():
        direction, _, k = key.rpartition("_R@")
        if direction in ("text_to_image", "image_to_text"):
            kind = "image" if direction == "text_to_image" else "text"
            out[f"{kind}_retrieval_recall@{k}"] = value / 100.0
    return out


def clip_benchmark_notices(dataset: str, data: ClassificationData) -> list[str]:
    """Where `clip_benchmark eval` would score this data differently from us (see the module doc)."""
    if dataset == "flowers" and data.labels and int(data.labels[0]) == 1:
        return [
            "the first test image of flowers has label 1, so CLIP_benchmark 1.6.2 subtracts one from every "
            "label (its repair for old torchvision's 1-based labels): its flowers numbers score other labels "
            "than these, which are the dataset's own, unshifted"
        ]
    return []
