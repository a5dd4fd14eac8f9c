"""Parquet shards as the hub publishes YFCC15M: `images` {bytes, path} + `texts` list<float32> tokens.

Rows are streamed one record batch at a time, so a 750 MB shard never sits in memory
whole. Image bytes and token floats are passed through untouched; a string (or
list<string>) caption column is also accepted and then tokenised by the worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..items import BROKEN_INPUT, BROKEN_ROW, Item, Unit
from .base import InputError, Source, UnreadableUnit, expand
from .parquet_pages import PageValue, binary_leaf, read_binary_chunk

IMAGE_COLUMNS = ("images", "image", "jpg", "img")
TEXT_COLUMNS = ("texts", "text", "tokens", "caption", "captions")
BATCH_ROWS = 256


def _pick(schema: pa.Schema, wanted: str | None, defaults: tuple[str, ...], what: str, path: Path) -> str:
    names = schema.names
    if wanted:
        if wanted not in names:
            raise InputError(f"{path}: no {what} column {wanted!r} (columns: {', '.join(names)})")
        return wanted
    for name in defaults:
        if name in names:
            return name
    raise InputError(
        f"{path}: no {what} column among {', '.join(defaults)} (columns: {', '.join(names)}); "
        f"name it with --{'image-column' if what == 'image' else 'caption-columns'}"
    )


def _image_views(col: pa.Array) -> list[memoryview | None]:
    """Each row's image as a view of the batch's buffer: no copy (a 64 KB copy per row, made
    holding the GIL, was a fifth of a row's cost); a view keeps the batch's buffer alive."""
    nulls = col.is_null().to_pylist()
    if pa.types.is_struct(col.type):
        if col.type.get_field_index("bytes") < 0:
            raise ValueError(f"image struct has no 'bytes' field ({col.type})")
        child = col.field("bytes")  # a null struct hides whatever its child holds
        nulls = [a or b for a, b in zip(nulls, child.is_null().to_pylist())]
        col = child
    if not (pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type)):
        raise ValueError(f"image column has type {col.type}, expected binary or struct<bytes, path>")
    _, offsets, data = col.buffers()
    kind = np.int64 if pa.types.is_large_binary(col.type) else np.int32
    ends = np.frombuffer(offsets, kind, len(col) + 1, col.offset * np.dtype(kind).itemsize).tolist()
    view = memoryview(data if data is not None else b"").cast("B")  # unsigned bytes: Arrow's format is "b"
    return [None if null else view[ends[i] : ends[i + 1]] for i, null in enumerate(nulls)]


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:300]


class ParquetSource(Source):
    kind = "parquet"
    uses = ("image_column", "caption_columns")

    def units(self) -> list[Unit]:
        return [
            Unit(i, str(p)) for i, p in enumerate(expand(self.paths, (".parquet",), self.exclude, self.notes))
        ]

    def count(self, unit: Unit) -> int:
        try:
            return pq.ParquetFile(unit.path).metadata.num_rows
        except Exception as exc:  # not parquet, truncated footer, unreadable: how many rows is unknown
            raise UnreadableUnit(f"cannot open parquet: {_one_line(exc)}") from None

    def items(self, unit: Unit, start: int = 0) -> Iterator[Item]:
        path = Path(unit.path)
        try:
            pf = pq.ParquetFile(path)
        except Exception as exc:  # count() said so first, unless the file changed since
            raise UnreadableUnit(f"cannot open parquet: {_one_line(exc)}") from None
        schema = pf.schema_arrow
        wanted_text = self.options.caption_columns[0] if self.options.caption_columns else None
        try:
            image_col = _pick(schema, self.options.image_column, IMAGE_COLUMNS, "image", path)
            text_col = _pick(schema, wanted_text, TEXT_COLUMNS, "caption", path)
        except InputError as exc:  # one odd file among many must not end the run; each of its rows counts
            for row in range(start, pf.metadata.num_rows):
                yield Item(row, f"{path}:row {row}", row=row, error=BROKEN_INPUT, detail=str(exc))
            return
        leaf = binary_leaf(pf.metadata, schema, image_col)
        with open(path, "rb") as raw:
            first_row = 0
            for rg in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(rg).num_rows
                if first_row + n <= start:
                    first_row += n
                    continue
                images = None
                if leaf is not None:  # the page reader, else Arrow (see parquet_pages)
                    images = read_binary_chunk(
                        raw.fileno(), pf.metadata.row_group(rg).column(leaf[0]), leaf[1], n
                    )
                yield from self._row_group(pf, rg, first_row, n, image_col, text_col, start, path, images)
                first_row += n

    def _row_group(
        self,
        pf: pq.ParquetFile,
        rg: int,
        first_row: int,
        n: int,
        image_col: str,
        text_col: str,
        start: int,
        path: Path,
        images: list[PageValue | None] | None,
    ) -> Iterator[Item]:
        """The row group's items; `images`: its images already read (parquet_pages), else None
        and Arrow reads them with the captions."""
        row = first_row
        columns = [text_col] if images is not None else [image_col, text_col]
        try:
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, row_groups=[rg], columns=columns):
                if images is None:
                    batch_images: list = _image_views(batch.column(0))
                else:
                    batch_images = images[row - first_row : row - first_row + batch.num_rows]
                texts = _Texts(batch.column(batch.num_columns - 1))
                for i, image in enumerate(batch_images):
                    if row >= start:
                        image, magic = image if isinstance(image, PageValue) else (image, None)
                        item = texts.item(row, f"{path}:row {row}", image, i)
                        item.image_magic = magic
                        yield item
                    row += 1
        except Exception as exc:  # a corrupt page: the rest of this row group is lost, the file is not
            for r in range(max(row, start), first_row + n):
                yield Item(r, f"{path}:row {r}", row=r, error=BROKEN_ROW, detail=f"row group {rg}: {exc}")


class _Texts:
    """One batch's caption column, converted once (per-row pyarrow scalars cost microseconds each)."""

    def __init__(self, col: pa.Array) -> None:
        if pa.types.is_fixed_size_list(col.type):
            col = col.cast(pa.list_(col.type.value_type))
        t = col.type
        self.valid = (~np.asarray(col.is_null().to_numpy(zero_copy_only=False))).tolist()
        self.kind, self.col = "other", col
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            vt = t.value_type
            if pa.types.is_string(vt) or pa.types.is_large_string(vt):
                self.kind, self.values = "strings", col.to_pylist()
            elif pa.types.is_floating(vt) or pa.types.is_integer(vt):
                self.kind = "tokens"
                col = col.cast(pa.list_(pa.float32())) if not pa.types.is_large_list(t) else col
                flat = col.values
                self.offsets = np.asarray(col.offsets.to_numpy(zero_copy_only=False)).tolist()
                self.flat = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float32)
                self.null_ids = (
                    np.asarray(flat.is_null().to_numpy(zero_copy_only=False)) if flat.null_count else None
                )
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            self.kind, self.values = "string", col.to_pylist()

    def item(self, row: int, ref: str, image: memoryview | None, i: int) -> Item:
        if image is None:
            return Item(row, ref, row=row, error=BROKEN_ROW, detail="image is null")
        if not self.valid[i]:
            return Item(row, ref, row=row, image=image, error=BROKEN_ROW, detail="caption is null")
        if self.kind == "tokens":
            a, b = self.offsets[i], self.offsets[i + 1]
            if self.null_ids is not None and self.null_ids[a:b].any():
                return Item(row, ref, row=row, image=image, error=BROKEN_ROW, detail="null token id")
            # A view of the batch's values (the checks copy them: check_chunk_tokens joins a chunk's
            # rows, check_tokens copies one row).
            return Item(row, ref, row=row, image=image, tokens=self.flat[a:b])
        if self.kind == "strings":
            return Item(row, ref, row=row, image=image, captions=[c or "" for c in self.values[i]])
        if self.kind == "string":
            return Item(row, ref, row=row, image=image, captions=[self.values[i]])
        return Item(
            row, ref, row=row, image=image, error=BROKEN_ROW, detail=f"caption column type {self.col.type}"
        )
