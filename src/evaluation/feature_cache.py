"""Frozen image features of one dataset split, extracted once and kept on disk.

A linear probe fits many classifiers on the same features, and a second probe of the same model
(another protocol, another seed) should not embed a dataset again. Features are keyed by what
decides them: the weights' content (a hash of the loaded model's tensors, so a .pt, a
.safetensors, an hf-hub: repo and a released tag holding the same weights share an entry, and
changed weights miss), the model config, the dataset's name, split and image listing (sources
and labels in order), the input size and the evaluation transform, and `FEATURE_FORMAT`. An image
replaced in place under the same name is not noticed; delete the entry (or the folder) then.

An entry is a folder `<cache>/<dataset>-<split>-<key[:16]>/` holding `features.f32` (n x D
float32, row-major: the L2-normalised image embeddings, what zero-shot compares too),
`labels.i64` and `meta.json` (the key's parts, n, D, the skipped images). It is written under a
temporary name and renamed when complete, so a killed run leaves no entry that looks whole.
Features are read back memory-mapped: ImageNet's training split (1.28M x 640) is 3.3 GB on disk
and costs no memory until the solver touches it.

Images that cannot be read are skipped and counted as in zero-shot (src/evaluation/images.py):
their rows are absent and meta.json names them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from src.evaluation.datasets import ClassificationData, EvalDataError, RecordImage
from src.evaluation.encode import encoded_batches, eval_mode, image_batches
from src.evaluation.images import PIL_PREPROCESSING, skipped_list
from src.evaluation.logistic import Rows
from src.fsutil import atomic_write_json

# Bump when extraction changes the numbers it stores (the transform, normalisation, dtype).
FEATURE_FORMAT = 1


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 over the model's state dict: names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def listing_digest(data: ClassificationData) -> str:
    """sha256 over the split's image sources and labels, in order (CIFAR's in-memory images by their
    pixels)."""
    digest = hashlib.sha256()
    for image, label in zip(data.images, data.labels):
        if isinstance(image, np.ndarray):
            digest.update(b"array|" + hashlib.sha256(np.ascontiguousarray(image).tobytes()).digest())
        elif isinstance(image, RecordImage):
            digest.update(f"record|{image.rec}|{image.offset}".encode())
        else:
            digest.update(f"file|{image}".encode())
        digest.update(f"|{label}\n".encode())
    return digest.hexdigest()


@dataclass
class SplitFeatures:
    """The features of one split, memory-mapped from its cache entry."""

    rows: Rows
    folder: Path
    skipped: list[dict]  # [{"image", "error"}] of the images that could not be read
    reused: bool  # read from an existing entry (True) or extracted by this call
    seconds: float  # extraction time (0 when reused)


def entry_key(
    weights: str, config: dict, data: ClassificationData, split: str, input_size: int
) -> tuple[str, dict]:
    """(the entry's hash, the parts it hashes)."""
    parts = {
        "format": FEATURE_FORMAT,
        "weights_sha256": weights,
        "config": config,
        "dataset": data.name,
        "split": split,
        "listing_sha256": listing_digest(data),
        "input_size": input_size,
        "preprocessing": PIL_PREPROCESSING,
        "features": "encode_image, L2-normalised, float32",
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest(), parts


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name).strip("._") or "dataset"


def _load(folder: Path) -> tuple[Rows, dict]:
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    count, dim = meta["count"], meta["dim"]
    # copy-on-write: writable in this process (torch wants that), never written back to the file
    features = np.memmap(folder / "features.f32", dtype=np.float32, mode="c", shape=(count, dim))
    labels = np.fromfile(folder / "labels.i64", dtype=np.int64)
    if len(labels) != count:
        raise EvalDataError(
            f"feature cache {folder}: {len(labels)} labels for {count} rows; delete the folder"
        )
    return Rows(torch.from_numpy(features), torch.from_numpy(labels)), meta


def split_features(
    model: torch.nn.Module,
    data: ClassificationData,
    split: str,
    *,
    weights: str,
    config: dict,
    cache_dir: Path,
    input_size: int,
    device: torch.device | str,
    batch_size: int,
    workers: int,
    progress: bool = False,
) -> SplitFeatures:
    """The features of `data` (one split), from the cache or extracted into it (module doc)."""
    key, parts = entry_key(weights, config, data, split, input_size)
    folder = Path(cache_dir) / f"{_safe(data.name)}-{split}-{key[:16]}"
    if (folder / "meta.json").is_file():
        rows, meta = _load(folder)
        return SplitFeatures(rows, folder, meta.get("skipped_images", []), True, 0.0)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    try:
        with _writing(cache_dir):
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        seconds, skipped = _extract(
            model, data, split, parts, tmp, cache_dir, input_size, device, batch_size, workers, progress
        )
        with _writing(cache_dir):
            try:
                os.rename(tmp, folder)
            except OSError:  # another run finished the same entry first: keep theirs
                if not (folder / "meta.json").is_file():
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows, _ = _load(folder)
    return SplitFeatures(rows, folder, skipped, False, seconds)


@contextmanager
def _writing(cache_dir: Path) -> Iterator[None]:
    """A failed write into the cache (disk full, no permission) is the user's to fix."""
    try:
        yield
    except OSError as exc:
        raise EvalDataError(
            f"feature cache {cache_dir}: cannot write there ({exc.strerror or exc}); free space or "
            "pass another --feature-cache"
        ) from None


def _extract(
    model: torch.nn.Module,
    data: ClassificationData,
    split: str,
    parts: dict,
    tmp: Path,
    cache_dir: Path,
    input_size: int,
    device: torch.device | str,
    batch_size: int,
    workers: int,
    progress: bool,
) -> tuple[float, list[dict]]:
    """Embed every readable image of `data` in order into `tmp`; returns (seconds, skipped images)."""
    start = time.perf_counter()
    failed: list[tuple[int, str]] = []
    count, dim = 0, 0
    with _writing(cache_dir):
        feats, labels = open(tmp / "features.f32", "wb"), open(tmp / "labels.i64", "wb")
    with feats, labels, torch.no_grad(), eval_mode(model):
        batches = image_batches(data.images, data.labels, input_size, device, batch_size, workers)
        for emb, batch in encoded_batches(
            model, batches, input_size, device, progress, f"{data.name} {split}"
        ):
            failed += batch.failed
            if emb is None:
                continue
            rows = np.ascontiguousarray(emb.float().cpu().numpy())
            dim = rows.shape[1]
            with _writing(cache_dir):
                feats.write(rows.tobytes())
                labels.write(batch.labels.numpy().astype(np.int64).tobytes())
            count += len(rows)
    skipped = skipped_list(data.images, failed)
    if count == 0:
        first = skipped[0]
        raise EvalDataError(
            f"dataset {data.name} ({split}): none of its {len(data.images)} images could be "
            f"read (e.g. {first['image']}: {first['error']})"
        )
    seconds = time.perf_counter() - start
    with _writing(cache_dir):
        atomic_write_json(
            tmp / "meta.json",
            {**parts, "count": count, "dim": dim, "extraction_seconds": seconds, "skipped_images": skipped},
        )
    return seconds, skipped
