"""Embeddings of an image folder, an image list or a text file: the library behind embed.py.

Inputs:
- images: every image file under a folder (recursively, by sorted relative path; hidden files
  left out), or a list: a .txt file with one path per line, or a CSV/TSV/JSONL manifest with an
  image column. Relative paths in a list are relative to the list's folder and must stay inside
  it. Images that are missing or cannot be decoded are skipped, counted and named in the index, as is
  every path named like an image that is no file to read (a FIFO, a device, a broken link, a folder).
- texts: a UTF-8 file, one text per line; blank lines are skipped.

Output, for `--output OUT.npy`:
- OUT.npy: float32 [N, D], each row L2-normalised (cosine similarity is a dot product);
- OUT.index.json: `{"kind", "model", "weights", "count", "dim", "root", "items", "skipped"}`, where
  items[i] names the input of row i (a path relative to `root`, or the text).
Both are written under temporary names and renamed when complete; the old index is removed before
the new embeddings take the name, so an interrupted run never leaves a matching-looking pair.
Images are listed and read as the evaluation does (src/evaluation/images.py), the model loaded by
the inference CLIs' one loader (src/evaluation/model_loader.py).
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from src.errors import UserError
from src.evaluation.datasets import IMAGE_COLUMNS, preprocess_batch
from src.evaluation.images import WANTED, find_images, skipping_loader
from src.evaluation.model_loader import load_model, model_label
from src.evaluation.specs import MANIFEST_SUFFIXES
from src.fsutil import atomic_path, atomic_write_json, json_safe, remove_stale_temp_files, temp_path_for
from src.open_alip.paths import not_a_file

LIST_SUFFIXES = (".txt", ".lst")
_COPY_ROWS = 1 << 14  # rows per step when compacting the output after skipped images


class EmbedError(UserError):
    """Bad input to embed.py (missing input, no weights, a model problem); one line."""


@dataclass
class ImageInputs:
    root: Path  # what `labels` are relative to (the folder, or the list's folder)
    sources: list[Path]
    labels: list[str]  # how the index names each source
    missing: list[tuple[str, str]] = field(
        default_factory=list
    )  # (label, why) of paths that are no file to read


# ---------------------------------------------------------------------------------------------
# inputs


def scan_image_folder(folder: Path) -> ImageInputs:
    """Every image file under `folder` (src/evaluation/images.py find_images), by sorted relative path;
    what the walk found named like an image but cannot read (a FIFO, a broken link) as `missing`."""
    found, not_read = find_images(folder)
    return ImageInputs(folder, [p for _, p in found], [label for label, _ in found], not_read)


def _list_entries(path: Path, image_column: str | None) -> list[str]:
    suffix = path.suffix.lower()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise EmbedError(f"--images {path}: cannot read the list ({exc.__class__.__name__}: {exc})") from None
    if suffix in LIST_SUFFIXES:
        return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if suffix == ".jsonl":
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    raise EmbedError(f"--images {path}: line {n} is not JSON") from None
                if not isinstance(row, dict):
                    raise EmbedError(f"--images {path}: line {n} is not a JSON object")
                rows.append(row)
    else:
        rows = list(
            csv.DictReader(io.StringIO(text, newline=""), delimiter="\t" if suffix == ".tsv" else ",")
        )
    if not rows:
        raise EmbedError(f"--images {path}: the manifest has no rows")
    columns = list(rows[0].keys())
    column = image_column or next((c for c in IMAGE_COLUMNS if c in columns), None)
    if column is None or column not in columns:
        wanted = f"no column {image_column!r}" if image_column else "no image column"
        raise EmbedError(
            f"--images {path}: {wanted} among {', '.join(map(str, columns))}; name it with --image-column"
        )
    return [str(row.get(column) or "").strip() for row in rows]


def read_image_list(path: Path, image_column: str | None = None) -> ImageInputs:
    """The images a .txt list or CSV/TSV/JSONL manifest names (see the module doc)."""
    root = path.parent
    root_resolved = root.resolve()
    sources, labels, missing = [], [], []
    for entry in _list_entries(path, image_column):
        if not entry:
            missing.append(("", "empty image path"))
            continue
        candidate = Path(entry)
        if not candidate.is_absolute():
            resolved = (root / candidate).resolve()
            if resolved != root_resolved and root_resolved not in resolved.parents:
                raise EmbedError(f"--images {path}: refusing image path {entry!r}, it leaves {root}")
            candidate = root / candidate
        why = not_a_file(candidate, WANTED)
        if why is None:
            sources.append(candidate)
            labels.append(entry)
        else:
            missing.append((entry, why))
    if not sources and not missing:
        raise EmbedError(f"--images {path}: the list names no images")
    return ImageInputs(root, sources, labels, missing)


def read_images(path: Path, image_column: str | None = None) -> ImageInputs:
    if path.is_dir():
        return scan_image_folder(path)
    why = not_a_file(path, "a folder or a list")
    if why is not None:
        raise EmbedError(f"--images {path} {why}; give a folder of images or a list of them")
    if path.suffix.lower() not in LIST_SUFFIXES + MANIFEST_SUFFIXES:
        raise EmbedError(
            f"--images {path}: unknown list type {path.suffix!r}; use a folder, a .txt list (one path per "
            "line) or a .csv/.tsv/.jsonl manifest"
        )
    return read_image_list(path, image_column)


def read_texts(path: Path) -> tuple[list[str], int]:
    """(texts, number of blank lines skipped) of a UTF-8 file with one text per line."""
    if not path.is_file():
        raise EmbedError(f"--texts {path} does not exist; give a UTF-8 file with one text per line")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise EmbedError(f"--texts {path}: not UTF-8 text (byte {exc.start}); convert it to UTF-8") from None
    texts = [ln.strip() for ln in lines if ln.strip()]
    if not texts:
        raise EmbedError(f"--texts {path}: no text in the file")
    return texts, len(lines) - len(texts)


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(
        total=total, desc=desc, unit=desc.rstrip("s") if desc.endswith("s") else desc, dynamic_ncols=True
    )


@torch.no_grad()
def embed_images(
    model: torch.nn.Module,
    sources: Sequence[Path],
    rows: np.ndarray,
    device: torch.device,
    batch_size: int = 64,
    workers: int = 0,
    progress: bool = False,
) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Write image i's normalised embedding to rows[i]; returns (mask of rows written, [(i, why)] skipped)."""
    input_size = model.config["input_size"]
    written = np.zeros(len(sources), dtype=bool)
    skipped: list[tuple[int, str]] = []
    bar = _progress(len(sources), "images", progress)
    for batch in skipping_loader(sources, None, input_size, batch_size, device, workers):
        skipped.extend(batch.failed)
        if batch.positions:
            pixels = preprocess_batch(batch.images, device)
            rows[batch.positions] = F.normalize(model.encode_image(pixels).float(), dim=-1).cpu().numpy()
            written[batch.positions] = True
        if bar is not None:
            bar.update(len(batch.positions) + len(batch.failed))
            if skipped:
                bar.set_postfix(skipped=len(skipped))
    if bar is not None:
        bar.close()
    return written, skipped


@torch.no_grad()
def embed_texts(
    model: torch.nn.Module,
    texts: Sequence[str],
    rows: np.ndarray,
    device: torch.device,
    batch_size: int = 256,
    progress: bool = False,
) -> None:
    """Write text i's normalised embedding to rows[i]."""
    from src.open_alip import tokenize

    bar = _progress(len(texts), "texts", progress)
    for start in range(0, len(texts), batch_size):
        chunk = list(texts[start : start + batch_size])
        tokens = tokenize(chunk, model.context_length).to(device)
        rows[start : start + len(chunk)] = (
            F.normalize(model.encode_text(tokens).float(), dim=-1).cpu().numpy()
        )
        if bar is not None:
            bar.update(len(chunk))
    if bar is not None:
        bar.close()


# ---------------------------------------------------------------------------------------------
# the whole run


def index_path_for(output: Path) -> Path:
    """OUT.npy -> OUT.index.json"""
    return output.with_name(output.name.removesuffix(".npy") + ".index.json")


def _write_outputs(
    output: Path,
    n: int,
    dim: int,
    fill: Callable[[np.ndarray], np.ndarray],
    make_index: Callable[[np.ndarray], dict[str, Any]],
) -> dict[str, Any]:
    """Fill a [n, dim] float32 array through `fill` (it returns the mask of the rows it wrote), keep
    the written rows, write OUT.npy and then OUT.index.json = make_index(kept row numbers); returns
    that index. The rows live in a memory-mapped temporary file, not in memory."""
    full = temp_path_for(output.with_name(output.name + ".rows"))
    try:
        rows = np.lib.format.open_memmap(full, mode="w+", dtype=np.float32, shape=(n, dim))
        kept = np.flatnonzero(fill(rows))
        index_path = index_path_for(output)
        with atomic_path(output) as tmp:
            if len(kept) == n:
                rows.flush()
                del rows
                os.replace(full, tmp)
            else:  # drop the rows of skipped inputs
                dense = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=(len(kept), dim))
                for a in range(0, len(kept), _COPY_ROWS):
                    dense[a : a + _COPY_ROWS] = rows[kept[a : a + _COPY_ROWS]]
                dense.flush()
                del dense, rows
            # An old index must not describe the new embeddings, even for a moment.
            index_path.unlink(missing_ok=True)
        index = make_index(kept)
        # A non-UTF-8 file name (surrogate-escaped by os.fsdecode) is written with its odd bytes as
        # \xNN, as every report names such files: a lone surrogate is not valid JSON text.
        atomic_write_json(index_path, json_safe(index), ensure_ascii=False)
        return index
    finally:
        full.unlink(missing_ok=True)


def run_embed(
    *,
    model_name: str | None,
    weights: str | None,
    output: Path,
    images: Path | None = None,
    texts: Path | None = None,
    image_column: str | None = None,
    device: torch.device,
    batch_size: int = 64,
    workers: int = 4,
    random_init: bool = False,
    cache_dir: Path | None = None,
    wkv_impl: str | None = "auto",
    progress: bool = True,
) -> dict[str, Any]:
    """Embed `images` or `texts` into `output` and its index (module doc); returns the index
    without its item list, plus "index": the index's path."""
    if (images is None) == (texts is None):
        raise EmbedError("give exactly one of --images and --texts")
    if output.suffix.lower() != ".npy":
        raise EmbedError(f"--output {output}: the embeddings are a numpy file; name it *.npy")
    if batch_size < 1 or workers < 0:
        raise EmbedError("--batch-size must be >= 1 and --workers >= 0")
    if output.is_dir():
        raise EmbedError(f"--output {output} is a folder; give a file name ending in .npy")
    output.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(output.parent, os.W_OK):
        raise EmbedError(f"--output {output}: folder {output.parent} is not writable")
    for name in (output.name + "*", index_path_for(output).name):  # left by a killed run
        remove_stale_temp_files(output.parent, name)

    base: dict[str, Any] = {"model": model_name, "weights": weights, "dtype": "float32", "normalized": True}

    def load():
        model = load_model(model_name, weights, device, wkv_impl, random_init, cache_dir)
        base["model"] = model_label(model_name, model)
        print(f"[embed] model: {model.config_source}", file=sys.stderr, flush=True)
        return model

    if images is not None:
        inputs = read_images(images, image_column)
        if not inputs.sources:
            label, why = inputs.missing[0]
            raise EmbedError(
                f"--images {images}: none of the {len(inputs.missing)} image paths is a file to read "
                f"(e.g. {label} {why})"
            )
        model = load()
        dim, n, labels = model.image_embed_dim, len(inputs.sources), inputs.labels
        skipped = [{"item": label, "error": why} for label, why in inputs.missing]

        def fill(rows: np.ndarray) -> np.ndarray:
            written, failed = embed_images(model, inputs.sources, rows, device, batch_size, workers, progress)
            skipped.extend({"item": labels[i], "error": why} for i, why in sorted(failed))
            if not written.any():
                first = skipped[-1]
                raise EmbedError(
                    f"--images {images}: none of the {n} images could be read (e.g. {first['item']}: "
                    f"{first['error']}); nothing written"
                )
            return written

        def make_index(kept: np.ndarray) -> dict[str, Any]:
            return {
                "kind": "images",
                **base,
                "count": len(kept),
                "dim": dim,
                "root": str(inputs.root.resolve()),
                "items": [labels[i] for i in kept],
                "skipped": skipped,
            }
    else:
        text_list, blank = read_texts(texts)
        model = load()
        dim, n = model.text_embed_dim, len(text_list)

        def fill(rows: np.ndarray) -> np.ndarray:
            embed_texts(model, text_list, rows, device, batch_size, progress)
            return np.ones(n, dtype=bool)

        def make_index(kept: np.ndarray) -> dict[str, Any]:
            return {
                "kind": "texts",
                **base,
                "count": len(kept),
                "dim": dim,
                "root": str(texts.resolve()),
                "items": text_list,
                "skipped": [],
                "blank_lines": blank,
            }

    index = _write_outputs(output, n, dim, fill, make_index)
    summary = {k: v for k, v in index.items() if k != "items"}
    summary["index"] = str(index_path_for(output))
    return summary
