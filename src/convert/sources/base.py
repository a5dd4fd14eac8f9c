"""What every input kind provides: its units, their item counts, and the items themselves."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from src.errors import UserError

from ..items import Item, Unit

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")


class InputError(UserError):
    """The inputs cannot be converted at all (wrong kind, missing, unreadable): a fatal, user-facing error."""


@dataclass(frozen=True)
class SourceOptions:
    """How to find images and captions in inputs whose layout is not fixed."""

    image_column: str | None = None  # manifest / parquet column holding the image (path or bytes)
    caption_columns: tuple[str, ...] = ()  # manifest / parquet columns holding captions or tokens
    image_root: str | None = None  # where relative manifest paths point (default: the manifest's folder)
    caption_dir: str | None = None  # folder inputs: a tree of .txt captions mirroring the image tree
    folder_chunk: int = 10_000  # images per unit of a folder input


class Source(ABC):
    """One input kind. A new kind of input is one new subclass registered in `sources/__init__.py`."""

    kind: ClassVar[str]

    def __init__(self, paths: list[Path], options: SourceOptions) -> None:
        self.paths = paths
        self.options = options
        # Files never to read as input: the run's own outputs when they sit among the inputs.
        self.exclude: Callable[[Path], bool] = lambda path: False

    @abstractmethod
    def units(self) -> list[Unit]:
        """Every unit of the full input, in a fixed order (the same on every machine)."""

    @abstractmethod
    def count(self, unit: Unit) -> int:
        """How many items `items(unit)` yields, bad ones included; must be cheap where possible."""

    @abstractmethod
    def items(self, unit: Unit, start: int = 0) -> Iterator[Item]:
        """The unit's items from position `start` on, in order, each with its `pos`."""

    def signature(self, unit: Unit) -> str:
        """Changes when the unit's content changes in a way a resumed run must notice (its size)."""
        try:
            return str(Path(unit.path).stat().st_size)
        except OSError:
            return "missing"


def is_hidden(path: Path, root: Path) -> bool:
    """True for anything under a dot-folder (or a dot-file) below `root`: `.hfd/incomplete/`
    holds hfd.sh's partial downloads, `.git/` and `.cache/` hold no inputs either."""
    return any(part.startswith(".") for part in path.relative_to(root).parts)


def expand(paths: list[Path], suffixes: tuple[str, ...], exclude: Callable[[Path], bool] = lambda p: False) -> list[Path]:
    """Files given directly, plus matching files found (recursively, sorted) in given folders,
    leaving out hidden folders and `exclude`d files."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.lower().endswith(suffixes)
                           and not is_hidden(p, path) and not exclude(p))
            if not found:
                raise InputError(f"{path}: folder holds no {'/'.join(suffixes)} files")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise InputError(f"{path}: no such file or folder; check the input path")
    return out
