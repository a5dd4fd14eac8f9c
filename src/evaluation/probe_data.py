"""The splits a linear probe reads: the paper's datasets in torchvision's layouts (their train, val
where defined, and test splits: src/evaluation/paper_datasets.py), or a folder of your own with
`train/`, `test/` and optionally `val/` ImageFolder trees (`<split>/<class>/<image>`, the same class
folders in each); and the validation split held out of the training split where a dataset defines
none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from src.evaluation.datasets import ClassificationData, EvalDataError, read_image_folder
from src.evaluation.paper_datasets import read_paper_dataset
from src.evaluation.specs import DatasetSpec, paper_dataset_of

OWN_SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class ProbeDataset:
    """Where a probe's splits come from: `splits` are the ones the dataset defines."""

    spec: DatasetSpec
    splits: tuple[str, ...]
    metric: str  # the dataset's headline metric: "top1" or "mean_per_class_recall"
    paper: bool  # one of the paper's datasets

    @property
    def name(self) -> str:
        return self.spec.name

    def read(self, split: str) -> ClassificationData:
        if split not in self.splits:
            raise EvalDataError(f"dataset {self.name}: no {split!r} split (it has {', '.join(self.splits)})")
        entry = paper_dataset_of(self.spec)
        if entry is not None:
            data = read_paper_dataset(entry, self.spec.path, split)[0]
        else:
            data = read_image_folder(self.spec.path / split, self.spec.classnames, name=self.spec.name)
        data.name = self.spec.name
        return data


def probe_dataset(spec: DatasetSpec) -> ProbeDataset:
    """The spec as a probe reads it, checked before any model is loaded."""
    entry = paper_dataset_of(spec)
    if entry is not None:
        metric = "mean_per_class_recall" if entry.metric == "mean_per_class" else "top1"
        return ProbeDataset(spec, entry.splits, metric, True)
    if not spec.path.is_dir():
        raise EvalDataError(
            f"dataset {spec.name}: a linear probe needs a folder ({spec.path} is not one): one of "
            "the paper's datasets by name, or a folder with train/ and test/ (and val/) class folders"
        )
    splits = tuple(s for s in OWN_SPLITS if (spec.path / s).is_dir())
    if "train" not in splits or "test" not in splits:
        raise EvalDataError(
            f"dataset {spec.name}: {spec.path} has no train/ and test/ folders; a linear probe of "
            "your own images reads train/<class>/<image> and test/<class>/<image> (val/ optional)"
        )
    return ProbeDataset(spec, splits, "top1", False)


def check_same_classes(name: str, splits: dict[str, ClassificationData]) -> list[str]:
    """The class names every split shares (own folders must hold the same class folders)."""
    first_split, first = next(iter(splits.items()))
    for split, data in splits.items():
        if data.classnames != first.classnames:
            raise EvalDataError(
                f"dataset {name}: {split}/ and {first_split}/ hold different class folders; give "
                "every split the same <class> folders (an empty one is refused)"
            )
    return list(first.classnames)


def held_out_mask(count: int, fraction: float, seed: int) -> torch.Tensor:
    """Which of `count` training rows form the validation split: round(fraction * count) of them (at
    least one, and one short of all), drawn by torch's randperm with `seed`."""
    if not 0 < fraction < 1:
        raise EvalDataError(f"--val-fraction {fraction}: give a fraction between 0 and 1, e.g. 0.2")
    if count < 2:
        raise EvalDataError(f"a validation split needs at least 2 training images, this split has {count}")
    size = min(max(1, round(fraction * count)), count - 1)
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    mask = torch.zeros(count, dtype=torch.bool)
    mask[order[:size]] = True
    return mask


def describe_splits(splits: Sequence[str]) -> str:
    return "its own val split" if "val" in splits else "held out of train"
