"""The paper's 11 zero-shot classification datasets, read from the layouts torchvision's dataset classes
use (what users already have on disk), with the test split the original evaluation uses, and the
training split (and the validation split, where the dataset defines one) that a linear probe fits on.

One reader per dataset, registered by name in `PAPER_DATASETS` (the paper's table order), so that
`zero_shot.py --list-datasets` and `NAME=PATH` dispatch from one table. PATH is the torchvision `root`
(the folder holding food-101/, dtd/, ...) or the dataset's own folder; `locate` accepts both.

Class names and templates are the original's (src/open_alip/zero_shot_data/). The facts behind
each reader (file names, split sizes, class order, metric) are in docs/evaluation.md. Every reader
takes the split to read ("test" unless said: `PaperDataset.splits` lists the dataset's).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from src.evaluation.datasets import (
    ClassificationData,
    EvalDataError,
    ImageSource,
    read_cifar,
    read_imagenet_rec,
    read_imagenet_val,
)
from src.open_alip.zero_shot import load_metadata

# The original passes seed 3072 to every split it draws (zero_shot.py main); we keep it, and for
# SUN397 drop the per-process hash("sun397") term that made its split unreproducible.
SPLIT_SEED = 3072
CALTECH101_SPLIT = (3000, 5677)
SUN397_SPLIT = (19850, 19850, 69054)
# Which piece of a seeded split is which split: the original evaluates the second piece; the first
# is the training split a linear probe fits on (SUN397's third piece is used by neither).
SEEDED_PIECES = {"train": 0, "test": 1}

TRAIN_TEST = ("train", "test")
TRAIN_VAL_TEST = ("train", "val", "test")


@dataclass(frozen=True)
class PaperDataset:
    name: str  # the key of the original's label.json / template.json
    title: str  # its column in the paper's table
    folders: tuple[str, ...]  # where the data folder may sit relative to PATH ("" = PATH itself)
    marker: str  # a file (or folder) inside the data folder that identifies the layout
    num_classes: int
    test_size: int
    metric: str  # "top1" or "mean_per_class"
    layout: str  # what --list-datasets prints
    read: Callable[..., ClassificationData]  # (data folder, split="test")
    aliases: tuple[str, ...] = ()
    splits: tuple[str, ...] = TRAIN_TEST  # the splits its files define
    split_sizes: tuple[int, ...] = ()  # images per split of `splits` in the complete dataset


def locate(entry: PaperDataset, path: Path) -> Path:
    """The dataset's data folder: PATH/<folder> for the torchvision root, or PATH itself."""
    path = Path(path)
    for folder in entry.folders:
        candidate = path / folder if folder else path
        if (candidate / entry.marker).exists():
            return candidate
    expected = entry.folders[0] + "/" + entry.marker
    raise EvalDataError(
        f"{entry.name}: {path} has no {expected} ({entry.layout}); pass the torchvision root that holds "
        f"{entry.folders[0].split('/')[0]}/ or that folder itself"
    )


def _require_file(path: Path, name: str) -> Path:
    if not path.is_file():
        raise EvalDataError(f"{name}: {path} is missing")
    return path


def _check_images(images: Sequence[Path], name: str, listed_in: Path) -> None:
    for image in images:
        if not image.is_file():
            raise EvalDataError(f"{name}: image {image} listed in {listed_in} is missing")


def _relative(root: Path, relative: str, name: str, listed_in: Path) -> Path:
    """root/relative, refusing names that climb out of root (a tampered split file)."""
    parts = Path(relative).parts
    if not relative or Path(relative).is_absolute() or ".." in parts:
        raise EvalDataError(f"{name}: {listed_in} names {relative!r}, which is not a path inside {root}")
    return root.joinpath(*parts)


def seeded_split(count: int, lengths: Sequence[int], part: int, seed: int, name: str, what: str) -> list[int]:
    """Indices of part `part` of torch's random_split(range(count), lengths, Generator().manual_seed(seed)):
    a randperm of `count` cut into consecutive pieces of `lengths`."""
    if sum(lengths) != count:
        raise EvalDataError(
            f"{name}: found {count} {what}, but the split {list(lengths)} needs {sum(lengths)}; "
            "the dataset on disk is incomplete or has extra files"
        )
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed)).tolist()
    start = sum(lengths[:part])
    return order[start : start + lengths[part]]


def _mat(path: Path, name: str) -> dict:
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    _require_file(path, name)
    try:
        return loadmat(str(path), squeeze_me=True)
    except (MatReadError, ValueError, OSError, TypeError) as exc:
        raise EvalDataError(f"{name}: cannot read {path} as a MATLAB file ({exc})") from None


def _numbered(count: int) -> list[str]:
    # Layouts without class names (the names come from the bundled list): placeholders to count them.
    return [str(i) for i in range(count)]


def _lines(path: Path, name: str) -> list[str]:
    try:
        text = _require_file(path, name).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise EvalDataError(f"{name}: {path} is not a text file ({exc}); re-download the dataset") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------
# one reader per layout; each takes the data folder found by `locate`


def _check_split(name: str, split: str, splits: Sequence[str]) -> None:
    if split not in splits:
        raise EvalDataError(f"{name}: no {split!r} split; it has {', '.join(splits)}")


def _seeded_piece(name: str, split: str) -> int:
    _check_split(name, split, tuple(SEEDED_PIECES))
    return SEEDED_PIECES[split]


def read_food101(folder: Path, split: str = "test") -> ClassificationData:
    _check_split("food101", split, TRAIN_TEST)
    split_file = _require_file(folder / "meta" / f"{split}.json", "food101")
    try:
        meta = json.loads(split_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EvalDataError(
            f"food101: {split_file} is not valid JSON ({exc}); re-download the dataset"
        ) from None
    if not isinstance(meta, dict) or not all(
        isinstance(items, list) and all(isinstance(item, str) for item in items) for items in meta.values()
    ):
        raise EvalDataError(
            f"food101: {split_file} is not a {{class: [image id, ...]}} object; re-download the dataset"
        )
    classes = sorted(meta)
    index = {c: i for i, c in enumerate(classes)}
    images: list[ImageSource] = []
    labels: list[int] = []
    for cls, items in meta.items():
        for item in items:
            images.append(_relative(folder / "images", f"{item}.jpg", "food101", split_file))
            labels.append(index[cls])
    _check_images(images, "food101", split_file)
    return ClassificationData("food101", images, labels, classes)


def read_cifar10(folder: Path, split: str = "test") -> ClassificationData:
    _check_split("cifar10", split, TRAIN_TEST)
    return read_cifar(folder, "cifar10", split)


def read_cifar100(folder: Path, split: str = "test") -> ClassificationData:
    _check_split("cifar100", split, TRAIN_TEST)
    return read_cifar(folder, "cifar100", split)


def sun397_images(folder: Path) -> ClassificationData:
    """Every `sun_*.jpg` under SUN397/, sorted by relative path (torchvision keeps rglob's filesystem
    order, which differs between machines), labelled by its folder's line in ClassName.txt."""
    names_file = folder / "ClassName.txt"
    classes = [line[3:] for line in _lines(names_file, "sun397")]  # "/a/abbey" -> "abbey"
    index = {c: i for i, c in enumerate(classes)}
    images: list[ImageSource] = sorted(
        folder.rglob("sun_*.jpg"), key=lambda p: p.relative_to(folder).as_posix()
    )
    labels: list[int] = []
    for path in images:
        cls = "/".join(path.relative_to(folder).parts[1:-1])
        if cls not in index:
            raise EvalDataError(f"sun397: {path} is in folder {cls!r}, which {names_file} does not list")
        labels.append(index[cls])
    if not images:
        raise EvalDataError(f"sun397: no sun_*.jpg images under {folder}")
    return ClassificationData("sun397", images, labels, classes)


def read_sun397(
    folder: Path, split: str = "test", lengths: Sequence[int] = SUN397_SPLIT, seed: int = SPLIT_SEED
) -> ClassificationData:
    piece = _seeded_piece("sun397", split)
    every = sun397_images(folder)
    chosen = seeded_split(
        len(every.images), lengths, piece, seed, "sun397", f"sun_*.jpg images under {folder}"
    )
    return ClassificationData(
        "sun397", [every.images[i] for i in chosen], [every.labels[i] for i in chosen], every.classnames
    )


def read_stanford_car(folder: Path, split: str = "test") -> ClassificationData:
    _check_split("stanford_car", split, TRAIN_TEST)
    classes = [
        str(c) for c in _mat(folder / "devkit" / "cars_meta.mat", "stanford_car")["class_names"].tolist()
    ]
    # torchvision's files: the training annotations sit in devkit/, the labelled test ones beside it
    if split == "train":
        annotations_file, image_folder = folder / "devkit" / "cars_train_annos.mat", folder / "cars_train"
    else:
        annotations_file, image_folder = folder / "cars_test_annos_withlabels.mat", folder / "cars_test"
    annotations = _mat(annotations_file, "stanford_car")["annotations"]
    images: list[ImageSource] = []
    labels: list[int] = []
    for row in np.asarray(annotations).reshape(-1):
        images.append(_relative(image_folder, str(row["fname"]), "stanford_car", annotations_file))
        labels.append(int(row["class"]) - 1)  # the .mat counts classes from 1
    if labels and not 0 <= min(labels) <= max(labels) < len(classes):
        raise EvalDataError(f"stanford_car: {annotations_file} has class ids outside 1..{len(classes)}")
    _check_images(images, "stanford_car", annotations_file)
    return ClassificationData("stanford_car", images, labels, classes)


def read_aircraft(folder: Path, split: str = "test") -> ClassificationData:
    _check_split("aircraft", split, TRAIN_VAL_TEST)
    data = folder / "data"
    classes = _lines(data / "variants.txt", "aircraft")
    index = {c: i for i, c in enumerate(classes)}
    split_file = data / f"images_variant_{split}.txt"
    images: list[ImageSource] = []
    labels: list[int] = []
    for line in _lines(split_file, "aircraft"):
        image_id, _, variant = line.partition(" ")
        if variant not in index:
            raise EvalDataError(f"aircraft: {split_file} line {line!r}: variant not in variants.txt")
        images.append(_relative(data / "images", f"{image_id}.jpg", "aircraft", split_file))
        labels.append(index[variant])
    _check_images(images, "aircraft", split_file)
    return ClassificationData("aircraft", images, labels, classes)


def read_dtd(folder: Path, split: str = "test") -> ClassificationData:
    _check_split("dtd", split, TRAIN_VAL_TEST)
    split_file = folder / "labels" / f"{split}1.txt"  # partition 1, as the original and torchvision's default
    entries = [line.split("/", 1) for line in _lines(split_file, "dtd")]
    if any(len(e) != 2 for e in entries):
        raise EvalDataError(f"dtd: {split_file}: expected <class>/<file> lines")
    # Every split of a partition holds every class; test1's decide the order (sorted), so that a
    # class index means the same class whichever split a probe was fitted on.
    test_file = folder / "labels" / "test1.txt"
    class_lines = entries if split == "test" else [line.split("/", 1) for line in _lines(test_file, "dtd")]
    classes = sorted({e[0] for e in class_lines})
    unknown = sorted({cls for cls, _ in entries} - set(classes))
    if unknown:
        raise EvalDataError(f"dtd: {split_file} names classes {unknown[:3]} that {test_file} does not")
    index = {c: i for i, c in enumerate(classes)}
    images: list[ImageSource] = [
        _relative(folder / "images", f"{c}/{f}", "dtd", split_file) for c, f in entries
    ]
    _check_images(images, "dtd", split_file)
    return ClassificationData("dtd", images, [index[c] for c, _ in entries], classes)


def read_pets(folder: Path, split: str = "test") -> ClassificationData:
    _check_split("pets", split, TRAIN_TEST)
    # torchvision's "trainval" file is the training split; the dataset has no separate validation split
    split_file = folder / "annotations" / ("trainval.txt" if split == "train" else "test.txt")
    images: list[ImageSource] = []
    labels: list[int] = []
    for line in _lines(split_file, "pets"):
        fields = line.split()
        if len(fields) != 4 or not fields[1].isdigit():
            raise EvalDataError(
                f"pets: {split_file} line {line!r}: expected '<image> <class> <species> <breed>'"
            )
        images.append(_relative(folder / "images", f"{fields[0]}.jpg", "pets", split_file))
        labels.append(int(fields[1]) - 1)
    _check_images(images, "pets", split_file)
    return ClassificationData("pets", images, labels, _numbered(37))


FLOWERS_SETID_KEYS = {"train": "trnid", "val": "valid", "test": "tstid"}


def read_flowers(folder: Path, split: str = "test") -> ClassificationData:
    _check_split("flowers", split, TRAIN_VAL_TEST)
    setid_file = folder / "setid.mat"
    # loadmat's squeeze_me makes a one-element array a scalar: np.asarray(...).reshape(-1) undoes it
    ids = [int(i) for i in np.asarray(_mat(setid_file, "flowers")[FLOWERS_SETID_KEYS[split]]).reshape(-1)]
    per_image = [
        int(x) for x in np.asarray(_mat(folder / "imagelabels.mat", "flowers")["labels"]).reshape(-1)
    ]
    images: list[ImageSource] = []
    labels: list[int] = []
    for image_id in ids:
        if not 1 <= image_id <= len(per_image):
            raise EvalDataError(
                f"flowers: {setid_file} names image {image_id}, imagelabels.mat has {len(per_image)}"
            )
        images.append(folder / "jpg" / f"image_{image_id:05d}.jpg")
        labels.append(per_image[image_id - 1] - 1)  # the .mat counts classes from 1
    _check_images(images, "flowers", setid_file)
    return ClassificationData("flowers", images, labels, _numbered(102))


def read_caltech101(
    folder: Path, split: str = "test", lengths: Sequence[int] = CALTECH101_SPLIT, seed: int = SPLIT_SEED
) -> ClassificationData:
    piece = _seeded_piece("caltech101", split)
    # torchvision's listing: sorted entries minus the background class; each class holds n entries,
    # taken to be image_0001.jpg .. image_{n:04d}.jpg (whatever the entries are called).
    entries = sorted(os.listdir(folder))
    classes = [e for e in entries if e != "BACKGROUND_Google"]
    listing: list[tuple[Path, int]] = []
    for label, cls in enumerate(classes):
        class_dir = folder / cls
        if not class_dir.is_dir():
            raise EvalDataError(
                f"caltech101: {class_dir} is not a class folder; 101_ObjectCategories holds only those"
            )
        count = len(os.listdir(class_dir))
        listing += [(class_dir / f"image_{i:04d}.jpg", label) for i in range(1, count + 1)]
    chosen = seeded_split(len(listing), lengths, piece, seed, "caltech101", f"images in {folder}")
    images: list[ImageSource] = [listing[i][0] for i in chosen]
    for image in images:
        if not image.is_file():
            raise EvalDataError(
                f"caltech101: {image} is missing; each class folder must hold exactly image_0001.jpg.. "
                "image_NNNN.jpg (torchvision counts every file in it)"
            )
    return ClassificationData("caltech101", images, [listing[i][1] for i in chosen], classes)


def read_imagenet(path: Path, split: str = "test") -> ClassificationData:
    """Test (the validation images): val.rec (file, or the folder holding it, as the original's
    dataset root), torchvision's ImageNet root (val/ with synset folders), or the validation folder
    itself. Train: torchvision's root's train/ (synset folders), found beside val/ or val.rec too."""
    _check_split("imagenet", split, TRAIN_TEST)
    names = load_metadata("imagenet")[0]
    if split == "train":
        root = path.parent if path.suffix == ".rec" or path.name == "val" else path
        if not (root / "train").is_dir():
            raise EvalDataError(
                f"imagenet: no train/ folder in {root}; the training split is torchvision's "
                "ROOT/train/<synset>/*.JPEG beside val/ or val.rec"
            )
        return read_imagenet_val(root / "train", names, name="imagenet")
    if path.suffix == ".rec" or (path / "val.rec").is_file():
        return read_imagenet_rec(path, names, name="imagenet")
    folder = path / "val" if (path / "val").is_dir() else path
    return read_imagenet_val(folder, names, name="imagenet")


# ---------------------------------------------------------------------------------------------
# the registry, in the paper's table order


PAPER_DATASETS: dict[str, PaperDataset] = {
    d.name: d
    for d in (
        PaperDataset(
            "cifar10",
            "CIFAR10",
            ("cifar-10-batches-py", ""),
            "test_batch",
            10,
            10000,
            "top1",
            "ROOT/cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}",
            read_cifar10,
            split_sizes=(50000, 10000),
        ),
        PaperDataset(
            "cifar100",
            "CIFAR100",
            ("cifar-100-python", ""),
            "test",
            100,
            10000,
            "top1",
            "ROOT/cifar-100-python/{train,test,meta}",
            read_cifar100,
            split_sizes=(50000, 10000),
        ),
        PaperDataset(
            "food101",
            "Food101",
            ("food-101", ""),
            "meta/test.json",
            101,
            25250,
            "top1",
            "ROOT/food-101/meta/{train,test}.json, ROOT/food-101/images/<class>/<id>.jpg",
            read_food101,
            split_sizes=(75750, 25250),
        ),
        PaperDataset(
            "pets",
            "Pets",
            ("oxford-iiit-pet", ""),
            "annotations/test.txt",
            37,
            3669,
            "mean_per_class",
            "ROOT/oxford-iiit-pet/annotations/{trainval,test}.txt, ROOT/oxford-iiit-pet/images/<id>.jpg",
            read_pets,
            aliases=("oxford_pets", "oxford_iiit_pet"),
            split_sizes=(3680, 3669),
        ),
        PaperDataset(
            "flowers",
            "Flowers",
            ("flowers-102", ""),
            "setid.mat",
            102,
            6149,
            "mean_per_class",
            "ROOT/flowers-102/{setid.mat,imagelabels.mat}, ROOT/flowers-102/jpg/image_NNNNN.jpg",
            read_flowers,
            aliases=("flowers102",),
            splits=TRAIN_VAL_TEST,
            split_sizes=(1020, 1020, 6149),
        ),
        PaperDataset(
            "sun397",
            "SUN397",
            ("SUN397", ""),
            "ClassName.txt",
            397,
            SUN397_SPLIT[1],
            "top1",
            "ROOT/SUN397/ClassName.txt, ROOT/SUN397/<l>/<class>/sun_*.jpg (108,754 images)",
            read_sun397,
            split_sizes=SUN397_SPLIT[:2],
        ),
        PaperDataset(
            "stanford_car",
            "Cars",
            ("stanford_cars", ""),
            "devkit/cars_meta.mat",
            196,
            8041,
            "top1",
            "ROOT/stanford_cars/{devkit/cars_meta.mat,devkit/cars_train_annos.mat,cars_train/,"
            "cars_test_annos_withlabels.mat,cars_test/}",
            read_stanford_car,
            aliases=("cars", "stanford_cars"),
            split_sizes=(8144, 8041),
        ),
        PaperDataset(
            "dtd",
            "DTD",
            ("dtd/dtd", "dtd", ""),
            "labels/test1.txt",
            47,
            1880,
            "top1",
            "ROOT/dtd/dtd/labels/{train,val,test}1.txt, ROOT/dtd/dtd/images/<class>/<file>",
            read_dtd,
            splits=TRAIN_VAL_TEST,
            split_sizes=(1880, 1880, 1880),
        ),
        PaperDataset(
            "caltech101",
            "Caltech101",
            ("caltech101/101_ObjectCategories", "101_ObjectCategories", ""),
            "Faces_easy",
            101,
            CALTECH101_SPLIT[1],
            "mean_per_class",
            "ROOT/caltech101/101_ObjectCategories/<class>/image_NNNN.jpg (8,677 images)",
            read_caltech101,
            split_sizes=CALTECH101_SPLIT,
        ),
        PaperDataset(
            "aircraft",
            "Aircraft",
            ("fgvc-aircraft-2013b", ""),
            "data/variants.txt",
            100,
            3333,
            "mean_per_class",
            "ROOT/fgvc-aircraft-2013b/data/{variants.txt,images_variant_{train,val,test}.txt,images/}",
            read_aircraft,
            aliases=("fgvc_aircraft",),
            splits=TRAIN_VAL_TEST,
            split_sizes=(3334, 3333, 3333),
        ),
        PaperDataset(
            "imagenet",
            "ImageNet",
            ("",),
            "",
            1000,
            50000,
            "top1",
            "ROOT/val.rec + val.idx (the original's), or the val folder (synset folders, or flat + "
            "LOC_val_solution.csv); training split: ROOT/train/<synset>/",
            read_imagenet,
            aliases=("imagenet1k",),
            split_sizes=(1281167, 50000),
        ),
    )
}
_ALIASES = {alias: d.name for d in PAPER_DATASETS.values() for alias in d.aliases}


def find_paper_dataset(name: str) -> PaperDataset | None:
    """The registry entry for `name` (or one of its aliases), None for other datasets."""
    return PAPER_DATASETS.get(_ALIASES.get(name, name))


def read_paper_dataset(
    entry: PaperDataset, path: Path, split: str = "test"
) -> tuple[ClassificationData, list[str]]:
    """One split of the dataset (the test split unless said) with the original's class names, and its
    templates."""
    path = Path(path)
    if not path.exists():
        raise EvalDataError(f"{entry.name}: {path} does not exist")
    _check_split(entry.name, split, entry.splits)
    folder = path if entry.name == "imagenet" else locate(entry, path)
    data = entry.read(folder, split)
    classnames, templates = load_metadata(entry.name)
    if len(data.classnames) != entry.num_classes or len(classnames) != entry.num_classes:
        raise EvalDataError(
            f"{entry.name}: {folder} defines {len(data.classnames)} classes, the dataset has "
            f"{entry.num_classes}"
        )
    known = [label for label in data.labels if label >= 0]
    if known and not 0 <= min(known) <= max(known) < entry.num_classes:
        raise EvalDataError(f"{entry.name}: {folder} has class labels outside 0..{entry.num_classes - 1}")
    data.classnames = list(classnames)
    return data, list(templates)


def describe() -> list[dict]:
    """One row per dataset for `zero_shot.py --list-datasets`."""
    rows = []
    for d in PAPER_DATASETS.values():
        _, templates = load_metadata(d.name)
        rows.append(
            {
                "name": d.name,
                "classes": d.num_classes,
                "templates": len(templates),
                "test_images": d.test_size,
                "metric": d.metric,
                "layout": d.layout,
            }
        )
    return rows
