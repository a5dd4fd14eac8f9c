"""What every input kind provides: its units, their item counts, and the items themselves."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from src.errors import UserError
from src.fsutil import walk_files

from ..items import Item, Unit

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")


class InputError(UserError):
    """The inputs cannot be converted at all (wrong kind, missing, unreadable): a fatal, user-facing error."""


class UnreadableUnit(Exception):
    """`Source.count` of a unit that cannot be read at all, so that how many rows it holds is
    unknown (a parquet file whose footer is gone): counting it as one skipped row would let a lost
    file pass as a small loss. The run converts the other units and then fails, naming it."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True)
class SourceOptions:
    """How to find images and captions in inputs whose layout is not fixed."""

    image_column: str | None = None  # manifest / parquet column holding the image (path or bytes)
    caption_columns: tuple[str, ...] = ()  # manifest / parquet columns holding captions or tokens
    image_root: str | None = None  # where relative manifest paths point (default: the manifest's folder)
    caption_dir: str | None = None  # folder inputs: a tree of .txt captions mirroring the image tree
    folder_chunk: int = 10_000  # images per unit of a folder input


# The SourceOptions a user sets by flag, each data2rec.py's flag_of(name) (src/errors.py).
FLAG_OPTIONS = ("image_column", "caption_columns", "image_root", "caption_dir")


class Source(ABC):
    """One input kind. A new kind of input is one new subclass registered in `sources/__init__.py`."""

    kind: ClassVar[str]
    # The SourceOptions fields this kind reads; make_source refuses the others when they are set
    # (a flag silently ignored looks like it worked).
    uses: ClassVar[tuple[str, ...]] = ()

    def __init__(self, paths: list[Path], options: SourceOptions) -> None:
        self.paths = paths
        self.options = options
        # Things the user should know about the input that are no item's skip (a linked folder
        # not read twice); the run prints them and keeps them in its report.
        self.notes: list[str] = []
        # Files never to read as input: the run's own outputs when they sit among the inputs.
        self.exclude: Callable[[Path], bool] = lambda path: False

    @abstractmethod
    def units(self) -> list[Unit]:
        """Every unit of the full input, in a fixed order (the same on every machine)."""

    @abstractmethod
    def count(self, unit: Unit) -> int:
        """How many items `items(unit)` yields, bad ones included; must be cheap where possible.
        Raises UnreadableUnit when the unit cannot be read and its item count is unknown."""

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


def list_tree(root: Path, suffixes: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """src/fsutil.py's walk_files (links followed, each real folder once, hidden ones left out),
    with a folder that cannot be read as an InputError."""
    try:
        return walk_files(root, suffixes)
    except OSError as exc:
        raise InputError(
            f"{exc.filename or root}: cannot read this folder ({exc.strerror or exc}); fix its "
            "permissions or move it out of the input"
        ) from None


def expand(
    paths: list[Path],
    suffixes: tuple[str, ...],
    exclude: Callable[[Path], bool] = lambda p: False,
    notes: list[str] | None = None,
) -> list[Path]:
    """Files given directly, plus matching files found (recursively, following links, sorted) in
    given folders, leaving out hidden folders, `exclude`d files and anything not a file; the
    linked folders not read (see walk_files) are added to `notes`."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            names, skipped = list_tree(path, suffixes)
            if notes is not None:
                notes.extend(skipped)
            # Sorted as paths (by their parts), the order every earlier run used: ids depend on it.
            found = sorted(p for p in (path / n for n in names) if p.is_file() and not exclude(p))
            if notes is not None:  # a FIFO, device or broken link named like an input: never opened, but said
                notes.extend(
                    f"{p}: "
                    f"{'not a regular file (a FIFO, socket or device)' if p.exists() else 'a broken link'}; "
                    "not read"
                    for p in sorted(path / n for n in names)
                    if not p.is_file()
                )
            if not found:
                raise InputError(f"{path}: folder holds no {'/'.join(suffixes)} files")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise InputError(f"{path}: no such file or folder; check the input path")
    return out
