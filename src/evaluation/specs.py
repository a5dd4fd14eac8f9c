"""Which dataset a command line names and which reader reads it.

A `DatasetSpec` is a name, a path and optional overrides. Its kind is inferred when not given:
the paper's datasets by name (the `PAPER_DATASETS` registry in src/evaluation/paper_datasets.py),
manifests by suffix, retrieval JSON by content, else an ImageFolder tree. Each kind has one entry
in `CLASSIFICATION_READERS` or `RETRIEVAL_READERS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from src.evaluation.clip_benchmark_protocol import read_clip_benchmark_dataset
from src.evaluation.datasets import (
    CLIP_BENCHMARK_ANNOTATIONS,
    ClassificationData,
    EvalDataError,
    RetrievalData,
    read_caption_json,
    read_cifar,
    read_classnames_file,
    read_flickr_txt,
    read_image_folder,
    read_imagenet_val,
    read_manifest_classification,
    read_manifest_retrieval,
    read_split_json,
)
from src.evaluation.paper_datasets import PaperDataset, find_paper_dataset, read_paper_dataset
from src.evaluation.protocol import STANDARD, Protocol, get_protocol
from src.evaluation.templates import read_templates
from src.open_alip.zero_shot import ALIASES, DEFAULT_TEMPLATES, load_metadata

MANIFEST_SUFFIXES = (".csv", ".tsv", ".jsonl")


@dataclass
class DatasetSpec:
    """Where a dataset lives and how to read it (`kind` None: inferred, see the module doc)."""

    name: str
    path: Path
    kind: str | None = None
    classnames: Path | None = None
    templates: Path | None = None
    image_root: Path | None = None

    @classmethod
    def parse(cls, text: str, **extra) -> DatasetSpec:
        """``NAME=PATH`` or ``PATH`` (the name is then the folder/file stem)."""
        name, sep, path = text.partition("=")
        if not sep:
            path = name
            name = Path(path.rstrip("/")).stem
        if not name or not path:
            raise EvalDataError(f"dataset {text!r}: expected NAME=PATH or PATH")
        return cls(name=name, path=Path(path).expanduser(), **extra)


def as_spec(spec: DatasetSpec | str | Path) -> DatasetSpec:
    if isinstance(spec, DatasetSpec):
        return spec
    return DatasetSpec.parse(str(spec))


def paper_dataset_of(spec: DatasetSpec) -> PaperDataset | None:
    """The paper dataset a spec reads in its torchvision layout, or None (a generic form)."""
    entry = find_paper_dataset(spec.name)
    if entry is None or spec.kind is not None or spec.path.suffix.lower() in MANIFEST_SUFFIXES:
        return None
    if (
        entry.name in ("cifar10", "cifar100")
        and _has_class_folders(spec.path)
        and not ((spec.path / entry.folders[0]).is_dir())
    ):
        return None  # CIFAR exported as an ImageFolder tree
    return entry


def _has_class_folders(path: Path) -> bool:
    return path.is_dir() and any(p.is_dir() for p in path.iterdir())


# ---------------------------------------------------------------------------------------------
# classification


def _read_imagenet(spec: DatasetSpec, names: list[str] | None) -> ClassificationData:
    return read_imagenet_val(
        spec.path, names if names is not None else load_metadata("imagenet1k")[0], name=spec.name
    )


def _read_image_folder(spec: DatasetSpec, names: list[str] | None) -> ClassificationData:
    # An ImageFolder tree names its classes itself (or through --classnames). The bundled list is
    # only trusted for folders named by class index, where its order is the index order.
    data = read_image_folder(spec.path, spec.classnames, name=spec.name)
    bundled = names
    if (
        spec.classnames is None
        and bundled
        and len(bundled) == len(data.classnames)
        and all(n.isdigit() for n in data.classnames)
    ):
        first = int(data.classnames[0])
        if [int(n) - first for n in data.classnames] == list(range(len(bundled))):
            data.classnames = list(bundled)
    return data


# kind -> reader(spec, class names from --classnames or the bundled list, or None)
CLASSIFICATION_READERS: dict[str, Callable[[DatasetSpec, list[str] | None], ClassificationData]] = {
    "cifar10": lambda spec, names: read_cifar(spec.path, "cifar10"),
    "cifar100": lambda spec, names: read_cifar(spec.path, "cifar100"),
    "imagenet": _read_imagenet,
    "manifest": lambda spec, names: read_manifest_classification(spec.path, names, name=spec.name),
    "imagefolder": _read_image_folder,
}


def _infer_classification_kind(spec: DatasetSpec) -> str:
    if spec.path.suffix.lower() in MANIFEST_SUFFIXES:
        return "manifest"
    if ALIASES.get(spec.name, spec.name) == "imagenet1k":
        return "imagenet"
    return "imagefolder"


def _read_paper_dataset(
    spec: DatasetSpec, entry: PaperDataset, protocol: Protocol
) -> tuple[ClassificationData, list[str]]:
    if protocol.dataset_definitions == "clip_benchmark":
        data, templates = read_clip_benchmark_dataset(entry, spec.path)
    else:
        data, templates = read_paper_dataset(entry, spec.path)
    if spec.classnames is not None:
        names = read_classnames_file(spec.classnames)
        if len(names) != len(data.classnames):
            raise EvalDataError(
                f"{spec.classnames}: {len(names)} class names, {entry.name} has {len(data.classnames)}"
            )
        data.classnames = names
    data.name = spec.name
    return data, read_templates(spec.templates) if spec.templates else templates


def load_classification_data(
    spec: DatasetSpec | str | Path, protocol: Protocol | str = STANDARD
) -> tuple[ClassificationData, list[str]]:
    """Read a classification dataset (a paper dataset as `protocol` defines it) and pick its
    templates; returns (data, templates)."""
    spec = as_spec(spec)
    entry = paper_dataset_of(spec)
    if entry is not None:
        return _read_paper_dataset(spec, entry, get_protocol(protocol))
    bundled_names, bundled_templates = load_metadata(spec.name)
    kind = spec.kind or _infer_classification_kind(spec)
    if kind not in CLASSIFICATION_READERS:
        raise EvalDataError(f"dataset {spec.name}: unknown kind {kind!r}")
    if kind == "imagefolder":
        names = bundled_names
    else:
        names = read_classnames_file(spec.classnames) if spec.classnames is not None else bundled_names
    data = CLASSIFICATION_READERS[kind](spec, names)
    if names is not None and kind != "imagefolder":
        if len(names) != len(data.classnames):
            raise EvalDataError(
                f"dataset {spec.name}: {len(names)} class names but the data has {len(data.classnames)} "
                "classes"
            )
        data.classnames = list(names)
    data.name = spec.name
    templates = (
        read_templates(spec.templates) if spec.templates else list(bundled_templates or DEFAULT_TEMPLATES)
    )
    return data, templates


def templates_source(spec: DatasetSpec | str | Path) -> str:
    """Where `load_classification_data` takes `spec`'s templates from, in words for the results."""
    spec = as_spec(spec)
    if spec.templates:
        return f"the file {spec.templates} (--templates)"
    entry = paper_dataset_of(spec)
    if entry is not None:
        return f"{entry.name}'s own templates, as the protocol defines the dataset"
    if load_metadata(spec.name)[1]:
        return f"the bundled templates of {ALIASES.get(spec.name, spec.name)}"
    return "the default for a dataset without templates of its own (--templates NAME=FILE gives others)"


# ---------------------------------------------------------------------------------------------
# retrieval

# kind -> reader(spec, captions kept per image or None)
RETRIEVAL_READERS: dict[str, Callable[[DatasetSpec, int | None], RetrievalData]] = {
    "manifest": lambda spec, per_image: read_manifest_retrieval(spec.path, name=spec.name),
    "caption_json": lambda spec, per_image: read_caption_json(
        spec.path, spec.image_root, per_image, name=spec.name
    ),
    "karpathy": lambda spec, per_image: read_split_json(
        spec.path, spec.image_root, per_image, name=spec.name
    ),
    "flickr_txt": lambda spec, per_image: read_flickr_txt(
        spec.path, spec.image_root, per_image, name=spec.name
    ),
}


def _clip_benchmark_annotation(folder: Path, protocol: str | None) -> Path | None:
    """CLIP_benchmark's own annotation file in a --dataset_root `folder`, if it is the one to read:
    under --protocol clip_benchmark, or where the folder has no Karpathy dataset_*.json."""
    found = [folder / n for n in CLIP_BENCHMARK_ANNOTATIONS if (folder / n).is_file()]
    if len(found) != 1:
        return None
    if get_protocol(protocol or STANDARD).dataset_definitions == "clip_benchmark" or not list(
        folder.glob("dataset_*.json")
    ):
        return found[0]
    return None


def _infer_retrieval_kind(spec: DatasetSpec) -> str:
    if spec.path.suffix.lower() in MANIFEST_SUFFIXES:
        return "manifest"
    if spec.path.suffix.lower() == ".txt":
        return "flickr_txt"
    if spec.path.is_file() and _json_starts_with_list(spec.path):
        return "caption_json"
    return "karpathy"


def _json_starts_with_list(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


def load_retrieval_data(
    spec: DatasetSpec | str | Path,
    captions_per_image: int | None = None,
    protocol: Protocol | str | None = None,
) -> RetrievalData:
    """An ALBEF/BLIP retrieval JSON (a list of {"image", "caption"}), a Karpathy-split JSON (or a
    folder holding one), CLIP_benchmark's own coco_test_karpathy.json (COCO's caption layout) or
    flickr30k_test_karpathy.txt (or its --dataset_root holding one: read under --protocol
    clip_benchmark, or where no dataset_*.json is beside it), or a CSV/TSV/JSONL manifest.
    `captions_per_image` None keeps every caption of an ALBEF/BLIP file (as the original) and of
    CLIP_benchmark's files (as it does), and the first five of a Karpathy file (its convention)."""
    spec = as_spec(spec)
    if spec.kind is None and spec.path.is_dir():
        annotation = _clip_benchmark_annotation(spec.path, protocol)
        if annotation is not None:
            spec = dataclasses.replace(spec, path=annotation)
    kind = spec.kind or _infer_retrieval_kind(spec)
    if kind not in RETRIEVAL_READERS:
        raise EvalDataError(f"dataset {spec.name}: unknown retrieval kind {kind!r}")
    return RETRIEVAL_READERS[kind](spec, captions_per_image)


# ---------------------------------------------------------------------------------------------
# command-line items


def parse_dataset_list(values: Sequence[str], data_root: Path | None = None) -> list[DatasetSpec]:
    """`--datasets` items: ``NAME=PATH``, ``PATH``, or a bare ``NAME`` looked up under `data_root`
    (the paper's datasets: `data_root` is torchvision's root; others: `data_root`/NAME); commas
    separate several datasets in one item (the original scripts' style)."""
    specs = []
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(","))):
            if "=" not in item and data_root is not None and not Path(item).exists():
                item = f"{item}={data_root if find_paper_dataset(item) else data_root / item}"
            spec = DatasetSpec.parse(item)
            if not spec.path.exists():
                raise EvalDataError(f"dataset {spec.name}: {spec.path} does not exist; give NAME=PATH")
            specs.append(spec)
    if not specs:
        raise EvalDataError("no datasets given; use --datasets NAME=PATH [NAME=PATH ...]")
    return specs


def parse_name_map(values: Sequence[str] | None, option: str) -> dict[str, Path]:
    """``NAME=FILE`` items (for --classnames / --templates)."""
    out: dict[str, Path] = {}
    for value in values or ():
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise EvalDataError(f"{option} {value!r}: expected NAME=FILE")
        out[name] = Path(path).expanduser()
    return out
