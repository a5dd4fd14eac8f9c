"""CSV / TSV / JSONL manifests: an image-path column and one or more caption columns.

Several caption columns (or a JSONL list of strings) give up to K captions per record:
an empty or missing cell costs that caption only, a row keeps the ones that say
something. A UTF-8 byte-order mark (Excel's "CSV UTF-8") is dropped. Relative image
paths are resolved against `--image-root` (default: the manifest's folder) and may not
escape it; absolute paths are taken as written, since the user wrote them.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from src.fsutil import printable

from ..items import BROKEN_ROW, MISSING_CAPTION, MISSING_IMAGE, UNDECODABLE_CAPTION, UNSAFE_PATH, Item, Unit
from .base import InputError, Source, expand

MANIFEST_EXTS = (".csv", ".tsv", ".jsonl", ".json")
# file_name: the metadata.csv of a Hugging Face image folder dataset.
IMAGE_COLUMNS = ("image", "image_path", "filepath", "file", "filename", "file_name", "path", "img", "jpg")
CAPTION_COLUMNS = ("caption", "captions", "text", "texts", "title")

csv.field_size_limit(1 << 28)
_SURROGATE = re.compile("[\ud800-\udfff]")


def _rows(path: Path) -> Iterator[tuple[int, dict | None, str]]:
    """(row number, row dict or None if unparsable, error text), streaming."""
    name = path.name.lower()
    # surrogateescape: a byte that is not UTF-8 survives as a lone surrogate, so an image path
    # written in another encoding still names its file, and a caption cell holding one is
    # reported (`_item`) instead of stored with replacement characters.
    with open(path, newline="", encoding="utf-8-sig", errors="surrogateescape") as f:
        if name.endswith((".jsonl", ".json")):
            row = 0
            for line in f:
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except ValueError as exc:
                    yield row, None, f"bad JSON: {exc}"
                else:
                    if isinstance(value, dict):
                        yield row, value, ""
                    else:
                        yield row, None, f"JSON line is a {type(value).__name__}, not an object"
                row += 1
        else:
            reader = csv.DictReader(f, delimiter="\t" if name.endswith(".tsv") else ",")
            for row, value in enumerate(reader):
                if None in value or any(v is None for v in value.values()):
                    yield row, None, "row has a different number of fields than the header"
                else:
                    yield row, value, ""


def _header(path: Path) -> list[str]:
    for _, value, _ in _rows(path):
        if value is not None:
            return list(value)
    return []


class ManifestSource(Source):
    kind = "manifest"
    uses = ("image_column", "caption_columns", "image_root")

    def __init__(self, paths: list[Path], options) -> None:
        super().__init__(paths, options)
        self._columns: dict[str, tuple[str, tuple[str, ...]]] = {}

    def units(self) -> list[Unit]:
        root = self.options.image_root
        if root and not Path(root).is_dir():
            raise InputError(
                f"--image-root {root}: no such folder; give the folder the manifest's image paths "
                "are relative to"
            )
        units = [
            Unit(i, str(p)) for i, p in enumerate(expand(self.paths, MANIFEST_EXTS, self.exclude, self.notes))
        ]
        for unit in units:  # wrong column names are found now, not after counting every row
            self.columns(Path(unit.path))
        return units

    def columns(self, path: Path) -> tuple[str, tuple[str, ...]]:
        """The (image column, caption columns) of one manifest; a missing column is fatal."""
        key = str(path)
        if key not in self._columns:
            names = _header(path)
            image = self.options.image_column or next((c for c in IMAGE_COLUMNS if c in names), None)
            caps = self.options.caption_columns or tuple(c for c in CAPTION_COLUMNS if c in names)[:1]
            if not image or image not in names:
                raise InputError(
                    f"{path}: no image column "
                    f"{'(' + image + ')' if image else 'among ' + ', '.join(IMAGE_COLUMNS)} in header "
                    f"[{', '.join(names)}]; name it with --image-column"
                )
            missing = [c for c in caps if c not in names]
            if not caps or missing:
                raise InputError(
                    f"{path}: caption column(s) "
                    f"{', '.join(missing) or 'among ' + ', '.join(CAPTION_COLUMNS)} not in header "
                    f"[{', '.join(names)}]; name them with --caption-columns"
                )
            self._columns[key] = (image, tuple(caps))
        return self._columns[key]

    def count(self, unit: Unit) -> int:
        return sum(1 for _ in _rows(Path(unit.path)))

    def items(self, unit: Unit, start: int = 0) -> Iterator[Item]:
        path = Path(unit.path)
        image_col, caption_cols = self.columns(path)
        root = Path(self.options.image_root or path.parent).resolve()
        for row, value, error in _rows(path):
            if row < start:
                continue
            ref = f"{path}:row {row}"
            if value is None:
                yield Item(row, ref, row=row, error=BROKEN_ROW, detail=error)
                continue
            yield self._item(row, ref, value, image_col, caption_cols, root)

    @staticmethod
    def _item(
        row: int, ref: str, value: dict, image_col: str, caption_cols: tuple[str, ...], root: Path
    ) -> Item:
        image = value.get(image_col)
        if not isinstance(image, str) or not image.strip():
            return Item(row, ref, row=row, error=MISSING_IMAGE, detail=f"empty {image_col!r}")
        image = image.strip()
        if "://" in image:
            return Item(
                row, ref, row=row, error=MISSING_IMAGE, detail=f"{image}: a URL; download images first"
            )
        if os.path.isabs(image):
            full = Path(image)
        else:
            full = Path(os.path.normpath(root / image))
            if full != root and root not in full.parents:
                return Item(row, ref, row=row, error=UNSAFE_PATH, detail=f"{image} escapes {root}")
        captions: list[str] = []
        missing = []
        for col in caption_cols:
            cap = value.get(col)
            if isinstance(cap, list):
                captions.extend(c if isinstance(c, str) else "" for c in cap)
            elif isinstance(cap, str):
                captions.append(cap)
            elif cap is None:  # a JSON null or absent key: like an empty cell
                missing.append(col)
            else:
                captions.append(str(cap))
        if len(missing) == len(caption_cols):
            return Item(
                row,
                f"{ref} ({full})",
                row=row,
                error=MISSING_CAPTION,
                detail=f"no {', '.join(map(repr, missing))}",
            )
        bad = next((c for c in captions if _SURROGATE.search(c)), None)
        if bad is not None:
            return Item(
                row,
                f"{ref} ({full})",
                row=row,
                error=UNDECODABLE_CAPTION,
                detail=f'caption "{printable(bad)[:60]}" is not UTF-8 text',
            )
        return Item(row, f"{ref} ({full})", image_path=str(full), captions=captions, row=row)
