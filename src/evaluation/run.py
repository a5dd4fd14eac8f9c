"""One zero-shot evaluation of one dataset: read it, embed its images and texts, score it.

`evaluate_classification` / `evaluate_retrieval` take a model with `encode_image` and
`encode_text` (RWKV_CLIP, or one wrapped by DDP or torch.compile) and a dataset spec, and
return plain dicts, so the same code serves the CLIs (zero_shot.py, retrieval.py), the
demo and train.py's epoch-end hook. The maths (class embeddings, metrics) come from the
model library (src/open_alip/zero_shot.py). Metrics are in percent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from src.evaluation.datasets import (
    ClassificationData,
    EvalDataError,
    RetrievalData,
    make_loader,
    preprocess_batch,
    read_cifar,
    read_classnames_file,
    read_image_folder,
    read_imagenet_val,
    read_karpathy,
    read_manifest_classification,
    read_manifest_retrieval,
)
from src.fsutil import atomic_write_json
from src.open_alip.model import CheckpointMismatchError, create_model, unwrap_model
from src.open_alip.zero_shot import (
    ALIASES,
    DEFAULT_TEMPLATES,
    Tokenizer,
    build_class_embeddings,
    classification_metrics,
    encode_texts,
    load_metadata,
    retrieval_metrics,
)

MANIFEST_SUFFIXES = (".csv", ".tsv", ".jsonl")


# ---------------------------------------------------------------------------------------------
# bundled class names and templates


def read_templates(path: Path | str) -> list[str]:
    """Templates from a JSON list (or {"templates": [...]}) or a text file, one per line, with `{}`."""
    path = Path(path)
    if not path.is_file():
        raise EvalDataError(f"template file {path} does not exist")
    if path.suffix.lower() == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        templates = data["templates"] if isinstance(data, dict) else data
    else:
        templates = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    bad = [t for t in templates if "{}" not in t]
    if not templates or bad:
        raise EvalDataError(f"template file {path}: every template needs a '{{}}' placeholder (bad: {bad[:3]})")
    return list(templates)


# ---------------------------------------------------------------------------------------------
# dataset specifications


@dataclass
class DatasetSpec:
    """Where a dataset lives and how to read it. `kind` is inferred when None:
    cifar10/cifar100/imagenet by name, manifests by suffix, Karpathy JSON, else an ImageFolder tree."""

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


def load_classification_data(spec: DatasetSpec | str | Path) -> tuple[ClassificationData, list[str]]:
    """Read a classification dataset and pick its templates; returns (data, templates)."""
    spec = as_spec(spec)
    bundled_names, bundled_templates = load_metadata(spec.name)
    kind = spec.kind or _infer_classification_kind(spec)
    names: list[str] | None = None
    if spec.classnames is not None and kind != "imagefolder":
        names = read_classnames_file(spec.classnames)
    elif spec.classnames is None and kind != "imagefolder":
        names = bundled_names
    if kind in ("cifar10", "cifar100"):
        data = read_cifar(spec.path, kind)
    elif kind == "imagenet":
        if names is None:
            names, _ = load_metadata("imagenet1k")
        data = read_imagenet_val(spec.path, names, name=spec.name)
    elif kind == "manifest":
        data = read_manifest_classification(spec.path, names, name=spec.name)
    elif kind == "imagefolder":
        # An ImageFolder tree names its classes itself (or through --classnames). The bundled list
        # is only trusted for folders named by class index, where its order is the index order.
        data = read_image_folder(spec.path, spec.classnames, name=spec.name)
        if (spec.classnames is None and bundled_names and len(bundled_names) == len(data.classnames)
                and all(n.isdigit() for n in data.classnames)):
            first = int(data.classnames[0])
            if [int(n) - first for n in data.classnames] == list(range(len(bundled_names))):
                names = bundled_names
    else:
        raise EvalDataError(f"dataset {spec.name}: unknown kind {kind!r}")
    if names is not None:
        if len(names) != len(data.classnames):
            raise EvalDataError(
                f"dataset {spec.name}: {len(names)} class names but the data has {len(data.classnames)} classes"
            )
        data.classnames = list(names)
    data.name = spec.name
    templates = read_templates(spec.templates) if spec.templates else list(bundled_templates or DEFAULT_TEMPLATES)
    return data, templates


def _infer_classification_kind(spec: DatasetSpec) -> str:
    if spec.path.suffix.lower() in MANIFEST_SUFFIXES:
        return "manifest"
    if spec.name in ("cifar10", "cifar100"):
        # the python pickles, unless the folder is an ImageFolder export of CIFAR
        has_class_folders = spec.path.is_dir() and any(p.is_dir() for p in spec.path.iterdir())
        return "imagefolder" if has_class_folders else spec.name
    if ALIASES.get(spec.name, spec.name) == "imagenet1k":
        return "imagenet"
    return "imagefolder"


def load_retrieval_data(spec: DatasetSpec | str | Path, captions_per_image: int | None = 5) -> RetrievalData:
    """A Karpathy-split JSON (or a folder holding one) or a CSV/TSV/JSONL manifest."""
    spec = as_spec(spec)
    kind = spec.kind or ("manifest" if spec.path.suffix.lower() in MANIFEST_SUFFIXES else "karpathy")
    if kind == "manifest":
        return read_manifest_retrieval(spec.path, name=spec.name)
    if kind == "karpathy":
        return read_karpathy(spec.path, spec.image_root, captions_per_image=captions_per_image, name=spec.name)
    raise EvalDataError(f"dataset {spec.name}: unknown retrieval kind {kind!r}")


# ---------------------------------------------------------------------------------------------
# embeddings


@torch.no_grad()
def encode_images(
    model: torch.nn.Module,
    loader: torch.utils.data.DataLoader,
    input_size: int,
    device: torch.device | str,
    progress: bool = False,
    desc: str = "images",
) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalised image embeddings [N, D] and the loader's labels [N]."""
    model = unwrap_model(model)
    features, labels = [], []
    batches = loader
    if progress:
        from tqdm import tqdm

        batches = tqdm(loader, desc=desc, unit="batch", leave=False)
    for images, targets in batches:
        images = preprocess_batch(images, input_size, device)
        features.append(F.normalize(model.encode_image(images).float(), dim=-1))
        labels.append(torch.as_tensor(targets))
    return torch.cat(features), torch.cat(labels).to(features[0].device)


# ---------------------------------------------------------------------------------------------
# metrics


# ---------------------------------------------------------------------------------------------
# whole evaluations


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """The model in eval mode, its mode restored afterwards (train.py evaluates mid-training)."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


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
) -> dict:
    """Zero-shot classification of one dataset.

    Returns ``{"dataset", "task": "classification", "num_images", "num_classes", "chance_top1",
    "metrics": {"top1", "top5", "mean_per_class_recall"}}`` (percent). With `return_predictions`
    the dict also holds "predictions" (top-1 class index per image) and "data" (the dataset).
    """
    data, templates = load_classification_data(dataset_spec)
    with eval_mode(model):
        classifier = build_class_embeddings(model, data.classnames, templates, device, tokenizer=tokenizer)
        loader = make_loader(data.images, data.labels, input_size, batch_size, device, workers)
        features, labels = encode_images(model, loader, input_size, device, progress, desc=data.name)
    logits = features @ classifier
    result = {
        "dataset": data.name,
        "task": "classification",
        "num_images": len(data.images),
        "num_classes": len(data.classnames),
        "num_templates": len(templates),
        "chance_top1": 100.0 / len(data.classnames),
        "metrics": classification_metrics(logits, labels, len(data.classnames)),
    }
    if return_predictions:
        result["predictions"] = logits.argmax(dim=1).cpu().tolist()
        result["data"] = data
    return result


def evaluate_retrieval(
    model: torch.nn.Module,
    dataset_spec: DatasetSpec | str | Path,
    input_size: int,
    device: torch.device | str,
    batch_size: int = 64,
    workers: int = 0,
    tokenizer: Tokenizer | None = None,
    progress: bool = False,
    captions_per_image: int | None = 5,
) -> dict:
    """Image<->text retrieval of one dataset: ``{"dataset", "task": "retrieval", "num_images",
    "num_captions", "metrics": {"image_to_text_R@1", ..., "text_to_image_R@10", "mean_recall"}}``."""
    data = load_retrieval_data(dataset_spec, captions_per_image)
    with eval_mode(model):
        text_emb = encode_texts(model, data.captions, device, tokenizer=tokenizer)
        loader = make_loader(data.images, None, input_size, batch_size, device, workers)
        image_emb, _ = encode_images(model, loader, input_size, device, progress, desc=data.name)
    return {
        "dataset": data.name,
        "task": "retrieval",
        "num_images": len(data.images),
        "num_captions": len(data.captions),
        "metrics": retrieval_metrics(image_emb, text_emb, data.caption_image),
    }


def format_table(results: Sequence[dict]) -> str:
    """A plain-text table: one row per dataset, one column per metric."""
    if not results:
        return ""
    keys: list[str] = []
    for r in results:
        keys += [k for k in r["metrics"] if k not in keys]
    extra = ["chance_top1"] if any("chance_top1" in r for r in results) else []
    header = ["dataset", *keys, *extra]
    rows = []
    for r in results:
        values = [f"{r['metrics'][k]:.2f}" if k in r["metrics"] else "-" for k in keys]
        values += [f"{r['chance_top1']:.2f}" if "chance_top1" in r else "-" for _ in extra]
        rows.append([r["dataset"], *values])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(str(x).ljust(w) for x, w in zip(line, widths)) for line in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_result(result: dict, output_dir: Path | str) -> Path:
    """Write one dataset's result as ``<output_dir>/<task>_<dataset>.json`` (temp file, then rename)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in result["dataset"]).strip("._")
    path = output_dir / f"{result['task']}_{safe or 'dataset'}.json"
    public = {k: v for k, v in result.items() if k not in ("data", "predictions")}
    return atomic_write_json(path, public)


# ---------------------------------------------------------------------------------------------
# helpers shared by the evaluation CLIs


def load_eval_model(config: str | Path, checkpoint: str | Path | None, device: torch.device) -> torch.nn.Module:
    """create_model(config, pretrained=checkpoint) in fp32 eval mode on `device` (the original
    evaluation runs in plain fp32)."""
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise EvalDataError(f"checkpoint {checkpoint} does not exist; pass the .pt file with --model-weight")
    try:
        model = create_model(str(config), pretrained=str(checkpoint) if checkpoint else None)
    except (CheckpointMismatchError, FileNotFoundError, ValueError) as exc:
        # create_model's errors are the library's; here they are the user's to fix.
        raise EvalDataError(str(exc)) from exc
    return model.to(device=device, dtype=torch.float32).eval()


def parse_dataset_list(values: Sequence[str], data_root: Path | None = None) -> list[DatasetSpec]:
    """`--datasets` items: ``NAME=PATH``, ``PATH``, or a bare ``NAME`` looked up under `data_root`;
    commas separate several datasets in one item (the original scripts' style)."""
    specs = []
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(","))):
            if "=" not in item and data_root is not None and not Path(item).exists():
                item = f"{item}={data_root / item}"
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


