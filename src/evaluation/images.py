"""Image inputs of the evaluation CLIs: the one folder lister, and a loader that skips unreadable
files instead of ending the run.

A bad file among thousands (truncated, not an image, a decoder refusal) should cost one image,
not the evaluation; and with DataLoader workers an exception raised in a worker reaches the user
as a multi-line "Original Traceback". So each item is decoded inside a try: a failure becomes a
(position, reason) pair that the batch carries beside the good images, and the caller counts,
lists and leaves out those positions. zero_shot.py, retrieval.py and embed.py all read images
through `skipping_loader`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from src.errors import UserError
from src.evaluation.datasets import IMAGE_EXTENSIONS, EvalDataError, ImageDataset, ImageSource
from src.fsutil import printable, walk_files
from src.open_alip.paths import not_a_file

WANTED = "an image file"  # what a path named like an image must be (src/open_alip/paths.py's wording)


def find_images(
    folder: Path, option: str = "--images"
) -> tuple[list[tuple[str, Path]], list[tuple[str, str]]]:
    """(relative POSIX path, path) of every image file under `folder`, sorted by relative path;
    hidden files and folders left out, linked folders followed once (src/fsutil.py walk_files).
    And (relative path, why) of what the walk found named like an image that is not one to read: a
    FIFO, a device (or a link to one), a broken link, a folder named `x.jpg` (its images are read
    all the same), so that every such path is listed as skipped, never dropped unsaid."""
    folders: list[str] = []
    try:
        relative, _ = walk_files(folder, IMAGE_EXTENSIONS, folders_named_like=folders)
    except OSError as exc:
        raise EvalDataError(f"{option} {folder}: cannot list the folder ({exc.strerror or exc})") from None
    found, not_read = [], []
    for rel in relative:
        why = not_a_file(folder / rel, WANTED)
        if why is None:
            found.append((rel, folder / rel))
        else:
            not_read.append((rel, why))
    not_read += [(rel, f"is a folder, not {WANTED} (the images in it are read)") for rel in folders]
    if not found and not not_read:
        raise EvalDataError(
            f"{option} {folder}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in the folder or below it"
        )
    return found, sorted(not_read)


def list_images(paths: Sequence[Path | str]) -> tuple[list[Path], list[dict[str, str]]]:
    """Image files among `paths` (zero_shot.py --images): files as given, folders through
    `find_images`; and [{"image", "error"}] of the paths given or found that are no file to read
    (a path that is nothing at all is an error: a typo must not pass as a skip)."""
    found: list[Path] = []
    skipped: list[dict[str, str]] = []
    for path in map(Path, paths):
        if path.is_dir():
            images, not_read = find_images(path)
            found += [p for _, p in images]
            skipped += [{"image": str(path / rel), "error": why} for rel, why in not_read]
        elif path.is_file():
            found.append(path)
        elif os.path.lexists(path):
            skipped.append({"image": str(path), "error": not_a_file(path, WANTED) or "cannot be read"})
        else:
            raise EvalDataError(f"--images {path}: no such file or folder")
    if not found:
        first = skipped[0]
        raise EvalDataError(
            f"--images: none of the {len(skipped)} paths is an image file to read "
            f"(e.g. {first['image']} {first['error']})"
        )
    return found, skipped


def describe_failure(exc: BaseException) -> str:
    """One line saying why an image could not be read."""
    text = " ".join(str(exc).split())[:300]
    return text if isinstance(exc, UserError) else f"{type(exc).__name__}: {text}"


class SkippingImages(ImageDataset):
    """ImageDataset whose items are (image or None, label, position, reason or None)."""

    def __getitem__(self, index: int):  # type: ignore[override]
        try:
            image, label = super().__getitem__(index)
        except (
            Exception
        ) as exc:  # any decoder failure (OSError, DecompressionBombError, ...) means "unreadable"
            return None, -1, index, describe_failure(exc)
        return image, label, index, None


@dataclass
class Batch:
    """Preprocessed images (one stacked float tensor), their labels and positions in the input list,
    and the (position, reason) pairs of the items of this batch that could not be read."""

    images: torch.Tensor | None
    labels: torch.Tensor
    positions: list[int]
    failed: list[tuple[int, str]]


def _collate(items: list) -> Batch:
    good = [(img, label, i) for img, label, i, err in items if err is None]
    failed = [(i, err) for _, _, i, err in items if err is not None]
    images: torch.Tensor | None = None
    if good:
        images = torch.stack([img for img, _, _ in good])
    labels = torch.tensor([label for _, label, _ in good], dtype=torch.long)
    return Batch(images, labels, [i for _, _, i in good], failed)


# What result files record as "preprocessing" for images read through `skipping_loader`.
PIL_PREPROCESSING = "PIL: bicubic resize of the shorter side, centre crop, CLIP mean/std (CPU loader workers)"


def skipping_loader(
    images: Sequence[ImageSource],
    labels: Sequence[int] | None,
    input_size: int,
    batch_size: int,
    device: torch.device | str = "cpu",
    workers: int = 0,
) -> torch.utils.data.DataLoader:
    """Batches (`Batch`) of `images`, preprocessed with PIL in the loader's workers on every
    device: a GPU-side resize differs from PIL's by a few grey levels, enough to change top-1
    predictions, so the device must not decide the pixels (`PIL_PREPROCESSING`)."""
    on_device = torch.device(device).type == "cuda"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    dataset = SkippingImages(images, labels, size=input_size)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=max(0, min(workers, cores)),
        collate_fn=_collate,
        pin_memory=on_device,
    )


def skipped_list(images: Sequence[ImageSource], failed: Sequence[tuple[int, str]]) -> list[dict[str, str]]:
    """[{"image", "error"}] of the failed positions, in input order (what result files record)."""
    return [{"image": str(images[i]), "error": why} for i, why in sorted(failed)]


def skip_notice(prefix: str, skipped: Sequence[dict[str, str]], limit: int = 5) -> str:
    """The CLIs' lines about skipped images: the count, then up to `limit` of them by name."""
    lines = [f"{prefix} skipped {len(skipped)} unreadable image(s):"]
    lines += [f"{prefix}   {s['image']}: {s['error']}" for s in skipped[:limit]]
    if len(skipped) > limit:
        lines.append(f"{prefix}   ... and {len(skipped) - limit} more")
    return printable("\n".join(lines))  # a file name that is not UTF-8, as the result files show it
