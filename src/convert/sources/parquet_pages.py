"""One binary column of a parquet row group read page by page, for the hub's image column.

Arrow copies each image three to four times on its way out (the file read, the decompression, the
dictionary, the values); here it is copied once, by the decompression, and each image is a view of
the decompressed page. It reads only the layout that pyarrow, and so the hub's `datasets`, writes
for such a column, and checks it as it goes: data pages v1 whose values are PLAIN, or indices into
a PLAIN dictionary page; definition levels RLE-encoded; no repetition. Anything else (another page
kind or encoding, a codec Arrow's `decompress` lacks, a count that does not add up) gives None, and
the caller reads the row group with Arrow instead. Page headers are Thrift compact protocol
structs; tests/convert/test_parquet_pages.py checks every layout pyarrow writes against Arrow.

Each value comes with its RecordIO magic words (where a record holding it is cut into parts),
found right after its page is decompressed: the page is then in this core's cache, where the
writer, later and on another thread, would read every byte from memory once more for them.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from src.recordio import aligned_magic_offsets

# Page types and encodings, as the parquet format numbers them.
_DATA_PAGE, _DICTIONARY_PAGE = 0, 2
_PLAIN, _PLAIN_DICTIONARY, _RLE, _RLE_DICTIONARY = 0, 2, 3, 8
# Codecs by the name pyarrow's metadata gives, as pyarrow.decompress names them. LZ4 (Hadoop's
# framing) is left to Arrow.
_CODECS = {"SNAPPY": "snappy", "GZIP": "gzip", "ZSTD": "zstd", "BROTLI": "brotli", "LZ4_RAW": "lz4_raw"}
_U32 = struct.Struct("<I")


class PageValue(NamedTuple):
    """One value: a view of its decompressed page, and aligned_magic_offsets of it."""

    data: memoryview
    magic: list[int]


class _Unread(Exception):
    """The column chunk is not one this reader takes: Arrow reads it."""


def binary_leaf(md: pq.FileMetaData, schema: pa.Schema, column: str) -> tuple[int, int] | None:
    """(leaf index, max definition level) of the bytes of image column `column`: the column itself
    when it is binary, its `bytes` field when it is a struct; None when neither is a binary leaf
    outside any list (a string column, say, which Arrow's path refuses with its own reason)."""
    t = schema.field(column).type
    if pa.types.is_struct(t):
        t = t.field("bytes").type if t.get_field_index("bytes") >= 0 else None
    if t is None or not (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        return None
    for path in (f"{column}.bytes", column):
        for j in range(md.num_columns):
            leaf = md.schema.column(j)
            if leaf.path == path:
                if leaf.physical_type != "BYTE_ARRAY" or leaf.max_repetition_level != 0:
                    return None
                return j, leaf.max_definition_level
    return None


def read_binary_chunk(
    fd: int, chunk: pq.ColumnChunkMetaData, max_def: int, rows: int
) -> list[PageValue | None] | None:
    """Each row's value of a binary column chunk (None where null), or None when the chunk is not
    in the layout read here."""
    codec = _CODECS.get(chunk.compression)
    if codec is None and chunk.compression != "UNCOMPRESSED":
        return None
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    size = chunk.total_compressed_size
    if start is None or start < 0 or size <= 0:
        return None
    try:
        # A buffer of its own per chunk: uncompressed values are views of it. (One buffer reused
        # for compressed chunks measured slower, 107-137 against 84-105 us a row.)
        raw = memoryview(os.pread(fd, size, start))
        if len(raw) != size:
            return None
        values = _pages(raw, codec, max_def, rows)
    except (_Unread, ValueError, IndexError, OverflowError, struct.error, pa.ArrowException, OSError):
        return None  # Arrow reads it, and reports the row group if it cannot either
    return values if len(values) == rows else None


def _pages(raw: memoryview, codec: str | None, max_def: int, rows: int) -> list[PageValue | None]:
    dictionary: list[PageValue] | None = None
    values: list[PageValue | None] = []
    pos = 0
    while pos < len(raw):
        header, pos = _struct(raw, pos)
        kind, size, stored = header.get(1), header.get(2), header.get(3)
        if (
            not isinstance(size, int)
            or not isinstance(stored, int)
            or size < 0
            or stored < 0
            or pos + stored > len(raw)
        ):
            raise _Unread("page header")
        body = raw[pos : pos + stored]
        pos += stored
        page = body if codec is None else pa.decompress(body, size, codec=codec)
        page = memoryview(page).cast("B")  # unsigned bytes: Arrow's buffers come as signed
        if len(page) != size:
            raise _Unread("page size")
        if kind == _DICTIONARY_PAGE:
            info = header.get(7)
            if (
                dictionary is not None
                or not isinstance(info, dict)
                or info.get(2) not in (_PLAIN, _PLAIN_DICTIONARY)
            ):
                raise _Unread("dictionary page")
            dictionary, end = _plain(page, 0, info.get(1))
            if end != len(page):
                raise _Unread("dictionary page length")
        elif kind == _DATA_PAGE:
            values += _data_page(page, header.get(5), dictionary, max_def, rows - len(values))
        else:
            raise _Unread(f"page type {kind}")
    return values


def _data_page(
    page: memoryview, info: object, dictionary: list[PageValue] | None, max_def: int, left: int
) -> list[PageValue | None]:
    """The page's values; `left`: the rows of the chunk not yet read, the most a page may hold (a
    count is allocated for before it is read)."""
    if not isinstance(info, dict) or not isinstance(info.get(1), int) or not 0 <= info[1] <= left:
        raise _Unread("data page header")
    count, encoding = info[1], info.get(2)
    pos = 0
    present = np.ones(count, dtype=bool)
    if max_def > 0:
        if info.get(3) != _RLE or pos + 4 > len(page):
            raise _Unread("definition levels")
        length = _U32.unpack_from(page, pos)[0]
        pos += 4
        levels, _ = _rle_hybrid(page, pos, pos + length, max_def.bit_length(), count)
        if levels.max(initial=0) > max_def:
            raise _Unread("definition level")
        present = levels == max_def
        pos += length
    n = int(present.sum())
    if encoding == _PLAIN:
        found, _ = _plain(page, pos, n)
    elif encoding in (_RLE_DICTIONARY, _PLAIN_DICTIONARY) and dictionary is not None:
        width = page[pos]
        if width > 32:
            raise _Unread("index width")
        indices, _ = _rle_hybrid(page, pos + 1, len(page), width, n)
        if n and (indices.min() < 0 or indices.max() >= len(dictionary)):
            raise _Unread("dictionary index")
        found = [dictionary[i] for i in indices.tolist()]
    else:
        raise _Unread(f"encoding {encoding}")
    if n == count:
        return found
    out: list[PageValue | None] = [None] * count
    for i, value in zip(np.flatnonzero(present).tolist(), found):
        out[i] = value
    return out


def _plain(page: memoryview, pos: int, count: object) -> tuple[list[PageValue], int]:
    """`count` PLAIN byte arrays (a 4-byte length, then the bytes) from `pos`; and where they end."""
    if not isinstance(count, int) or count < 0:
        raise _Unread("value count")
    out = []
    for _ in range(count):
        length = _U32.unpack_from(page, pos)[0]
        pos += 4
        if pos + length > len(page):
            raise _Unread("byte array past the page")
        value = page[pos : pos + length]
        out.append(PageValue(value, aligned_magic_offsets(value)))
        pos += length
    return out, pos


def _rle_hybrid(buf: memoryview, pos: int, end: int, width: int, count: int) -> tuple[np.ndarray, int]:
    """`count` values of `width` bits in the RLE / bit-packed hybrid encoding, read from buf[pos:end]."""
    if end > len(buf):
        raise _Unread("levels past the page")
    out = np.empty(count, dtype=np.int64)
    weights = (1 << np.arange(width, dtype=np.int64)) if width else None
    value_bytes = (width + 7) // 8
    k = 0
    while k < count:
        if pos >= end:
            raise _Unread("runs end early")
        header, pos = _varint(buf, pos)
        if header & 1:  # bit-packed: groups of 8 values, least significant bit first
            size = (header >> 1) * width
            if pos + size > end:
                raise _Unread("bit-packed run past the end")
            if width:
                bits = np.unpackbits(np.frombuffer(buf, np.uint8, size, pos), bitorder="little")
                run = bits.reshape(-1, width).astype(np.int64) @ weights
            else:
                run = np.zeros((header >> 1) * 8, dtype=np.int64)
            take = min(len(run), count - k)
            out[k : k + take] = run[:take]
            pos += size
        else:  # one value repeated
            repeat = header >> 1
            if repeat == 0 or pos + value_bytes > end:
                raise _Unread("bad run")
            take = min(repeat, count - k)
            out[k : k + take] = int.from_bytes(buf[pos : pos + value_bytes], "little")
            pos += value_bytes
        k += take
    return out, pos


# --- Thrift compact protocol: just what page headers use -------------------------------------


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise _Unread("varint too long")


def _zigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def _struct(buf: memoryview, pos: int, depth: int = 0) -> tuple[dict, int]:
    """A struct as {field id: value}; nested structs as dicts, lists as lists, others skipped
    to None where a page header does not need them."""
    if depth > 8:
        raise _Unread("structs nested too deep")
    out: dict = {}
    field = 0
    while True:
        head = buf[pos]
        pos += 1
        if head == 0:
            return out, pos
        delta, kind = head >> 4, head & 0x0F
        if delta:
            field += delta
        else:
            raw, pos = _varint(buf, pos)
            field = _zigzag(raw)
        out[field], pos = _value(buf, pos, kind, depth)


def _value(buf: memoryview, pos: int, kind: int, depth: int) -> tuple[object, int]:
    # Every length read here is checked against the bytes left before anything loops over it: a
    # crafted header claiming 2^35 elements must be refused at once, not walked (each element of a
    # list or map takes at least one byte, a double eight).
    if kind in (1, 2):  # booleans carry their value in the type
        return kind == 1, pos
    if kind == 3:  # byte
        return buf[pos], pos + 1
    if kind in (4, 5, 6):  # i16, i32, i64
        raw, pos = _varint(buf, pos)
        return _zigzag(raw), pos
    if kind == 7:  # double
        return None, _skip(buf, pos, 8)
    if kind == 8:  # binary
        length, pos = _varint(buf, pos)
        return None, _skip(buf, pos, length)
    if kind in (9, 10, 11) and depth > 8:
        raise _Unread("containers nested too deep")
    if kind in (9, 10):  # list, set
        head = buf[pos]
        pos += 1
        size, item = head >> 4, head & 0x0F
        if size == 15:
            size, pos = _varint(buf, pos)
        _bound(buf, pos, size * (8 if item == 7 else 1))
        items = []
        for _ in range(size):
            value, pos = _element(buf, pos, item, depth + 1)
            items.append(value)
        return items, pos
    if kind == 11:  # map
        size, pos = _varint(buf, pos)
        if size:
            key_kind, value_kind = buf[pos] >> 4, buf[pos] & 0x0F
            pos += 1
            _bound(buf, pos, size * 2)
            for _ in range(size):
                _, pos = _element(buf, pos, key_kind, depth + 1)
                _, pos = _element(buf, pos, value_kind, depth + 1)
        return None, pos
    if kind == 12:
        return _struct(buf, pos, depth + 1)
    raise _Unread(f"thrift type {kind}")


def _element(buf: memoryview, pos: int, kind: int, depth: int) -> tuple[object, int]:
    """One element of a list or map: as a field's value, except that a boolean takes a byte."""
    if kind in (1, 2):
        _bound(buf, pos, 1)
        return buf[pos] == 1, pos + 1
    return _value(buf, pos, kind, depth)


def _bound(buf: memoryview, pos: int, length: int) -> None:
    if length < 0 or pos + length > len(buf):
        raise _Unread(f"a length of {length} bytes past the {len(buf) - pos} left")


def _skip(buf: memoryview, pos: int, length: int) -> int:
    _bound(buf, pos, length)
    return pos + length
