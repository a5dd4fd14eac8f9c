"""The paper's 11 datasets read from miniature copies in torchvision's layouts: the split each
reader evaluates, its class order and labels, both forms of PATH, and one clear line for a broken
layout. Caltech101 is a full-size tree (8,677 hard links) so that its evaluated subset can be
checked against torch's own random_split with the original's seed."""

import json
from pathlib import Path

import pytest
import torch

from src.evaluation.datasets import LABEL_IN_RECORD, EvalDataError, ImageDataset, RecordImage
from src.evaluation.paper_datasets import (
    PAPER_DATASETS,
    describe,
    find_paper_dataset,
    read_paper_dataset,
    read_sun397,
)
from src.evaluation.specs import load_classification_data
from src.open_alip.zero_shot import load_metadata
from tests import _eval_layouts as layouts


def _read(name: str, path: Path):
    return read_paper_dataset(find_paper_dataset(name), path)


def _check(data, paths, labels):
    assert [Path(p) for p in data.images] == list(paths)
    assert data.labels == list(labels)


@pytest.mark.parametrize(
    "name,writer,inner",
    [
        ("food101", layouts.write_food101, "food-101"),
        ("stanford_car", layouts.write_stanford_cars, "stanford_cars"),
        ("aircraft", layouts.write_aircraft, "fgvc-aircraft-2013b"),
        ("dtd", layouts.write_dtd, "dtd"),
        ("pets", layouts.write_pets, "oxford-iiit-pet"),
        ("flowers", layouts.write_flowers, "flowers-102"),
    ],
)
def test_split_file_layouts(tmp_path, name, writer, inner):
    paths, labels = writer(tmp_path)
    entry = find_paper_dataset(name)
    for path in (tmp_path, tmp_path / inner):  # torchvision's root, or the dataset's own folder
        data, templates = _read(name, path)
        _check(data, paths, labels)
        names, bundled_templates = load_metadata(name)
        assert data.classnames == names and len(names) == entry.num_classes
        assert templates == bundled_templates


def test_dtd_inner_folder_and_sorted_classes(tmp_path):
    paths, labels = layouts.write_dtd(tmp_path)
    data, _ = _read("dtd", tmp_path / "dtd" / "dtd")
    _check(data, paths, labels)
    assert labels[:3] == [46, 0, 1]  # banded < lined < texture.. < zigzagged, whatever the file's order


def test_food101_labels_follow_sorted_names_items_follow_the_json(tmp_path):
    paths, labels = layouts.write_food101(tmp_path)
    assert labels == [100, 100, 0, 99, 99]  # apple_pie < dish_000.. < ramen < waffles
    assert [p.name for p in paths] == ["11.jpg", "3.jpg", "7.jpg", "1.jpg", "2.jpg"]
    _check(_read("food101", tmp_path)[0], paths, labels)


@pytest.mark.parametrize("variant", ["cifar10", "cifar100"])
def test_cifar_test_batch(tmp_path, variant):
    labels = layouts.write_cifar(tmp_path, variant, [3, 0, 9, 3])
    data, templates = _read(variant, tmp_path)
    assert data.labels == labels and len(data.images) == 4
    assert data.classnames == load_metadata(variant)[0] and len(templates) == 18


def test_sun397_is_a_fixed_seeded_split_of_the_sorted_images(tmp_path):
    paths, labels = layouts.write_sun397(tmp_path, per_class=5)  # 20 images
    lengths = (4, 6, 10)
    data = read_sun397(tmp_path / "SUN397", lengths=lengths, seed=3072)
    train, test, rest = torch.utils.data.random_split(
        list(range(20)), list(lengths), generator=torch.Generator().manual_seed(3072)
    )
    assert [Path(p) for p in data.images] == [paths[i] for i in test]
    assert data.labels == [labels[i] for i in test]
    assert data.classnames == ["abbey", "apartment_building/outdoor", "bakery/shop", "youth_hostel"]
    with pytest.raises(EvalDataError, match=r"found 20 sun_\*.jpg images.*needs 108754"):
        _read("sun397", tmp_path)  # the protocol's split needs the whole dataset


def test_caltech101_evaluates_exactly_the_seeded_split(tmp_path):
    listing = layouts.write_caltech101(tmp_path)
    assert len(listing) == 8677
    data, templates = _read("caltech101", tmp_path)
    _, test = torch.utils.data.random_split(
        listing, [3000, 5677], generator=torch.Generator().manual_seed(3072)
    )
    assert len(data.images) == 5677 == PAPER_DATASETS["caltech101"].test_size
    assert list(zip(data.images, data.labels)) == list(test)
    assert len(set(data.labels)) == 101 and "BACKGROUND_Google" not in {
        Path(p).parent.name for p in data.images
    }
    assert data.classnames[:2] == ["off-center face", "centered face"] and len(templates) == 34
    # the dataset's own folder works too, and so does 101_ObjectCategories itself
    for path in (tmp_path / "caltech101", tmp_path / "caltech101" / "101_ObjectCategories"):
        assert _read("caltech101", path)[0].images == data.images
    # an entry counted but not named image_NNNN.jpg (torchvision would fail on it too)
    (tmp_path / "caltech101" / "101_ObjectCategories" / "ant" / "notes.txt").write_text("x")
    with pytest.raises(EvalDataError, match=r"found 8678 images.*needs 8677"):
        _read("caltech101", tmp_path)


def test_imagenet_val_rec_labels_come_from_the_records(tmp_path):
    rec = layouts.write_imagenet_rec(tmp_path / "imagenet", [7, 0, 999, 3])
    for path in (rec, tmp_path / "imagenet"):
        data, templates = _read("imagenet", path)
        assert [(i.rec, i.offset) for i in data.images][0] == (rec, 0)
        assert all(isinstance(i, RecordImage) for i in data.images) and len(data.images) == 4
        assert data.labels == [LABEL_IN_RECORD] * 4 and len(templates) == 80
    labels = [ImageDataset(data.images, data.labels, size=16)[i][1] for i in range(4)]
    assert labels == [7, 0, 999, 3]
    arrays = layouts.write_imagenet_rec(tmp_path / "arrays", [5, 2], label_array=True)
    data, _ = _read("imagenet", arrays)
    assert [ImageDataset(data.images, data.labels, size=16)[i][1] for i in range(2)] == [5, 2]


def test_registry_matches_the_bundled_names_and_the_paper(tmp_path):
    assert list(PAPER_DATASETS) == [
        "cifar10",
        "cifar100",
        "food101",
        "pets",
        "flowers",
        "sun397",
        "stanford_car",
        "dtd",
        "caltech101",
        "aircraft",
        "imagenet",
    ]
    sizes = {r["name"]: (r["classes"], r["test_images"], r["metric"]) for r in describe()}
    assert sizes == {
        "cifar10": (10, 10000, "top1"),
        "cifar100": (100, 10000, "top1"),
        "food101": (101, 25250, "top1"),
        "pets": (37, 3669, "mean_per_class"),
        "flowers": (102, 6149, "mean_per_class"),
        "sun397": (397, 19850, "top1"),
        "stanford_car": (196, 8041, "top1"),
        "dtd": (47, 1880, "top1"),
        "caltech101": (101, 5677, "mean_per_class"),
        "aircraft": (100, 3333, "mean_per_class"),
        "imagenet": (1000, 50000, "top1"),
    }
    for row in describe():
        names, templates = load_metadata(row["name"])
        assert len(names) == row["classes"] and len(templates) == row["templates"]
    # the original's class names, typos included
    assert "Yorkshire Terrie" in load_metadata("pets")[0]
    assert find_paper_dataset("fgvc_aircraft").name == "aircraft" and find_paper_dataset("scenes") is None


@pytest.mark.parametrize(
    "name,writer,break_it,needle",
    [
        (
            "food101",
            layouts.write_food101,
            lambda r: (r / "food-101/meta/test.json").unlink(),
            "food-101/meta/test.json",
        ),
        (
            "food101",
            layouts.write_food101,
            lambda r: (r / "food-101/images/ramen/2.jpg").unlink(),
            "food-101/images/ramen/2.jpg listed in",
        ),
        (
            "dtd",
            layouts.write_dtd,
            lambda r: (r / "dtd/dtd/images/lined/lined_0010.jpg").unlink(),
            "lined_0010.jpg listed in",
        ),
        (
            "pets",
            layouts.write_pets,
            lambda r: (r / "oxford-iiit-pet/annotations/test.txt").write_text("x 1\n"),
            "annotations/test.txt line 'x 1'",
        ),
        (
            "flowers",
            layouts.write_flowers,
            lambda r: (r / "flowers-102/imagelabels.mat").unlink(),
            "flowers-102/imagelabels.mat is missing",
        ),
        (
            "stanford_car",
            layouts.write_stanford_cars,
            lambda r: (r / "stanford_cars/cars_test/00017.jpg").touch(),
            None,
        ),
        (
            "stanford_car",
            layouts.write_stanford_cars,
            lambda r: (r / "stanford_cars/cars_test_annos_withlabels.mat").write_text("junk"),
            "as a MATLAB file",
        ),
        (
            "aircraft",
            layouts.write_aircraft,
            lambda r: (r / "fgvc-aircraft-2013b/data/images_variant_test.txt").write_text("1 Concorde\n"),
            "variant not in variants.txt",
        ),
        (
            "food101",
            layouts.write_food101,
            lambda r: (r / "food-101/meta/test.json").write_text(json.dumps({"a": ["../../x"]})),
            "not a path inside",
        ),
    ],
)
def test_broken_layouts_name_the_file(tmp_path, name, writer, break_it, needle):
    writer(tmp_path)
    break_it(tmp_path)
    if needle is None:  # an extra file is no error
        _read(name, tmp_path)
        return
    with pytest.raises(EvalDataError) as info:
        _read(name, tmp_path)
    message = str(info.value)
    assert needle in message and "\n" not in message, message


def test_wrong_folder_names_the_expected_layout(tmp_path):
    with pytest.raises(EvalDataError, match=r"has no food-101/meta/test.json .*pass the torchvision root"):
        _read("food101", tmp_path)
    # through the spec: a paper dataset name reads its layout, not the folder as a class tree
    (tmp_path / "apple_pie").mkdir()
    with pytest.raises(EvalDataError, match="food-101/meta/test.json"):
        load_classification_data(f"food101={tmp_path}")
