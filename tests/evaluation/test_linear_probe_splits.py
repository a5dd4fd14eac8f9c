"""The training and validation splits a linear probe reads, from miniature copies in torchvision's
layouts: each reader's train (and val) listing and labels, the class order shared with the test
split, the seeded datasets' first piece, ImageNet's train/ folder, folders of your own, and the
held-out validation draw."""

from pathlib import Path

import pytest
import torch

from src.evaluation.datasets import EvalDataError
from src.evaluation.paper_datasets import PAPER_DATASETS, find_paper_dataset, read_paper_dataset, read_sun397
from src.evaluation.probe_data import held_out_mask, probe_dataset
from src.evaluation.probe_settings import LINEAR_PROBE_DATASETS
from src.evaluation.specs import DatasetSpec
from tests import _eval_layouts as layouts

WRITERS = {
    "food101": layouts.write_food101,
    "pets": layouts.write_pets,
    "flowers": layouts.write_flowers,
    "stanford_car": layouts.write_stanford_cars,
    "dtd": layouts.write_dtd,
    "aircraft": layouts.write_aircraft,
}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_train_and_val_splits_in_torchvisions_layouts(tmp_path, name):
    test_paths, test_labels = WRITERS[name](tmp_path)
    expected = layouts.write_probe_splits(tmp_path, name)
    entry = find_paper_dataset(name)
    assert set(expected) | {"test"} == set(entry.splits)
    for split, (paths, labels) in expected.items():
        data, _ = read_paper_dataset(entry, tmp_path, split)
        assert [Path(p) for p in data.images] == paths and data.labels == labels, split
        assert data.classnames == read_paper_dataset(entry, tmp_path)[0].classnames
    test, _ = read_paper_dataset(entry, tmp_path)  # the test split is unchanged
    assert [Path(p) for p in test.images] == test_paths and test.labels == test_labels
    with pytest.raises(EvalDataError, match=f"{name}: no 'validation' split"):
        read_paper_dataset(entry, tmp_path, "validation")


@pytest.mark.parametrize("variant", ["cifar10", "cifar100"])
def test_cifar_training_batches(tmp_path, variant):
    layouts.write_cifar(tmp_path, variant, [1, 2])
    _, labels = layouts.write_probe_splits(tmp_path, variant)["train"]
    data, _ = read_paper_dataset(find_paper_dataset(variant), tmp_path, "train")
    assert data.labels == labels and len(data.images) == len(labels) == (10 if variant == "cifar10" else 2)
    assert len({img.tobytes() for img in data.images}) == len(labels)  # every batch's own pixels


def test_sun397_trains_on_the_first_piece_of_the_seeded_split(tmp_path):
    paths, labels = layouts.write_sun397(tmp_path, per_class=5)
    lengths = (4, 6, 10)
    train_idx, test_idx, _ = torch.utils.data.random_split(
        list(range(20)), list(lengths), generator=torch.Generator().manual_seed(3072)
    )
    train = read_sun397(tmp_path / "SUN397", "train", lengths=lengths)
    test = read_sun397(tmp_path / "SUN397", "test", lengths=lengths)
    assert [Path(p) for p in train.images] == [paths[i] for i in train_idx]
    assert train.labels == [labels[i] for i in train_idx]
    assert [Path(p) for p in test.images] == [paths[i] for i in test_idx]
    assert not set(train.images) & set(test.images)


def test_caltech101_trains_on_the_first_piece_of_the_seeded_split(tmp_path):
    listing = layouts.write_caltech101(tmp_path)
    train, _ = read_paper_dataset(PAPER_DATASETS["caltech101"], tmp_path, "train")
    expected, _ = torch.utils.data.random_split(
        listing, [3000, 5677], generator=torch.Generator().manual_seed(3072)
    )
    assert list(zip(train.images, train.labels)) == list(expected)
    assert len(train.images) == PAPER_DATASETS["caltech101"].split_sizes[0]


def test_imagenet_train_folder_beside_val_rec(tmp_path):
    rec = layouts.write_imagenet_rec(tmp_path, [3, 1])
    paths, labels = layouts.write_imagenet_train(tmp_path, {0: 2, 999: 1})
    entry = find_paper_dataset("imagenet")
    for path in (tmp_path, rec):  # the root holding val.rec and train/, or val.rec itself
        data, _ = read_paper_dataset(entry, path, "train")
        assert [Path(p) for p in data.images] == paths and data.labels == labels == [0, 0, 999]
    with pytest.raises(EvalDataError, match="no train/ folder"):
        read_paper_dataset(entry, tmp_path / "train" / "n00000000", "train")


def test_registry_split_sizes_and_the_linear_probe_table():
    assert LINEAR_PROBE_DATASETS == tuple(name for name in PAPER_DATASETS if name != "imagenet")
    for entry in PAPER_DATASETS.values():
        assert len(entry.split_sizes) == len(entry.splits) and entry.splits[-1] == "test"
        assert entry.split_sizes[-1] == entry.test_size, entry.name
    with_val = {name for name, entry in PAPER_DATASETS.items() if "val" in entry.splits}
    assert with_val == {"flowers", "dtd", "aircraft"}


def test_own_folders_need_train_and_test(tmp_path):
    layouts.write_own_splits(tmp_path / "own", [(200, 0, 0), (0, 0, 200)], {"train": 2, "test": 1})
    dataset = probe_dataset(DatasetSpec("own", tmp_path / "own"))
    assert dataset.splits == ("train", "test") and dataset.metric == "top1" and not dataset.paper
    assert dataset.read("train").classnames == ["class0", "class1"]
    (tmp_path / "flat" / "cat").mkdir(parents=True)
    with pytest.raises(EvalDataError, match="no train/ and test/ folders"):
        probe_dataset(DatasetSpec("flat", tmp_path / "flat"))
    assert (
        probe_dataset(DatasetSpec("pets", tmp_path)).metric == "mean_per_class_recall"
    )  # a paper dataset by name


def test_held_out_validation_is_a_seeded_draw():
    mask = held_out_mask(50, 0.2, seed=0)
    assert mask.sum() == 10 and torch.equal(mask, held_out_mask(50, 0.2, seed=0))
    assert not torch.equal(mask, held_out_mask(50, 0.2, seed=1))
    order = torch.randperm(50, generator=torch.Generator().manual_seed(0))
    assert set(torch.nonzero(mask).flatten().tolist()) == set(order[:10].tolist())
    assert (
        held_out_mask(3, 0.01, 0).sum() == 1 and held_out_mask(3, 0.99, 0).sum() == 2
    )  # never empty, never all
    with pytest.raises(EvalDataError, match="--val-fraction 1.5"):
        held_out_mask(10, 1.5, 0)
