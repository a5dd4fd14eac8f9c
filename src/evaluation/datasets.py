"""Readers for the evaluation datasets users keep on disk, and the evaluation preprocessing.

Every reader returns a plain description of the data (image sources plus labels or captions)
so that evaluation code does not care which on-disk layout it came from:

- `read_image_folder`    ImageFolder tree (one sub-folder per class) + optional class-name file
- `read_imagenet_val`    ImageNet validation folder (synset sub-folders, or flat + LOC_val_solution.csv)
- `read_imagenet_rec`    ImageNet validation as the original's `val.rec` + `val.idx` (im2rec records)
- `read_cifar`           CIFAR-10 / CIFAR-100 python pickle batches
- `read_karpathy`        Karpathy-split JSON (dataset_coco.json, dataset_flickr30k.json) + image folder
- `read_caption_json`    ALBEF/BLIP retrieval test JSON (coco_test.json, flickr30k_test.json) + image folder
- `read_coco_captions`   COCO caption JSON, CLIP_benchmark's coco_test_karpathy.json (via `read_split_json`)
- `read_flickr_txt`      CLIP_benchmark's flickr30k_test_karpathy.txt (IMAGE.jpg,caption lines)
- `read_manifest_classification` / `read_manifest_retrieval`
                         CSV/TSV/JSONL manifest (image column + label column, or caption columns)

The paper's other classification datasets, in torchvision's layouts, are read by
src/evaluation/paper_datasets.py on top of these types.

Preprocessing is the model library's evaluation transform (src/open_alip/transform.py) with
PIL, in the loader's CPU workers on every device (src/evaluation/images.py's `skipping_loader`),
so that the device never changes the pixels.
"""

from __future__ import annotations

import csv
import io
import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import numpy as np
import torch
from PIL import Image

from src import recordio
from src.errors import UserError
from src.evaluation.safe_pickle import ForbiddenGlobal, restricted_load
from src.open_alip.transform import preprocess_pil

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff")


@dataclass(frozen=True)
class RecordImage:
    """An image stored as one record of a `.rec` file (im2rec's layout: IRHeader + JPEG bytes);
    its class label is the record's header label, read together with the image."""

    rec: Path
    offset: int


# An image is a file on disk, a record of a .rec file, or an in-memory HWC uint8 array (CIFAR).
ImageSource = Union[Path, RecordImage, np.ndarray]
# A label of -1 for a RecordImage means "the label stored in the record".
LABEL_IN_RECORD = -1


class EvalDataError(UserError):
    """A dataset on disk is missing, malformed or ambiguous; the message says what to fix."""


@dataclass
class ClassificationData:
    name: str
    images: list[ImageSource]
    labels: list[int]
    classnames: list[str]
    # The class names as the dataset's own files spell them, where a reader changes them (CIFAR's
    # underscores); None: `classnames` are those names.
    file_classnames: list[str] | None = None

    def __post_init__(self) -> None:
        if not self.images:
            raise EvalDataError(f"dataset {self.name!r}: no images found")
        if len(self.images) != len(self.labels):
            raise EvalDataError(
                f"dataset {self.name!r}: {len(self.images)} images but {len(self.labels)} labels"
            )


@dataclass
class RetrievalData:
    name: str
    images: list[ImageSource]
    captions: list[str]
    # caption_image[j] is the index in `images` of the image caption j describes
    caption_image: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.images or not self.captions:
            raise EvalDataError(f"dataset {self.name!r}: no images or no captions found")
        if len(self.captions) != len(self.caption_image):
            raise EvalDataError(f"dataset {self.name!r}: captions and caption_image differ in length")


# ---------------------------------------------------------------------------------------------
# path safety


def _inside(root: Path, relative: str, what: str) -> Path:
    """Resolve `relative` under `root`, refusing names that escape it (``..``, absolute paths)."""
    if not relative or "\\" in relative or Path(relative).is_absolute():
        raise EvalDataError(f"{what}: refusing image path {relative!r} (must be relative to {root})")
    root_resolved = root.resolve()
    candidate = (root / relative).resolve()
    if candidate != root_resolved and root_resolved not in candidate.parents:
        raise EvalDataError(f"{what}: refusing image path {relative!r}, it escapes {root}")
    return candidate


def _require_dir(path: Path, what: str) -> Path:
    if not path.is_dir():
        raise EvalDataError(f"{what}: folder {path} does not exist; pass the folder that holds the data")
    return path


def _is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS and path.is_file()


def _pretty(folder_name: str) -> str:
    return folder_name.replace("_", " ").strip()


# ---------------------------------------------------------------------------------------------
# classification readers


def read_classnames_file(path: Path, folders: Sequence[str] | None = None) -> list[str]:
    """Class names from a file: JSON list, JSON {folder: name}, or text.

    Text files hold either one name per line (in class-index order, i.e. sorted folder order for
    an ImageFolder tree) or ``folder<TAB>name`` / ``folder name...`` lines keyed by folder name
    (ImageNet's LOC_synset_mapping.txt has that shape).
    """
    path = Path(path)
    if not path.is_file():
        raise EvalDataError(f"class-name file {path} does not exist")
    if path.suffix.lower() == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "classnames" in data:
            data = data["classnames"]
        if isinstance(data, dict):
            if folders is None:
                raise EvalDataError(f"class-name file {path}: a folder->name mapping needs a folder tree")
            missing = [f for f in folders if f not in data]
            if missing:
                raise EvalDataError(f"class-name file {path}: no name for folders {missing[:5]}")
            return [str(data[f]) for f in folders]
        if isinstance(data, list):
            names = [str(x) for x in data]
        else:
            raise EvalDataError(f"class-name file {path}: expected a JSON list or object")
    else:
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        if folders is not None and lines:
            keyed = {}
            for ln in lines:
                key, _, rest = ln.replace("\t", " ").partition(" ")
                keyed[key] = rest.strip()
            if set(folders) <= set(keyed) and all(keyed[f] for f in folders):
                return [keyed[f] for f in folders]
        names = lines
    if folders is not None and len(names) != len(folders):
        raise EvalDataError(
            f"class-name file {path}: {len(names)} names for {len(folders)} class folders; "
            "give one name per class folder (sorted folder order) or folder<TAB>name lines"
        )
    return names


def read_image_folder(
    root: Path | str,
    classnames: Sequence[str] | Path | str | None = None,
    name: str | None = None,
    empty_classes: bool = False,
) -> ClassificationData:
    """An ImageFolder tree: ``root/<class>/<image>``; class index = sorted folder order
    (numeric order when every folder name is a number). A class folder without images is
    refused unless `empty_classes` (a fixed class list such as ImageNet's, evaluated on a part)."""
    root = _require_dir(Path(root), "image folder")
    folders = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if folders and all(f.isdigit() for f in folders):
        folders.sort(key=int)  # class folders named 1..N: "10" comes after "9", not after "1"
    if not folders:
        raise EvalDataError(f"image folder {root}: no class sub-folders; expected root/<class>/<image> files")
    if classnames is None:
        names = [_pretty(f) for f in folders]
    elif isinstance(classnames, (str, Path)):
        names = read_classnames_file(Path(classnames), folders)
    else:
        names = list(classnames)
        if len(names) != len(folders):
            raise EvalDataError(
                f"image folder {root}: {len(names)} class names for {len(folders)} class folders"
            )
    images: list[ImageSource] = []
    labels: list[int] = []
    for index, folder in enumerate(folders):
        before = len(images)
        for path in sorted((root / folder).rglob("*")):
            if _is_image(path):
                images.append(path)
                labels.append(index)
        if len(images) == before and not empty_classes:
            # kept, it would still be a class every image is scored against, and count in the
            # chance level and mean per-class recall with nothing to recall
            raise EvalDataError(
                f"image folder {root}: class folder {folder!r} holds no images; "
                "add its images or remove the folder"
            )
    return ClassificationData(name or root.name, images, labels, names)


def read_imagenet_val(
    root: Path | str, classnames: Sequence[str], name: str = "imagenet1k", solution_csv: Path | None = None
) -> ClassificationData:
    """ImageNet-1k validation images.

    Two layouts are common: 1000 synset sub-folders (``n01440764/...``; sorted synset order is the
    standard class index), or a flat folder of ``ILSVRC2012_val_*.JPEG`` with Kaggle's
    ``LOC_val_solution.csv`` (``ImageId,PredictionString`` whose first word is the synset) next to
    it or in its parent.
    """
    root = _require_dir(Path(root), "imagenet val")
    synset_dirs = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name.startswith("n"))
    if synset_dirs:
        if len(synset_dirs) != len(classnames):
            raise EvalDataError(
                f"imagenet val {root}: {len(synset_dirs)} synset folders, expected {len(classnames)}"
            )
        return read_image_folder(root, list(classnames), name=name, empty_classes=True)
    candidates = (
        [solution_csv]
        if solution_csv
        else [root / "LOC_val_solution.csv", root.parent / "LOC_val_solution.csv"]
    )
    csv_path = next((p for p in candidates if p is not None and p.is_file()), None)
    if csv_path is None:
        raise EvalDataError(
            f"imagenet val {root}: neither synset sub-folders nor LOC_val_solution.csv found; "
            "sort the images into synset folders or put LOC_val_solution.csv beside them"
        )
    with open(csv_path, newline="", encoding="utf-8") as f:
        rows = [(r["ImageId"], r["PredictionString"].split()[0]) for r in csv.DictReader(f)]
    synsets = sorted({s for _, s in rows})
    if len(synsets) != len(classnames):
        raise EvalDataError(f"{csv_path}: {len(synsets)} synsets, expected {len(classnames)}")
    index = {s: i for i, s in enumerate(synsets)}
    images: list[ImageSource] = []
    labels: list[int] = []
    for image_id, synset in sorted(rows):
        matches = [root / f"{image_id}{ext}" for ext in (".JPEG", ".jpeg", ".jpg", ".png")]
        path = next((p for p in matches if p.is_file()), None)
        if path is None:
            raise EvalDataError(f"imagenet val {root}: image {image_id} listed in {csv_path.name} is missing")
        images.append(path)
        labels.append(index[synset])
    return ClassificationData(name, images, labels, list(classnames))


def read_imagenet_rec(
    path: Path | str, classnames: Sequence[str], name: str = "imagenet"
) -> ClassificationData:
    """ImageNet validation as the original evaluates it: `val.rec` + `val.idx` (im2rec records, class
    index in the header label, sorted-synset order). `path` is the .rec file or the folder holding
    val.rec. The labels are read with the images (`LABEL_IN_RECORD`), so listing costs no extra pass."""
    path = Path(path)
    rec = path / "val.rec" if path.is_dir() else path
    idx = rec.with_suffix(".idx")
    for needed in (rec, idx):
        if not needed.is_file():
            raise EvalDataError(
                f"imagenet: {needed} is missing; the original reads val.rec with its val.idx beside it"
            )
    offsets = [offset for _, offset in recordio.read_index(idx)]
    if not offsets:
        raise EvalDataError(f"imagenet: {idx} lists no records")
    images: list[ImageSource] = [RecordImage(rec, offset) for offset in offsets]
    return ClassificationData(name, images, [LABEL_IN_RECORD] * len(images), list(classnames))


def _unpickle(path: Path, keys: Sequence[bytes]) -> dict:
    """One CIFAR pickle: a dict holding `keys`, read without running anything the file names."""
    if not path.is_file():
        raise EvalDataError(f"CIFAR file {path} does not exist; pass the extracted cifar-*-python folder")
    try:
        with open(path, "rb") as f:
            data = restricted_load(f, encoding="bytes")
    except ForbiddenGlobal as exc:
        raise EvalDataError(
            f"CIFAR file {path}: refusing to load it: {exc}; re-download the dataset"
        ) from None
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        AttributeError,
        IndexError,
        KeyError,
        MemoryError,
    ) as exc:
        raise EvalDataError(
            f"CIFAR file {path} is truncated or not a CIFAR pickle ({type(exc).__name__}: {exc}); "
            "re-download it"
        ) from None
    missing = [k.decode() for k in keys if not isinstance(data, dict) or k not in data]
    if missing:
        raise EvalDataError(
            f"CIFAR file {path} is not a CIFAR pickle (no {', '.join(missing)}); re-download it"
        )
    return data


def read_cifar(root: Path | str, variant: str = "cifar10", split: str = "test") -> ClassificationData:
    """CIFAR-10 (``cifar-10-batches-py``) or CIFAR-100 (``cifar-100-python``) pickles."""
    root = _require_dir(Path(root), variant)
    if variant == "cifar10":
        files = ["test_batch"] if split == "test" else [f"data_batch_{i}" for i in range(1, 6)]
        meta_file, names_key, labels_key = "batches.meta", b"label_names", b"labels"
    elif variant == "cifar100":
        files = ["test" if split == "test" else "train"]
        meta_file, names_key, labels_key = "meta", b"fine_label_names", b"fine_labels"
    else:
        raise EvalDataError(f"unknown CIFAR variant {variant!r}; use cifar10 or cifar100")
    meta = _unpickle(root / meta_file, [names_key])
    try:
        raw_names = [n.decode() if isinstance(n, bytes) else str(n) for n in meta[names_key]]
    except (TypeError, UnicodeDecodeError) as exc:
        raise EvalDataError(
            f"CIFAR file {root / meta_file}: unreadable class names ({exc}); re-download it"
        ) from None
    images: list[ImageSource] = []
    labels: list[int] = []
    for file in files:
        batch = _unpickle(root / file, [b"data", labels_key])
        try:
            data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            batch_labels = [int(x) for x in batch[labels_key]]
        except (TypeError, ValueError) as exc:
            raise EvalDataError(
                f"CIFAR file {root / file}: malformed data or labels ({exc}); re-download it"
            ) from None
        if len(batch_labels) != len(data):
            raise EvalDataError(
                f"CIFAR file {root / file}: {len(data)} images but {len(batch_labels)} labels; re-download it"
            )
        images.extend(np.ascontiguousarray(img) for img in data)
        labels.extend(batch_labels)
    return ClassificationData(
        variant, images, labels, [_pretty(n) for n in raw_names], file_classnames=raw_names
    )


# ---------------------------------------------------------------------------------------------
# retrieval readers


def find_karpathy_json(folder: Path) -> Path:
    found = sorted(folder.glob("dataset_*.json"))
    if len(found) != 1:
        raise EvalDataError(
            f"{folder}: expected exactly one Karpathy split file dataset_*.json, found {len(found)}; "
            "pass the JSON file itself"
        )
    return found[0]


# CLIP_benchmark's own retrieval annotations (what `clip_benchmark eval --dataset mscoco_captions /
# flickr30k` read from its --dataset_root), by the file name it gives them.
CLIP_BENCHMARK_ANNOTATIONS = ("coco_test_karpathy.json", "flickr30k_test_karpathy.txt")


def _find_image(root: Path, relative: str, where: str, subfolders: Sequence[str]) -> Path:
    """`relative` under `root`, else under one of `subfolders` of it."""
    path = _inside(root, relative, where)
    if path.is_file():
        return path
    for sub in subfolders:
        alt = _inside(root, f"{sub}/{relative}", where)
        if alt.is_file():
            return alt
    raise EvalDataError(f"{where}: image {relative} not found under {root}; pass --image-root")


def _grouped(
    name: str, pairs: Sequence[tuple[Path, list[str]]], captions_per_image: int | None
) -> RetrievalData:
    images, captions, caption_image = [], [], []
    for path, texts in pairs:
        texts = texts[:captions_per_image] if captions_per_image else texts
        images.append(path)
        captions.extend(texts)
        caption_image.extend([len(images) - 1] * len(texts))
    return RetrievalData(name, images, captions, caption_image)


def read_coco_captions(
    data: dict,
    json_path: Path,
    image_root: Path | str | None = None,
    captions_per_image: int | None = None,
    name: str | None = None,
) -> RetrievalData:
    """COCO's caption layout, CLIP_benchmark's coco_test_karpathy.json: ``{"images": [{"id",
    "file_name"}], "annotations": [{"image_id", "caption"}]}``, read as CLIP_benchmark reads it
    (torchvision's CocoCaptions): the images in order of their id, each with every caption the
    file gives it, in the file's order. Images are looked up under `image_root` (default: the
    JSON's folder), then under its val2014/ (CLIP_benchmark's root/val2014)."""
    root = Path(image_root) if image_root is not None else json_path.parent
    try:
        files = {int(entry["id"]): str(entry["file_name"]) for entry in data["images"]}
        texts: dict[int, list[str]] = {i: [] for i in files}
        for ann in data["annotations"]:
            texts[int(ann["image_id"])].append(str(ann["caption"]).strip())
    except (KeyError, TypeError, ValueError) as exc:
        raise EvalDataError(f"{json_path}: not a COCO caption file ({exc!r})") from None
    pairs = [(_find_image(root, files[i], str(json_path), ("val2014",)), texts[i]) for i in sorted(files)]
    empty = [files[i] for i in sorted(files) if not texts[i]]
    if empty:
        raise EvalDataError(f"{json_path}: image {empty[0]} has no caption; every image needs one")
    return _grouped(name or json_path.stem, pairs, captions_per_image)


def read_flickr_txt(
    txt_path: Path | str,
    image_root: Path | str | None = None,
    captions_per_image: int | None = None,
    name: str | None = None,
) -> RetrievalData:
    """CLIP_benchmark's flickr30k_test_karpathy.txt, read as its Flickr dataset reads it: a header
    line, then ``IMAGE.jpg,caption`` lines (a caption may hold commas); the images in the order they
    first appear, each with every caption, in file order. Images are looked up under `image_root`
    (default: the file's folder, CLIP_benchmark's --dataset_root), then under its
    flickr30k-images/."""
    txt_path = Path(txt_path)
    root = Path(image_root) if image_root is not None else txt_path.parent
    grouped: dict[str, list[str]] = {}
    try:
        lines = txt_path.read_text(encoding="utf-8").splitlines()[1:]
    except (OSError, UnicodeDecodeError) as exc:
        raise EvalDataError(f"{txt_path}: cannot read it as UTF-8 text ({exc})") from None
    for number, line in enumerate(lines, start=2):
        line = line.strip()
        if not line:
            continue
        image, sep, caption = line.partition(".jpg,")
        if not sep:
            raise EvalDataError(
                f"{txt_path}, line {number}: expected IMAGE.jpg,caption; fix or remove that line"
            )
        grouped.setdefault(image + ".jpg", []).append(caption)
    pairs = [
        (_find_image(root, image, str(txt_path), ("flickr30k-images",)), texts)
        for image, texts in grouped.items()
    ]
    return _grouped(name or txt_path.stem, pairs, captions_per_image)


def _load_split_json(json_path: Path | str) -> tuple[Path, object]:
    """(the JSON file, for a folder the one dataset_*.json in it; its parsed content)."""
    json_path = Path(json_path)
    if json_path.is_dir():
        json_path = find_karpathy_json(json_path)
    if not json_path.is_file():
        raise EvalDataError(f"Karpathy split file {json_path} does not exist")
    try:
        return json_path, json.loads(json_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise EvalDataError(f"{json_path}: not a Karpathy split file ({exc})") from None


def read_split_json(
    json_path: Path | str,
    image_root: Path | str | None = None,
    captions_per_image: int | None = None,
    name: str | None = None,
) -> RetrievalData:
    """A Karpathy split JSON (or a folder holding one), or one in COCO's caption layout
    (CLIP_benchmark's coco_test_karpathy.json), each by its format's convention when
    `captions_per_image` is None: a Karpathy file's first five captions, all of a COCO-layout file's."""
    json_path, data = _load_split_json(json_path)
    if isinstance(data, dict) and "annotations" in data:
        return read_coco_captions(data, json_path, image_root, captions_per_image, name)
    return _karpathy_split(data, json_path, image_root, "test", captions_per_image or 5, name)


def read_karpathy(
    json_path: Path | str,
    image_root: Path | str | None = None,
    split: str = "test",
    captions_per_image: int | None = 5,
    name: str | None = None,
) -> RetrievalData:
    """Karpathy-split JSON: ``{"images": [{"filename", "filepath"?, "split", "sentences": [{"raw"}]}]}``.

    COCO entries carry ``filepath`` (``val2014``); Flickr30k ones do not, and the images usually
    sit in ``flickr30k-images/``: both are looked up under `image_root` (default: the JSON's folder).
    The standard test protocol keeps the first five captions of each image (None: all).
    """
    json_path, data = _load_split_json(json_path)
    return _karpathy_split(data, json_path, image_root, split, captions_per_image, name)


def _karpathy_split(
    data: object,
    json_path: Path,
    image_root: Path | str | None,
    split: str,
    captions_per_image: int | None,
    name: str | None,
) -> RetrievalData:
    root = Path(image_root) if image_root is not None else json_path.parent
    try:
        entries = data["images"]
    except (KeyError, TypeError) as exc:
        raise EvalDataError(f"{json_path}: not a Karpathy split file ({exc})") from None
    images: list[ImageSource] = []
    captions: list[str] = []
    caption_image: list[int] = []
    for entry in entries:
        if entry.get("split") != split:
            continue
        relative = "/".join(p for p in (entry.get("filepath"), entry["filename"]) if p)
        path = _inside(root, relative, str(json_path))
        if not path.is_file():
            for sub in ("flickr30k-images", "images"):
                alt = _inside(root, f"{sub}/{relative}", str(json_path))
                if alt.is_file():
                    path = alt
                    break
            else:
                raise EvalDataError(
                    f"{json_path}: image {relative} not found under {root}; pass --image-root"
                )
        sentences = [s["raw"] for s in entry["sentences"]]
        if not all(isinstance(text, str) for text in sentences):
            raise EvalDataError(
                f'{json_path}: image {relative}: a sentence\'s "raw" is not text; fix that entry'
            )
        sentences = [text.strip() for text in sentences]
        if captions_per_image:
            sentences = sentences[:captions_per_image]
        index = len(images)
        images.append(path)
        captions.extend(sentences)
        caption_image.extend([index] * len(sentences))
    if not images:
        raise EvalDataError(f"{json_path}: no images in split {split!r}")
    return RetrievalData(name or json_path.stem.removeprefix("dataset_"), images, captions, caption_image)


def read_caption_json(
    json_path: Path | str,
    image_root: Path | str | None = None,
    captions_per_image: int | None = None,
    name: str | None = None,
) -> RetrievalData:
    """ALBEF/BLIP retrieval JSON: ``[{"image": "val2014/x.jpg", "caption": ["...", ...]}, ...]``.

    Each image is looked up as `image_root`/<image> (default root: the JSON's folder), then as
    `image_root`/<image without its first folder>, the original's rule for a root that holds the
    images themselves (``.../val2014/``). Every caption is kept unless `captions_per_image` is set
    (the original keeps all: 25,010 for COCO's 5,000 images).
    """
    json_path = Path(json_path)
    if not json_path.is_file():
        raise EvalDataError(f"retrieval file {json_path} does not exist")
    root = Path(image_root) if image_root is not None else json_path.parent
    try:
        entries = json.loads(json_path.read_text(encoding="utf-8"))
        pairs = [(e["image"], e["caption"]) for e in entries]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise EvalDataError(f"{json_path}: not an ALBEF/BLIP retrieval file ({exc!r})") from None
    images: list[ImageSource] = []
    captions: list[str] = []
    caption_image: list[int] = []
    for relative, texts in pairs:
        path = _inside(root, str(relative), str(json_path))
        if not path.is_file():
            _, sep, rest = str(relative).partition("/")
            alt = _inside(root, rest, str(json_path)) if sep and rest else None
            if alt is None or not alt.is_file():
                raise EvalDataError(
                    f"{json_path}: image {relative} not found under {root} (nor without its first folder); "
                    "pass --image-root"
                )
            path = alt
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise EvalDataError(
                f"{json_path}: image {relative}: caption {texts!r} is not text or a list of "
                "texts; fix or remove that entry"
            )
        if captions_per_image:
            texts = texts[:captions_per_image]
        if not texts:
            raise EvalDataError(f"{json_path}: image {relative} has no captions; every image needs one")
        images.append(path)
        captions.extend(t.strip() for t in texts)
        caption_image.extend([len(images) - 1] * len(texts))
    return RetrievalData(name or json_path.stem, images, captions, caption_image)


# ---------------------------------------------------------------------------------------------
# manifests

# The image column of a manifest when none is named, first match wins (embed.py's lists too).
# file_name: the metadata.csv of a Hugging Face image folder dataset.
IMAGE_COLUMNS = ("image", "filepath", "image_path", "path", "file", "filename", "file_name", "url")
_LABEL_COLUMNS = ("label", "class", "target", "classname")
_CAPTION_PREFIXES = ("caption", "text", "title", "sentence")


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        raise EvalDataError(f"manifest {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    raise EvalDataError(f"manifest {path}: line {n} is not JSON") from None
        return rows
    if suffix in (".csv", ".tsv"):
        with open(path, newline="", encoding="utf-8") as f:
            return list(csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ","))
    raise EvalDataError(f"manifest {path}: unknown type {suffix!r}; use .csv, .tsv or .jsonl")


def _pick(columns: Sequence[str], wanted: str | None, defaults: Sequence[str], path: Path, what: str) -> str:
    if wanted:
        if wanted not in columns:
            raise EvalDataError(f"manifest {path}: no column {wanted!r} (columns: {', '.join(columns)})")
        return wanted
    for c in defaults:
        if c in columns:
            return c
    raise EvalDataError(f"manifest {path}: no {what} column among {', '.join(columns)}; name it explicitly")


def _manifest_image(root: Path, value: str, path: Path) -> Path:
    # Absolute paths are the user's explicit choice; relative ones must stay under the manifest's folder.
    image = Path(value) if Path(value).is_absolute() else _inside(root, value, f"manifest {path}")
    if not image.is_file():
        raise EvalDataError(f"manifest {path}: image {value} not found")
    return image


def _manifest_table(path: Path, image_column: str | None) -> tuple[list[dict], list[str], str]:
    """(rows, columns, image column) of a manifest; both manifest kinds need a row and an image column."""
    rows = _read_rows(path)
    if not rows:
        raise EvalDataError(f"manifest {path}: no rows")
    columns = list(rows[0].keys())
    return rows, columns, _pick(columns, image_column, IMAGE_COLUMNS, path, "image")


def read_manifest_classification(
    path: Path | str,
    classnames: Sequence[str] | None = None,
    image_column: str | None = None,
    label_column: str | None = None,
    name: str | None = None,
) -> ClassificationData:
    """Manifest rows ``image,label``: the label is a class index or a class name."""
    path = Path(path)
    rows, columns, image_col = _manifest_table(path, image_column)
    label_col = _pick(columns, label_column, _LABEL_COLUMNS, path, "label")
    raw = [str(r[label_col]).strip() for r in rows]
    names = list(classnames) if classnames is not None else None
    if all(v.lstrip("-").isdigit() for v in raw):
        labels = [int(v) for v in raw]
        if names is None:
            names = [str(i) for i in range(max(labels) + 1)]
    else:
        if names is None:
            names = sorted(set(raw))
        lookup = {n: i for i, n in enumerate(names)}
        unknown = sorted(set(raw) - set(lookup))
        if unknown:
            raise EvalDataError(f"manifest {path}: labels {unknown[:5]} are not among the class names")
        labels = [lookup[v] for v in raw]
    if min(labels) < 0 or max(labels) >= len(names):
        raise EvalDataError(f"manifest {path}: label index outside 0..{len(names) - 1}")
    images: list[ImageSource] = [_manifest_image(path.parent, str(r[image_col]), path) for r in rows]
    return ClassificationData(name or path.stem, images, labels, names)


def read_manifest_retrieval(
    path: Path | str,
    image_column: str | None = None,
    caption_columns: Sequence[str] | None = None,
    name: str | None = None,
) -> RetrievalData:
    """Manifest rows with an image and one or more captions (caption columns, or a list in JSONL)."""
    path = Path(path)
    rows, columns, image_col = _manifest_table(path, image_column)
    if caption_columns:
        caption_cols = [_pick(columns, c, (), path, "caption") for c in caption_columns]
    else:
        caption_cols = [c for c in columns if c.lower().startswith(_CAPTION_PREFIXES)]
        if not caption_cols:
            raise EvalDataError(f"manifest {path}: no caption column (caption*, text*); name them explicitly")
    images: list[ImageSource] = []
    captions: list[str] = []
    caption_image: list[int] = []
    for row in rows:
        index = len(images)
        images.append(_manifest_image(path.parent, str(row[image_col]), path))
        for col in caption_cols:
            value = row.get(col)
            for text in value if isinstance(value, list) else [value]:
                if text is not None and str(text).strip():
                    captions.append(str(text).strip())
                    caption_image.append(index)
    return RetrievalData(name or path.stem, images, captions, caption_image)


# ---------------------------------------------------------------------------------------------
# preprocessing


def read_encoded(source: Path | RecordImage) -> tuple[bytes, int | None]:
    """The encoded image bytes of a file or record, and the record's header label (None for a file)."""
    if isinstance(source, RecordImage):
        with open(source.rec, "rb") as f:
            header, payload = recordio.unpack(recordio.read_record_at(f, source.offset, str(source.rec)))
        label = header.label
        # im2rec stores the class as a float; a label array (flag > 0) holds it first, as DALI reads it.
        return payload, int(label if np.ndim(label) == 0 else label[0])
    try:
        return Path(source).read_bytes(), None
    except OSError as exc:
        raise EvalDataError(f"cannot read image {source}: {exc.strerror}") from None


def load_image(source: ImageSource) -> tuple[Image.Image, int | None]:
    """An RGB PIL image, and the label stored with it (records only)."""
    if isinstance(source, np.ndarray):
        return Image.fromarray(source, "RGB"), None
    label = None
    try:
        if isinstance(source, RecordImage):
            payload, label = read_encoded(source)
            opened = Image.open(io.BytesIO(payload))
        else:
            opened = Image.open(source)
        with opened as img:
            return img.convert("RGB"), label
    except OSError as exc:
        raise EvalDataError(f"cannot read image {source}: {exc}") from None


def load_rgb(source: ImageSource) -> Image.Image:
    return load_image(source)[0]


class ImageDataset(torch.utils.data.Dataset):
    """Images (+ optional integer labels), each preprocessed with PIL to `size` (the evaluation
    transform of src/open_alip/transform.py) wherever the model runs."""

    def __init__(self, images: Sequence[ImageSource], labels: Sequence[int] | None = None, *, size: int):
        self.images = list(images)
        self.labels = list(labels) if labels is not None else [-1] * len(self.images)
        self.size = size

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img, stored_label = load_image(self.images[index])
        label = self.labels[index] if stored_label is None else stored_label
        return preprocess_pil(img, self.size), label


def preprocess_batch(batch: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """One loader batch (already preprocessed on CPU, see evaluation.images) on `device`."""
    return batch.to(device, non_blocking=True)
