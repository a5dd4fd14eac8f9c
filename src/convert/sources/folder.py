"""A folder of images, each with a caption `.txt`: beside it (`a.jpg` + `a.txt`) or in a
parallel tree (`img/0001.jpg` + `captions/0001.txt`, the seed guide's layout).

Several captions per image are several files: `0001.txt`, `0001.1.txt`, `0001.2.txt`, ...
(numbered from 1, read until the first missing number). Where an image `0001.1.jpg`
exists too, `0001.1.txt` is that image's caption, not a second one of `0001.jpg`.
Hidden folders (`.hfd/`, `.git/`) and hidden files are not read. Linked folders are
followed (src/fsutil.py's walk_files: each real folder once, so cycles end).

The folder listing is sorted, so item order (and thus sample ids) depends only on the
file names, and it is cut into units of `folder_chunk` images so that several machines
can split one big folder.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from ..items import Item, Unit
from .base import IMAGE_EXTS, InputError, Source, list_tree

IMAGE_DIRS = ("img", "imgs", "image", "images")
CAPTION_DIRS = ("captions", "caption", "texts", "text", "txt")


def caption_candidates(root: Path, rel: str, caption_dir: str | None) -> list[str]:
    """Where the caption of image `root/rel` may be, most specific first."""
    stem = rel.rsplit(".", 1)[0]
    out: list[str] = []
    if caption_dir:
        out.append(os.path.join(caption_dir, stem + ".txt"))
    out.append(str(root / (stem + ".txt")))
    parts = stem.split("/")
    for i, part in enumerate(parts[:-1]):
        if part.lower() in IMAGE_DIRS:
            for cap in CAPTION_DIRS:
                out.append(str(root.joinpath(*parts[:i], cap, *parts[i + 1 :])) + ".txt")
    if root.name.lower() in IMAGE_DIRS:  # the user pointed at img/ itself
        for cap in CAPTION_DIRS:
            out.append(str(root.parent / cap / stem) + ".txt")
    return out


class FolderSource(Source):
    kind = "folder"
    uses = ("caption_dir",)

    def __init__(self, paths: list[Path], options) -> None:
        super().__init__(paths, options)
        self._listing: dict[str, list[str]] = {}
        self._stems: dict[str, set[str]] = {}

    def _list(self, root: str) -> list[str]:
        if root not in self._listing:
            self._listing[root], notes = list_tree(Path(root), IMAGE_EXTS)
            self.notes.extend(notes)
        return self._listing[root]

    def units(self) -> list[Unit]:
        units: list[Unit] = []
        chunk = max(1, self.options.folder_chunk)
        caption_dir = self.options.caption_dir
        if caption_dir and not Path(caption_dir).is_dir():
            raise InputError(
                f"--caption-dir {caption_dir}: no such folder; give the folder that holds the .txt captions"
            )
        for path in self.paths:
            if not path.is_dir():
                raise InputError(
                    f"{path}: not a folder; folder input needs a folder of images and .txt captions"
                )
            root = str(path)
            n = len(self._list(root))
            if n == 0:
                raise InputError(f"{path}: no image files ({', '.join(IMAGE_EXTS)}) in this folder")
            for start in range(0, n, chunk):
                units.append(Unit(len(units), root, start, min(n, start + chunk)))
        return units

    def signature(self, unit: Unit) -> str:
        names = "\n".join(self._list(unit.path)[unit.start : unit.stop])
        return hashlib.sha1(names.encode("utf-8", "surrogateescape")).hexdigest()

    def count(self, unit: Unit) -> int:
        assert unit.stop is not None
        return unit.stop - unit.start

    def items(self, unit: Unit, start: int = 0) -> Iterator[Item]:
        root = Path(unit.path)
        listing = self._list(unit.path)
        if unit.path not in self._stems:
            self._stems[unit.path] = {rel.rsplit(".", 1)[0] for rel in listing}
        stems = self._stems[unit.path]
        for pos in range(start, self.count(unit)):
            index = unit.start + pos
            rel = listing[index]
            numbered = rel.rsplit(".", 1)[0] + ".1" not in stems
            yield Item(
                pos,
                str(root / rel),
                image_path=str(root / rel),
                row=index,
                extra={
                    "caption_files": caption_candidates(root, rel, self.options.caption_dir),
                    "numbered": numbered,
                },
            )
