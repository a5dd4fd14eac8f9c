"""One zero-shot evaluation of one dataset: read it, embed its images and texts, score it.

`evaluate_classification` / `evaluate_retrieval` take a model with `encode_image` and
`encode_text` (RWKV_CLIP, or one wrapped by DDP or torch.compile) and a dataset spec, and
return plain dicts, so the same code serves the CLIs (zero_shot.py, retrieval.py), the
demo and train.py's epoch-end hook. The maths (class embeddings, metrics) come from the
model library (src/open_alip/zero_shot.py). Metrics are in percent.

A classification can be spread over the ranks of a process group (`shard`): each rank embeds
its slice of the prompts and of the images, and the predictions are gathered, so every rank
returns the same result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from src.evaluation.clip_benchmark_protocol import (
    clip_benchmark_metrics,
    clip_benchmark_retrieval_metrics,
    read_clip_benchmark_dataset,
)
from src.evaluation.datasets import (
    IMAGE_EXTENSIONS,
    ClassificationData,
    EvalDataError,
    ImageSource,
    RetrievalData,
    make_loader,
    preprocess_batch,
    read_caption_json,
    read_cifar,
    read_classnames_file,
    read_image_folder,
    read_imagenet_val,
    read_karpathy,
    read_manifest_classification,
    read_manifest_retrieval,
)
from src.evaluation.paper_datasets import PaperDataset, find_paper_dataset, read_paper_dataset
from src.evaluation.protocol import STANDARD, Protocol, get_protocol, original_padding_rows
from src.evaluation.sharding import SINGLE, Shard
from src.fsutil import atomic_write_json
from src.open_alip.model import CheckpointMismatchError, create_model, unwrap_model
from src.open_alip.zero_shot import (
    ALIASES,
    DEFAULT_TEMPLATES,
    Tokenizer,
    class_logits,
    class_prompts,
    encode_texts,
    ensemble_prompts,
    load_metadata,
    prediction_metrics,
    retrieval_metrics,
    top_predictions,
)

MANIFEST_SUFFIXES = (".csv", ".tsv", ".jsonl")
# Templates for labels given on the command line: CLIP's 80 ImageNet prompts.
LABEL_TEMPLATES_FROM = "imagenet"


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
    """Where a dataset lives and how to read it. `kind` is inferred when None: the paper's datasets
    by name (src/evaluation/paper_datasets.py), manifests by suffix, retrieval JSON by content,
    else an ImageFolder tree."""

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
    if entry.name in ("cifar10", "cifar100") and _has_class_folders(spec.path) and not (
        (spec.path / entry.folders[0]).is_dir()
    ):
        return None  # CIFAR exported as an ImageFolder tree
    return entry


def _has_class_folders(path: Path) -> bool:
    return path.is_dir() and any(p.is_dir() for p in path.iterdir())


def load_classification_data(
    spec: DatasetSpec | str | Path, protocol: Protocol | str = STANDARD
) -> tuple[ClassificationData, list[str]]:
    """Read a classification dataset (a paper dataset as `protocol` defines it) and pick its
    templates; returns (data, templates)."""
    spec = as_spec(spec)
    entry = paper_dataset_of(spec)
    if entry is not None:
        if get_protocol(protocol).dataset_definitions == "clip_benchmark":
            data, templates = read_clip_benchmark_dataset(entry, spec.path)
        else:
            data, templates = read_paper_dataset(entry, spec.path)
        if spec.classnames is not None:
            names = read_classnames_file(spec.classnames)
            if len(names) != len(data.classnames):
                raise EvalDataError(f"{spec.classnames}: {len(names)} class names, {entry.name} has {len(data.classnames)}")
            data.classnames = names
        data.name = spec.name
        return data, read_templates(spec.templates) if spec.templates else templates
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
    if ALIASES.get(spec.name, spec.name) == "imagenet1k":
        return "imagenet"
    return "imagefolder"


def load_retrieval_data(spec: DatasetSpec | str | Path, captions_per_image: int | None = None) -> RetrievalData:
    """An ALBEF/BLIP retrieval JSON (a list of {"image", "caption"}), a Karpathy-split JSON (or a
    folder holding one) or a CSV/TSV/JSONL manifest. `captions_per_image` None keeps every caption
    of an ALBEF/BLIP file (as the original) and the first five of a Karpathy file (its convention)."""
    spec = as_spec(spec)
    kind = spec.kind
    if kind is None:
        if spec.path.suffix.lower() in MANIFEST_SUFFIXES:
            kind = "manifest"
        elif spec.path.is_file() and _json_starts_with_list(spec.path):
            kind = "caption_json"
        else:
            kind = "karpathy"
    if kind == "manifest":
        return read_manifest_retrieval(spec.path, name=spec.name)
    if kind == "caption_json":
        return read_caption_json(spec.path, spec.image_root, captions_per_image, name=spec.name)
    if kind == "karpathy":
        return read_karpathy(spec.path, spec.image_root, captions_per_image=captions_per_image or 5, name=spec.name)
    raise EvalDataError(f"dataset {spec.name}: unknown retrieval kind {kind!r}")


def _json_starts_with_list(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


# ---------------------------------------------------------------------------------------------
# embeddings


def _batches(
    loader: Iterable, input_size: int, device: torch.device | str, progress: bool, desc: str
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if progress:
        from tqdm import tqdm

        loader = tqdm(loader, desc=desc, unit="batch", leave=False)
    for images, targets in loader:
        yield preprocess_batch(images, input_size, device), torch.as_tensor(targets)


@torch.no_grad()
def encode_images(
    model: torch.nn.Module,
    loader: Iterable,
    input_size: int,
    device: torch.device | str,
    progress: bool = False,
    desc: str = "images",
) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-normalised image embeddings [N, D] and the loader's labels [N]."""
    model = unwrap_model(model)
    features, labels = [], []
    for images, targets in _batches(loader, input_size, device, progress, desc):
        features.append(F.normalize(model.encode_image(images).float(), dim=-1))
        labels.append(targets)
    return torch.cat(features), torch.cat(labels).to(features[0].device)


@torch.no_grad()
def sharded_class_embeddings(
    model: torch.nn.Module,
    classnames: Sequence[str],
    templates: Sequence[str],
    device: torch.device | str,
    shard: Shard = SINGLE,
    tokenizer: Tokenizer | None = None,
) -> torch.Tensor:
    """`build_class_embeddings`, with the prompts (1000 x 80 for ImageNet) spread over the ranks."""
    prompts = class_prompts(classnames, templates)
    start, stop = shard.range(len(prompts))
    local = encode_texts(model, prompts[start:stop], device, tokenizer=tokenizer) if stop > start else None
    if local is None:  # more ranks than prompts: an empty slice of the right width
        width = encode_texts(model, prompts[:1], device, tokenizer=tokenizer).shape[1]
        local = torch.empty((0, width), device=device)
    return ensemble_prompts(shard.gather(local, len(prompts), device), len(classnames), len(templates))


def _image_batches(
    data: ClassificationData, start: int, stop: int, dali: bool, input_size: int, device: torch.device | str,
    batch_size: int, workers: int,
) -> Iterable:
    images, labels = data.images[start:stop], data.labels[start:stop]
    if dali:
        from src.evaluation.dali_val import dali_val_batches

        return dali_val_batches(images, labels, input_size, batch_size, device, workers)
    return make_loader(images, labels, input_size, batch_size, device, workers)


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
    "num_templates", "chance_top1", "metric", "score", "metrics": {"top1", "top5",
    "mean_per_class_recall"}}`` (percent). "metric" names the dataset's headline metric (mean
    per-class recall for aircraft, pets, flowers and caltech101, top-1 otherwise) and "score" is
    its value. Under the original protocol ImageNet also reports "padded_rows" and
    "metrics_without_padding". With `return_predictions` the dict also holds "predictions" (top-1
    class per image) and "data" (the dataset). With a `shard`, every rank of the process group
    must call this; all return the same dict.
    """
    spec = as_spec(dataset_spec)
    protocol = get_protocol(protocol)
    data, templates = load_classification_data(spec, protocol)
    entry = paper_dataset_of(spec)
    imagenet = entry is not None and entry.name == "imagenet"
    count, num_classes = len(data.images), len(data.classnames)
    start, stop = shard.range(count)
    # One row per image: top-1 class, label, top-k classes (what the metrics need, and small to gather).
    rows = [torch.empty((0, 2 + min(5, num_classes)), dtype=torch.long)]
    with eval_mode(model):
        classifier = sharded_class_embeddings(model, data.classnames, templates, device, shard, tokenizer)
        if stop > start:
            batches = _image_batches(data, start, stop, imagenet and protocol.imagenet_dali_resize, input_size,
                                     device, batch_size, workers)
            encoder = unwrap_model(model)
            for images, targets in _batches(batches, input_size, device, progress and shard.rank == 0, data.name):
                features = F.normalize(encoder.encode_image(images).float(), dim=-1)
                top1, topk = top_predictions(class_logits(features, classifier, protocol.integer_logits))
                rows.append(torch.cat([top1[:, None], targets.cpu().long()[:, None], topk], dim=1))
    gathered = shard.gather(torch.cat(rows), count, device).cpu()
    top1_all, labels_all, topk_all = gathered[:, 0], gathered[:, 1], gathered[:, 2:]
    if (labels_all < 0).any() or (labels_all >= num_classes).any():
        raise EvalDataError(f"dataset {data.name}: a stored label is outside 0..{num_classes - 1}")
    metrics = prediction_metrics(top1_all, topk_all, labels_all, num_classes)
    result = {
        "dataset": data.name,
        "task": "classification",
        "protocol": protocol.name,
        "num_images": count,
        "num_classes": num_classes,
        "num_templates": len(templates),
        "chance_top1": 100.0 / num_classes,
    }
    if imagenet and protocol.imagenet_padding_launch:
        padding = original_padding_rows(count, protocol.imagenet_padding_launch)
        # The original's unfilled rows: zero logits, target 0, ranked like every row.
        pad1, padk = top_predictions(torch.zeros(1, num_classes, dtype=torch.long if protocol.integer_logits else None))
        result["padded_rows"] = padding
        result["metrics_without_padding"] = metrics
        metrics = prediction_metrics(
            torch.cat([top1_all, pad1.expand(padding)]), torch.cat([topk_all, padk.expand(padding, -1)]),
            torch.cat([labels_all, torch.zeros(padding, dtype=torch.long)]), num_classes,
        )
    headline = "mean_per_class_recall" if entry is not None and entry.metric == "mean_per_class" else "top1"
    if protocol.dataset_definitions == "clip_benchmark":  # it has no per-dataset headline; its tables rank by acc1
        headline = "top1"
        result["clip_benchmark_metrics"] = clip_benchmark_metrics(metrics, num_classes)
    result.update(metric=headline, score=metrics[headline], metrics=metrics)
    if return_predictions:
        result["predictions"] = top1_all.tolist()
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
    captions_per_image: int | None = None,
    protocol: Protocol | str = STANDARD,
) -> dict:
    """Image<->text retrieval of one dataset: ``{"dataset", "task": "retrieval", "protocol",
    "num_images", "num_captions", "metrics": {"image_to_text_R@1", ..., "text_to_image_R@10",
    "mean_recall"}}``. The original protocol prefixes every caption with "a photo of "."""
    protocol = get_protocol(protocol)
    data = load_retrieval_data(dataset_spec, captions_per_image)
    with eval_mode(model):
        captions = [protocol.caption_prefix + c for c in data.captions]
        text_emb = encode_texts(model, captions, device, tokenizer=tokenizer)
        loader = make_loader(data.images, None, input_size, batch_size, device, workers)
        image_emb, _ = encode_images(model, loader, input_size, device, progress, desc=data.name)
    result = {
        "dataset": data.name,
        "task": "retrieval",
        "protocol": protocol.name,
        "num_images": len(data.images),
        "num_captions": len(data.captions),
        "metrics": retrieval_metrics(image_emb, text_emb, data.caption_image),
    }
    if protocol.dataset_definitions == "clip_benchmark":
        result["clip_benchmark_metrics"] = clip_benchmark_retrieval_metrics(result["metrics"])
    return result


def list_images(paths: Sequence[Path | str]) -> list[Path]:
    """Image files among `paths`: files as given, folders searched recursively (sorted)."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
        elif path.is_file():
            found.append(path)
        else:
            raise EvalDataError(f"--images {path}: no such file or folder")
    if not found:
        raise EvalDataError(f"--images {' '.join(map(str, paths))}: no image files ({', '.join(IMAGE_EXTENSIONS)})")
    return found


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
) -> list[dict]:
    """The top label of each image among `labels` (prompted with `templates`, by default CLIP's 80
    ImageNet ones): ``[{"image", "label", "probability"}]``, the probability a softmax over the
    labels at CLIP's scale of 100."""
    if len(set(labels)) != len(labels) or not all(label.strip() for label in labels):
        raise EvalDataError("--labels: give distinct, non-empty labels, e.g. --labels 'cat,dog,car'")
    templates = list(templates or load_metadata(LABEL_TEMPLATES_FROM)[1])
    with eval_mode(model):
        classifier = sharded_class_embeddings(model, labels, templates, device, tokenizer=tokenizer)
        loader = make_loader(images, None, input_size, batch_size, device, workers)
        features, _ = encode_images(model, loader, input_size, device)
    probabilities = class_logits(features, classifier).softmax(dim=1).cpu()
    best = probabilities.max(dim=1)
    return [{"image": str(image), "label": labels[int(i)], "probability": float(p)}
            for image, i, p in zip(images, best.indices, best.values)]


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
    try:
        return atomic_write_json(path, public)
    except OSError as exc:
        raise EvalDataError(f"cannot write {path} ({exc.strerror or exc}); free space or pass another --output-dir") from None


# ---------------------------------------------------------------------------------------------
# helpers shared by the evaluation CLIs


def resolve_wkv_impl(name: str, device: torch.device) -> str:
    """The WKV implementation `name` (--wkv-impl: "auto" or one of the library's) means on `device`,
    checked before any work: an unknown name, or one that cannot run there, is the user's to fix."""
    from src.open_alip import wkv

    try:
        return wkv.resolve_wkv_impl(name, device)
    except ValueError as exc:
        raise EvalDataError(f"--wkv-impl {name}: {exc}") from None


def load_eval_model(
    config: str | Path,
    checkpoint: str | Path | None,
    device: torch.device,
    wkv_impl: str = "auto",
) -> torch.nn.Module:
    """create_model(config, pretrained=checkpoint) in fp32 eval mode on `device` (the original
    evaluation runs in plain fp32), its WKV implementation set (`resolve_wkv_impl`). A None
    checkpoint gives random weights: callers decide whether that was asked for."""
    if checkpoint is not None and not Path(checkpoint).is_file():
        raise EvalDataError(f"checkpoint {checkpoint} does not exist; pass the .pt file with --model-weight")
    impl = resolve_wkv_impl(wkv_impl, torch.device(device))
    try:
        model = create_model(str(config), pretrained=str(checkpoint) if checkpoint else None, wkv_impl=impl)
    except (CheckpointMismatchError, FileNotFoundError, ValueError) as exc:
        # create_model's errors are the library's; here they are the user's to fix.
        raise EvalDataError(str(exc)) from exc
    return model.to(device=device, dtype=torch.float32).eval()


def check_output_dir(folder: Path | str) -> Path:
    """Create `folder` if needed and prove it writable, before any evaluation runs (results are
    written after each dataset; a folder that refuses them would lose the work)."""
    import tempfile

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise EvalDataError(
            f"--output-dir {folder}: cannot write there ({exc.strerror or exc}); pass a writable folder"
        ) from None
    return folder


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


