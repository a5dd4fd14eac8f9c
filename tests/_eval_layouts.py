"""Miniature copies of the paper's evaluation datasets, in the on-disk layouts torchvision reads,
and a micro model cheap enough to embed ImageNet's 1000 class names on a busy CPU.

Every writer takes the torchvision root and returns what a reader must find: the expected image
paths (in the order the dataset lists them) and labels. Images are tiny (8x8); where a layout
needs many files, they are hard links of one file, so a tree of thousands costs nothing.
"""

import io
import json
import os
import pickle
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from scipy.io import savemat

from src.open_alip.model import create_model, get_model_config
from src.recordio import IRHeader, MXIndexedRecordIO, pack

MICRO = {
    "n_layer": 1,
    "image_depth": 1,
    "n_embd": 32,
    "image_embed_dims": 32,
    "dim_att": 32,
    "dim_ffn": 64,
    "head_size": 16,
    "image_num_heads": 2,
}


def micro_model(seed: int = 0):
    """RWKV_CLIP_tiny made smaller still (one layer per tower, width 32), random weights, eval mode;
    the reference WKV is the fastest at these sizes."""
    torch.manual_seed(seed)
    model = create_model(get_model_config("RWKV_CLIP_tiny", **MICRO)).eval()
    model.set_wkv_impl("reference")
    return model


def tiny_jpeg(colour: tuple[int, int, int] = (200, 40, 40), size: tuple[int, int] = (8, 8)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _image(path: Path, colour: tuple[int, int, int] = (200, 40, 40)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tiny_jpeg(colour))
    return path


def write_food101(root: Path) -> tuple[list[Path], list[int]]:
    """101 classes (their names define the label order), images for three of them."""
    base = root / "food-101"
    # JSON order differs from the sorted class order: labels follow sorted names, items JSON order.
    meta = {
        "waffles": ["waffles/11", "waffles/3"],
        "apple_pie": ["apple_pie/7"],
        "ramen": ["ramen/1", "ramen/2"],
    }
    meta.update({f"dish_{i:03d}": [] for i in range(98)})
    (base / "meta").mkdir(parents=True)
    (base / "meta" / "test.json").write_text(json.dumps(meta))
    (base / "meta" / "train.json").write_text(json.dumps({k: [] for k in meta}))
    index = {c: i for i, c in enumerate(sorted(meta))}
    paths, labels = [], []
    for cls, items in meta.items():
        for item in items:
            paths.append(_image(base / "images" / f"{item}.jpg"))
            labels.append(index[cls])
    return paths, labels


def write_cifar(root: Path, variant: str, labels: list[int], names: list[str] | None = None) -> list[int]:
    """The test batch and the class names (`names`, default c0, c1, ...) as CIFAR's pickles hold them."""
    if variant == "cifar10":
        base, test, meta, names_key, labels_key = (
            root / "cifar-10-batches-py",
            "test_batch",
            "batches.meta",
            b"label_names",
            b"labels",
        )
    else:
        base, test, meta, names_key, labels_key = (
            root / "cifar-100-python",
            "test",
            "meta",
            b"fine_label_names",
            b"fine_labels",
        )
    count = 10 if variant == "cifar10" else 100
    names = [n.encode() for n in (names or [f"c{i}" for i in range(count)])]
    base.mkdir(parents=True)
    with open(base / meta, "wb") as f:
        pickle.dump({names_key: names}, f)
    data = np.stack([np.full(3072, 10 * i % 256, np.uint8) for i in range(len(labels))])
    with open(base / test, "wb") as f:
        pickle.dump({b"data": data, labels_key: labels}, f)
    return labels


SUN_CLASSES = ["/a/abbey", "/a/apartment_building/outdoor", "/b/bakery/shop", "/y/youth_hostel"]


def write_sun397(root: Path, per_class: int = 5, all_classes: bool = False) -> tuple[list[Path], list[int]]:
    """A SUN397 tree with a few classes (nested names included); all images, sorted by path.
    `all_classes`: ClassName.txt lists 397 classes, the others without images."""
    base = root / "SUN397"
    base.mkdir(parents=True)
    listed = SUN_CLASSES + (
        [f"/z/zz_scene_{i:03d}" for i in range(397 - len(SUN_CLASSES))] if all_classes else []
    )
    (base / "ClassName.txt").write_text("".join(c + "\n" for c in listed))
    source = _image(root / "one.jpg")
    listing = []
    for label, cls in enumerate(SUN_CLASSES):
        for j in range(per_class):
            path = base / cls.lstrip("/") / f"sun_{label:02d}{j:03d}x.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, path)
            listing.append((path.relative_to(base).as_posix(), path, label))
    (base / "a" / "abbey" / "README.txt").write_text("not an image")
    listing.sort()
    return [p for _, p, _ in listing], [lab for _, _, lab in listing]


def _mat_struct(rows: list[dict]) -> np.ndarray:
    fields = list(rows[0])
    out = np.zeros((1, len(rows)), dtype=[(f, object) for f in fields])
    for i, row in enumerate(rows):
        for f in fields:
            out[0, i][f] = row[f]
    return out


def write_stanford_cars(root: Path) -> tuple[list[Path], list[int]]:
    base = root / "stanford_cars"
    (base / "devkit").mkdir(parents=True)
    names = [f"Car Model {i} 2012" for i in range(196)]
    savemat(base / "devkit" / "cars_meta.mat", {"class_names": np.array([names], dtype=object)})
    rows = [
        {"bbox_x1": 1, "bbox_y1": 1, "bbox_x2": 5, "bbox_y2": 5, "class": c, "fname": f"{n:05d}.jpg"}
        for n, c in [(3, 196), (1, 1), (2, 17)]
    ]
    savemat(base / "cars_test_annos_withlabels.mat", {"annotations": _mat_struct(rows)})
    paths = [_image(base / "cars_test" / r["fname"]) for r in rows]
    return paths, [r["class"] - 1 for r in rows]


def write_aircraft(root: Path) -> tuple[list[Path], list[int]]:
    data = root / "fgvc-aircraft-2013b" / "data"
    data.mkdir(parents=True)
    variants = [f"V-{i}" for i in range(98)] + ["Cessna 172", "DHC-1"]
    (data / "variants.txt").write_text("\n".join(variants) + "\n")
    lines = [("1514522", "Cessna 172"), ("0034309", "V-0"), ("2233445", "DHC-1")]
    (data / "images_variant_test.txt").write_text("".join(f"{i} {v}\n" for i, v in lines))
    paths = [_image(data / "images" / f"{i}.jpg") for i, _ in lines]
    return paths, [variants.index(v) for _, v in lines]


def write_dtd(root: Path) -> tuple[list[Path], list[int]]:
    """test1.txt naming one image of each of 47 classes (DTD's classes are those the file names),
    in an order that is not the sorted one."""
    data = root / "dtd" / "dtd"
    (data / "labels").mkdir(parents=True)
    classes = sorted(["zigzagged", "banded", "lined"] + [f"texture{i:02d}" for i in range(44)])
    lines = ["zigzagged/zigzagged_0001.jpg", "banded/banded_0004.jpg", "lined/lined_0010.jpg"]
    lines += [f"{c}/{c}_0001.jpg" for c in classes if c not in ("zigzagged", "banded", "lined")]
    (data / "labels" / "test1.txt").write_text("\n".join(lines) + "\n")
    (data / "labels" / "train1.txt").write_text("")
    paths = [_image(data / "images" / line) for line in lines]
    return paths, [classes.index(line.split("/")[0]) for line in lines]


# The image-id prefixes of the 37 Oxford-IIIT Pet breeds, in class-id order (cats capitalised).
PET_BREEDS = (
    "Abyssinian american_bulldog american_pit_bull_terrier basset_hound beagle Bengal Birman Bombay boxer "
    "British_Shorthair chihuahua Egyptian_Mau english_cocker_spaniel english_setter german_shorthaired "
    "great_pyrenees havanese japanese_chin keeshond leonberger Maine_Coon miniature_pinscher newfoundland "
    "Persian pomeranian pug Ragdoll Russian_Blue saint_bernard samoyed scottish_terrier shiba_inu Siamese "
    "Sphynx staffordshire_bull_terrier wheaten_terrier yorkshire_terrier"
).split()


def write_pets(root: Path, every_breed: bool = False) -> tuple[list[Path], list[int]]:
    """test.txt with three images, or (`every_breed`) one image of each of the 37 breeds."""
    base = root / "oxford-iiit-pet"
    (base / "annotations").mkdir(parents=True)
    lines = [("Abyssinian_201", 1, 1, 1), ("yorkshire_terrier_9", 37, 2, 25), ("Bengal_3", 6, 1, 2)]
    if every_breed:
        lines = [
            (f"{breed}_{7 + i}", i + 1, 1 if breed[0].isupper() else 2, 1)
            for i, breed in enumerate(PET_BREEDS)
        ]
    (base / "annotations" / "test.txt").write_text("".join(f"{a} {b} {c} {d}\n" for a, b, c, d in lines))
    paths = [_image(base / "images" / f"{a}.jpg") for a, *_ in lines]
    return paths, [b - 1 for _, b, _, _ in lines]


def write_flowers(root: Path) -> tuple[list[Path], list[int]]:
    base = root / "flowers-102"
    base.mkdir(parents=True)
    per_image = [5, 102, 1, 77, 1, 40]  # imagelabels.mat: class (1..102) of image 1..6
    savemat(base / "imagelabels.mat", {"labels": np.array([per_image], dtype=np.uint8)})
    test_ids = [4, 2, 6]
    savemat(
        base / "setid.mat",
        {
            "trnid": np.array([[1]], np.uint16),
            "valid": np.array([[3]], np.uint16),
            "tstid": np.array([test_ids], np.uint16),
        },
    )
    paths = [_image(base / "jpg" / f"image_{i:05d}.jpg") for i in test_ids]
    return paths, [per_image[i - 1] - 1 for i in test_ids]


# The real Caltech101 class folders (sorted as Python sorts them: upper case first).
CALTECH_CLASSES = sorted(
    "Faces Faces_easy Leopards Motorbikes accordion airplanes anchor ant barrel bass beaver binocular bonsai "
    "brain brontosaurus buddha butterfly camera cannon car_side ceiling_fan cellphone chair chandelier "
    "cougar_body cougar_face crab crayfish crocodile crocodile_head cup dalmatian dollar_bill dolphin "
    "dragonfly electric_guitar elephant emu euphonium ewer ferry flamingo flamingo_head garfield gerenuk "
    "gramophone grand_piano hawksbill headphone hedgehog helicopter ibis inline_skate joshua_tree kangaroo "
    "ketch lamp laptop llama lobster lotus mandolin mayfly menorah metronome minaret nautilus octopus okapi "
    "pagoda panda pigeon pizza platypus pyramid revolver rhino rooster saxophone schooner scissors scorpion "
    "sea_horse snoopy soccer_ball stapler starfish stegosaurus stop_sign strawberry sunflower tick trilobite "
    "umbrella watch water_lilly wheelchair wild_cat windsor_chair wrench yin_yang".split()
)


def write_caltech101(root: Path, total: int = 8677) -> list[tuple[Path, int]]:
    """101 class folders holding `total` images (hard links of one tiny JPEG) plus the background
    folder; returns torchvision's listing: (path, label), class-major, image_0001 first."""
    base = root / "caltech101" / "101_ObjectCategories"
    source = _image(root / "one.jpg")
    counts = [
        total // len(CALTECH_CLASSES) + (i < total % len(CALTECH_CLASSES))
        for i in range(len(CALTECH_CLASSES))
    ]
    listing = []
    for label, (cls, count) in enumerate(zip(CALTECH_CLASSES, counts)):
        (base / cls).mkdir(parents=True)
        for i in range(1, count + 1):
            path = base / cls / f"image_{i:04d}.jpg"
            os.link(source, path)
            listing.append((path, label))
    (base / "BACKGROUND_Google").mkdir()
    os.link(source, base / "BACKGROUND_Google" / "image_0001.jpg")
    return listing


def write_imagenet_rec(folder: Path, labels: list[int], label_array: bool = False) -> Path:
    """An im2rec-style val.rec/val.idx: a JPEG per record, the class in the header label (or first in
    a label array, `label_array`)."""
    folder.mkdir(parents=True, exist_ok=True)
    writer = MXIndexedRecordIO(str(folder / "val.idx"), str(folder / "val.rec"), "w")
    for i, label in enumerate(labels):
        header = IRHeader(0, [float(label), 0.0] if label_array else float(label), i, 0)
        colour = ((37 * i) % 256, (91 * i + 40) % 256, (13 * i + 90) % 256)
        writer.write_idx(i, pack(header, tiny_jpeg(colour, (40 + 3 * i, 30 + i))))
    writer.close()
    return folder / "val.rec"


# -- the training and validation splits a linear probe reads -------------------------------------


def _cifar_batch(path: Path, labels: list[int], labels_key: bytes, shade: int) -> None:
    data = np.stack([np.full(3072, (shade + 25 * i) % 256, np.uint8) for i in range(len(labels))])
    with open(path, "wb") as f:
        pickle.dump({b"data": data, labels_key: labels}, f)


def write_probe_splits(root: Path, name: str) -> dict[str, tuple[list, list[int]]]:
    """Add the training split (and the validation split, where the dataset has one) to the layout
    `name`'s writer left under `root`; returns {split: (images in listing order, labels)}: paths,
    or for CIFAR the number of images."""
    if name in ("cifar10", "cifar100"):
        if name == "cifar10":
            base, files, key = (
                root / "cifar-10-batches-py",
                [f"data_batch_{i}" for i in range(1, 6)],
                b"labels",
            )
        else:
            base, files, key = root / "cifar-100-python", ["train"], b"fine_labels"
        labels = []
        for n, file in enumerate(files):
            batch = [(3 * n + j) % 10 for j in range(2)]
            _cifar_batch(base / file, batch, key, 40 * n)
            labels += batch
        return {"train": ([None] * len(labels), labels)}
    if name == "food101":
        base = root / "food-101"
        meta = json.loads((base / "meta" / "test.json").read_text())
        train = {c: [] for c in meta}
        train.update({"ramen": ["ramen/40"], "apple_pie": ["apple_pie/8", "apple_pie/9"]})
        (base / "meta" / "train.json").write_text(json.dumps(train))
        index = {c: i for i, c in enumerate(sorted(meta))}
        items = [(item, index[c]) for c, items in train.items() for item in items]
        return {
            "train": ([_image(base / "images" / f"{i}.jpg") for i, _ in items], [lab for _, lab in items])
        }
    if name == "pets":
        base = root / "oxford-iiit-pet"
        lines = [("Bengal_8", 6, 1, 2), ("Abyssinian_3", 1, 1, 1)]
        (base / "annotations" / "trainval.txt").write_text(
            "".join(f"{a} {b} {c} {d}\n" for a, b, c, d in lines)
        )
        return {
            "train": (
                [_image(base / "images" / f"{a}.jpg") for a, *_ in lines],
                [b - 1 for _, b, _, _ in lines],
            )
        }
    if name == "flowers":
        base = root / "flowers-102"  # write_flowers's setid.mat: trnid [1], valid [3]; labels 5 and 1
        return {
            "train": ([_image(base / "jpg" / "image_00001.jpg")], [4]),
            "val": ([_image(base / "jpg" / "image_00003.jpg")], [0]),
        }
    if name == "stanford_car":
        base = root / "stanford_cars"
        rows = [
            {"bbox_x1": 1, "bbox_y1": 1, "bbox_x2": 5, "bbox_y2": 5, "class": c, "fname": f"{n:05d}.jpg"}
            for n, c in [(8, 2), (9, 196)]
        ]
        savemat(base / "devkit" / "cars_train_annos.mat", {"annotations": _mat_struct(rows)})
        return {
            "train": (
                [_image(base / "cars_train" / r["fname"]) for r in rows],
                [r["class"] - 1 for r in rows],
            )
        }
    if name == "dtd":
        data = root / "dtd" / "dtd"
        classes = sorted(line.split("/")[0] for line in (data / "labels" / "test1.txt").read_text().split())
        out = {}
        for split, lines in (
            ("train", ["lined/lined_0002.jpg", "banded/banded_0001.jpg"]),
            ("val", ["zigzagged/zigzagged_0003.jpg"]),
        ):
            (data / "labels" / f"{split}1.txt").write_text("\n".join(lines) + "\n")
            out[split] = (
                [_image(data / "images" / line) for line in lines],
                [classes.index(line.split("/")[0]) for line in lines],
            )
        return out
    if name == "aircraft":
        data = root / "fgvc-aircraft-2013b" / "data"
        variants = (data / "variants.txt").read_text().splitlines()
        out = {}
        for split, lines in (
            ("train", [("0001111", "DHC-1"), ("0002222", "V-3")]),
            ("val", [("0003333", "V-0")]),
        ):
            (data / f"images_variant_{split}.txt").write_text("".join(f"{i} {v}\n" for i, v in lines))
            out[split] = (
                [_image(data / "images" / f"{i}.jpg") for i, _ in lines],
                [variants.index(v) for _, v in lines],
            )
        return out
    raise ValueError(f"no split writer for {name}")


def write_imagenet_train(root: Path, labelled: dict[int, int]) -> tuple[list[Path], list[int]]:
    """torchvision's ROOT/train/: 1000 synset folders (named n00000000.. in class order), `labelled`
    {class: image count} of them holding images."""
    paths, labels = [], []
    for label in range(1000):
        folder = root / "train" / f"n{label:08d}"
        folder.mkdir(parents=True)
        for i in range(labelled.get(label, 0)):
            paths.append(_image(folder / f"img_{i}.JPEG"))
            labels.append(label)
    return paths, labels


def write_own_splits(
    root: Path,
    colours: list[tuple[int, int, int]],
    counts: dict[str, int],
    noise: float = 10.0,
    seed: int = 0,
    size: int = 16,
) -> Path:
    """A dataset of your own: root/<split>/class<k>/<i>.png, `counts[split]` noisy images of each
    colour (one class per colour)."""
    rng = np.random.default_rng(seed)
    for split, count in counts.items():
        for k, colour in enumerate(colours):
            folder = root / split / f"class{k}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = np.asarray(colour, np.float64)[None, None] + rng.normal(0, noise, (size, size, 3))
                Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(folder / f"{i}.png")
    return root
