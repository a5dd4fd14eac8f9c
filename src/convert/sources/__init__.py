"""Input readers, one class per input kind, and detection of the kind from the paths."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from src.errors import flag_of

from .base import FLAG_OPTIONS, IMAGE_EXTS, InputError, Source, SourceOptions, is_hidden
from .folder import FolderSource
from .manifest import MANIFEST_EXTS, ManifestSource
from .parquet import ParquetSource
from .webdataset import TAR_EXTS, WebDatasetSource

SOURCES: dict[str, type[Source]] = {
    cls.kind: cls for cls in (ParquetSource, FolderSource, ManifestSource, WebDatasetSource)
}

__all__ = ["SOURCES", "InputError", "Source", "SourceOptions", "detect_kind", "make_source"]


def _kind_of(path: Path) -> str:
    name = path.name.lower()
    if path.is_file():
        if name.endswith(".parquet"):
            return "parquet"
        if name.endswith(TAR_EXTS):
            return "webdataset"
        if name.endswith(MANIFEST_EXTS):
            return "manifest"
        raise InputError(f"{path}: cannot tell the input kind from the name; pass --format")
    if path.is_dir():
        # Look at the first level, then one below: enough to tell a hub download from an image tree.
        for pattern in ("*", "*/*"):
            names = [p.name.lower() for p in path.glob(pattern) if p.is_file() and not is_hidden(p, path)]
            if any(n.endswith(".parquet") for n in names):
                return "parquet"
            if any(n.endswith(TAR_EXTS) for n in names):
                return "webdataset"
            if any(n.endswith(IMAGE_EXTS) for n in names):
                return "folder"
        raise InputError(f"{path}: found no parquet, tar or image files in this folder; pass --format")
    raise InputError(f"{path}: no such file or folder; check the input path")


def detect_kind(paths: list[Path]) -> str:
    """The one input kind of all `paths`; mixing kinds in one run is an error."""
    if not paths:
        raise InputError("no inputs given; pass parquet files, tar files, manifests or an image folder")
    kinds = {str(p): _kind_of(p) for p in paths}
    if len(set(kinds.values())) > 1:
        listing = ", ".join(f"{p} ({k})" for p, k in kinds.items())
        raise InputError(f"inputs are of different kinds: {listing}; convert each kind in its own run")
    return next(iter(kinds.values()))


def check_distinct(paths: list[Path]) -> None:
    """Refuse an input given twice, or one inside another (a folder and a file in it):
    either would convert the same pairs twice, under different ids."""
    seen: dict[Path, Path] = {}
    for path in paths:
        real = path.resolve()
        if real in seen:
            raise InputError(f"{path} is given twice (also as {seen[real]}); give each input once")
        for other, given in seen.items():
            if other in real.parents:
                raise InputError(f"{path} is inside {given}, which is also an input; give only one of them")
            if real in other.parents:
                raise InputError(f"{given} is inside {path}, which is also an input; give only one of them")
        seen[real] = path


def check_options_apply(kind: str, options: SourceOptions) -> None:
    """Refuse a flag that `kind` would ignore: `--image-column` on an image folder, say."""
    for option in FLAG_OPTIONS:
        if getattr(options, option) and option not in SOURCES[kind].uses:
            value = getattr(options, option)
            shown = ",".join(value) if isinstance(value, tuple) else value
            applies = [k for k, cls in SOURCES.items() if option in cls.uses]
            raise InputError(
                f"{flag_of(option)} {shown} does not apply to {kind} input (only to {' and '.join(applies)} "
                f"input); leave it out, or check the input path and --format"
            )


def make_source(
    paths: list[Path],
    kind: str = "auto",
    options: SourceOptions | None = None,
    exclude: Callable[[Path], bool] | None = None,
) -> Source:
    """The reader for `paths`; files for which `exclude` is true (this run's own output files
    sitting among the inputs) are never read."""
    options = options or SourceOptions()
    for p in paths:
        if not p.exists():
            raise InputError(f"{p}: no such file or folder; check the input path")
        if not (p.is_file() or p.is_dir()):  # reading a FIFO would wait for a writer forever
            raise InputError(
                f"{p}: not a regular file or folder (a FIFO or a device); give the files or folders "
                "to convert"
            )
        if exclude is not None and p.is_file() and exclude(p):
            raise InputError(
                f"{p} is an output file of this run, not an input; give the files or folders to convert"
            )
    check_distinct(paths)
    if kind == "auto":
        kind = detect_kind(paths)
    if kind not in SOURCES:
        raise InputError(f"unknown input format {kind!r}; use one of: auto, {', '.join(SOURCES)}")
    check_options_apply(kind, options)
    source = SOURCES[kind](paths, options)
    if exclude is not None:
        source.exclude = exclude
    return source
