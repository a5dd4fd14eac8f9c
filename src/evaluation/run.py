"""Zero-shot evaluation: class embeddings from prompt templates, classification and retrieval metrics.

The functions here take a model with `encode_image(images)` and `encode_text(tokens)` (RWKV_CLIP,
or its DDP wrapper) and return plain dicts, so the same code serves the CLIs (zero_shot.py,
retrieval.py), the demo and the periodic evaluation inside train.py.

Metrics are reported in percent.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
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

DATA_DIR = Path(__file__).resolve().parents[1] / "open_alip" / "zero_shot_data"
DEFAULT_TEMPLATES = ("a photo of a {}.",)
# Names the original scripts use for the same bundled metadata.
ALIASES = {"imagenet": "imagenet1k", "cars": "stanford_car", "fgvc_aircraft": "aircraft", "flowers102": "flowers"}
MANIFEST_SUFFIXES = (".csv", ".tsv", ".jsonl")

Tokenizer = Callable[[Sequence[str]], torch.Tensor]


# ---------------------------------------------------------------------------------------------
# bundled class names and templates


def list_metadata() -> list[str]:
    """Dataset names with bundled class names and/or templates."""
    return sorted(p.stem for p in DATA_DIR.glob("*.json"))


def load_metadata(name: str) -> tuple[list[str] | None, list[str] | None]:
    """(classnames, templates) bundled for `name`, each None when not bundled."""
    path = DATA_DIR / f"{ALIASES.get(name, name)}.json"
    if not path.is_file():
        return None, None
    data = json.loads(path.read_text(encoding="utf-8"))
    return data.get("classnames"), data.get("templates")


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


def _as_spec(spec: DatasetSpec | str | Path) -> DatasetSpec:
    if isinstance(spec, DatasetSpec):
        return spec
    return DatasetSpec.parse(str(spec))


def load_classification_data(spec: DatasetSpec | str | Path) -> tuple[ClassificationData, list[str]]:
    """Read a classification dataset and pick its templates; returns (data, templates)."""
    spec = _as_spec(spec)
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
    spec = _as_spec(spec)
    kind = spec.kind or ("manifest" if spec.path.suffix.lower() in MANIFEST_SUFFIXES else "karpathy")
    if kind == "manifest":
        return read_manifest_retrieval(spec.path, name=spec.name)
    if kind == "karpathy":
        return read_karpathy(spec.path, spec.image_root, captions_per_image=captions_per_image, name=spec.name)
    raise EvalDataError(f"dataset {spec.name}: unknown retrieval kind {kind!r}")


# ---------------------------------------------------------------------------------------------
# embeddings


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def _default_tokenizer() -> Tokenizer:
    from src.open_alip.tokenizer import tokenize

    return tokenize


@torch.no_grad()
def encode_texts(
    model: torch.nn.Module,
    texts: Sequence[str],
    device: torch.device | str,
    batch_size: int = 256,
    tokenizer: Tokenizer | None = None,
) -> torch.Tensor:
    """L2-normalised text embeddings [N, D] (float32, on `device`)."""
    tokenizer = tokenizer or _default_tokenizer()
    model = _unwrap(model)
    out = []
    for start in range(0, len(texts), batch_size):
        tokens = tokenizer(list(texts[start : start + batch_size])).to(device)
        out.append(F.normalize(model.encode_text(tokens).float(), dim=-1))
    return torch.cat(out)


@torch.no_grad()
def build_class_embeddings(
    model: torch.nn.Module,
    classnames: Sequence[str],
    templates: Sequence[str],
    device: torch.device | str,
    batch_size: int = 256,
    tokenizer: Tokenizer | None = None,
) -> torch.Tensor:
    """Zero-shot classifier weights [D, C]: for each class, the mean of its normalised
    prompt embeddings (one per template), re-normalised (the CLIP paper's ensembling)."""
    if not classnames or not templates:
        raise ValueError("need at least one class name and one template")
    prompts = [t.format(c) for c in classnames for t in templates]
    emb = encode_texts(model, prompts, device, batch_size, tokenizer)
    emb = emb.view(len(classnames), len(templates), -1).mean(dim=1)
    return F.normalize(emb, dim=-1).t().contiguous()


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
    model = _unwrap(model)
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


def classification_metrics(logits: torch.Tensor, targets: torch.Tensor, num_classes: int | None = None) -> dict:
    """Top-1 / top-5 accuracy and mean per-class recall (classes without samples are skipped), in %."""
    num_classes = num_classes or logits.shape[1]
    targets = targets.to(logits.device).long()
    k = min(5, logits.shape[1])
    topk = logits.topk(k, dim=1).indices
    hit = topk.eq(targets.unsqueeze(1))
    top1 = hit[:, 0].float()
    per_class_hits = torch.zeros(num_classes, device=logits.device).index_add_(0, targets, top1)
    per_class_total = torch.bincount(targets, minlength=num_classes).float()
    present = per_class_total > 0
    recall = (per_class_hits[present] / per_class_total[present]).mean()
    return {
        "top1": 100.0 * top1.mean().item(),
        "top5": 100.0 * hit.any(dim=1).float().mean().item(),
        "mean_per_class_recall": 100.0 * recall.item(),
    }


def retrieval_metrics(
    image_emb: torch.Tensor,
    text_emb: torch.Tensor,
    caption_image: torch.Tensor | Sequence[int],
    ks: Sequence[int] = (1, 5, 10),
    chunk: int = 1024,
) -> dict:
    """Recall@K both ways, in %.

    image->text: an image is a hit at K when any of its captions is among the K most similar texts.
    text->image: a caption is a hit at K when its image is among the K most similar images.
    Ranks count strictly better-scoring candidates, so ties resolve in the query's favour.
    """
    caption_image = torch.as_tensor(caption_image, device=image_emb.device).long()
    n_img, n_txt = image_emb.shape[0], text_emb.shape[0]
    i2t_rank = torch.empty(n_img, dtype=torch.long, device=image_emb.device)
    t2i_rank = torch.empty(n_txt, dtype=torch.long, device=image_emb.device)
    owner = torch.zeros(n_img, n_txt, dtype=torch.bool, device=image_emb.device)
    owner[caption_image, torch.arange(n_txt, device=image_emb.device)] = True
    for start in range(0, n_img, chunk):
        sim = image_emb[start : start + chunk] @ text_emb.t()
        mine = owner[start : start + chunk]
        best = sim.masked_fill(~mine, -math.inf).max(dim=1, keepdim=True).values
        i2t_rank[start : start + chunk] = (sim > best).sum(dim=1)
    for start in range(0, n_txt, chunk):
        sim = text_emb[start : start + chunk] @ image_emb.t()
        idx = caption_image[start : start + chunk]
        correct = sim.gather(1, idx.unsqueeze(1))
        t2i_rank[start : start + chunk] = (sim > correct).sum(dim=1)
    metrics = {}
    for k in ks:
        metrics[f"image_to_text_R@{k}"] = 100.0 * (i2t_rank < k).float().mean().item()
    for k in ks:
        metrics[f"text_to_image_R@{k}"] = 100.0 * (t2i_rank < k).float().mean().item()
    metrics["mean_recall"] = sum(metrics.values()) / len(metrics)
    return metrics


# ---------------------------------------------------------------------------------------------
# whole evaluations


def _eval_mode(model: torch.nn.Module):
    """Context: model in eval mode, restored afterwards (train.py calls this mid-training)."""

    class _Ctx:
        def __enter__(self):
            self.was_training = model.training
            model.eval()

        def __exit__(self, *exc):
            model.train(self.was_training)

    return _Ctx()


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
    with _eval_mode(model):
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
    with _eval_mode(model):
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
    tmp = path.with_name(path.name + ".tmp")
    public = {k: v for k, v in result.items() if k not in ("data", "predictions")}
    tmp.write_text(json.dumps(public, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------------------
# helpers shared by the evaluation CLIs


def resolve_device(name: str = "auto") -> torch.device:
    """"auto" picks the first GPU when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EvalDataError(f"--device {name}: no CUDA device on this machine; use --device cpu")
    return device


def load_eval_model(config: str | Path, checkpoint: str | Path | None, device: torch.device) -> torch.nn.Module:
    """create_model(config, pretrained=checkpoint) in fp32 eval mode on `device` (the original
    evaluation runs in plain fp32)."""
    from src.open_alip.model import create_model

    if checkpoint is not None and not Path(checkpoint).is_file():
        raise EvalDataError(f"checkpoint {checkpoint} does not exist; pass the .pt file with --model-weight")
    model = create_model(str(config), pretrained=str(checkpoint) if checkpoint else None)
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


def zero_shot_epoch_hook(
    dataset_spec: DatasetSpec | str | Path, frequency: int = 1, batch_size: int = 64, workers: int = 0
) -> Callable:
    """An epoch-end hook for train.py's `--zeroshot-data SPEC --zeroshot-frequency N`.

    Called as ``hook(model, epochs_done, args, env)``; on the master rank (``env.is_master``) every
    `frequency` epochs it returns ``{"zeroshot_top1": ..., "zeroshot_top5": ...,
    "zeroshot_mean_per_class_recall": ...}`` (percent), elsewhere ``{}``.
    """
    spec = _as_spec(dataset_spec)
    load_classification_data(spec)  # fail at start-up, not after the first epoch

    def hook(model: torch.nn.Module, epochs_done: int, args=None, env=None) -> dict:
        if epochs_done % frequency or not getattr(env, "is_master", True):
            return {}
        device = getattr(env, "device", None) or next(_unwrap(model).parameters()).device
        input_size = int(_unwrap(model).config["input_size"])
        result = evaluate_classification(model, spec, input_size, device, batch_size, workers)
        return {f"zeroshot_{k}": v for k, v in result["metrics"].items()}

    return hook
