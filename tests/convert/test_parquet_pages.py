"""The page reader of the hub's image column (src/convert/sources/parquet_pages.py) against Arrow.

For every layout pyarrow writes (codecs, dictionary or not, dictionary fallback part-way, page
versions, many small pages, nulls at both levels, empty values, binary and large_binary, struct or
not), each row group's values are Arrow's, byte for byte, or the reader declines (None) and Arrow
reads the row group. The hub's own layout must be read by pages, not declined.
"""

import itertools
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from src.convert import ConvertOptions, ImageOptions, convert
from src.convert.sources import parquet_pages
from src.convert.sources.parquet_pages import binary_leaf, read_binary_chunk
from src.recordio import MAGIC_BYTES, aligned_magic_offsets
from tests._data2rec_helpers import jpeg


def _values(rng: np.random.Generator, n: int) -> list[bytes | None]:
    out: list[bytes | None] = []
    for i in range(n):
        pick = rng.random()
        if pick < 0.1:
            out.append(None)
        elif pick < 0.15:
            out.append(b"")
        else:
            data = bytearray(rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8).tobytes())
            if i % 7 == 0:  # RecordIO's magic word, for the converter test
                at = int(rng.integers(0, len(data))) & ~3
                data[at : at + 4] = MAGIC_BYTES[: len(data) - at]
            out.append(bytes(data))
    return out


def _table(values: list[bytes | None], kind: str, struct_nulls: bool) -> pa.Table:
    if kind == "struct":
        image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
        rows = [
            None if (struct_nulls and i % 11 == 3) else {"bytes": v, "path": None}
            for i, v in enumerate(values)
        ]
        images = pa.array(rows, image_type)
    else:
        images = pa.array(values, pa.large_binary() if kind == "large_binary" else pa.binary())
    texts = pa.array([[49406.0, 1.0, 49407.0] + [0.0] * 74] * len(values), pa.list_(pa.float32()))
    return pa.table({"images": images, "texts": texts})


def _arrow_values(pf: pq.ParquetFile, rg: int) -> list[bytes | None]:
    col = pf.read_row_group(rg, columns=["images"]).column(0).combine_chunks()
    if pa.types.is_struct(col.type):
        children = col.field("bytes").to_pylist()
        return [None if s is None else c for s, c in zip(col.to_pylist(), children)]
    return col.to_pylist()


WRITES = {
    "codec": ["snappy", "zstd", "gzip", "brotli", "lz4", "none"],
    "use_dictionary": [True, False],
    "data_page_version": ["1.0", "2.0"],
    "pages": ["default", "small"],  # small: many data pages per chunk, the dictionary abandoned part-way
}


@pytest.mark.parametrize("kind", ["struct", "binary", "large_binary"])
def test_each_layout_is_read_as_arrow_reads_it_or_left_to_arrow(tmp_path, kind):
    rng = np.random.default_rng(1)
    values = _values(rng, 230)
    read_by_pages = []
    for codec, dictionary, version, pages in itertools.product(*WRITES.values()):
        path = tmp_path / f"{kind}-{codec}-{dictionary}-{version}-{pages}.parquet"
        small = (
            {"data_page_size": 2000, "dictionary_pagesize_limit": 6000, "write_batch_size": 10}
            if pages == "small"
            else {}
        )
        pq.write_table(
            _table(values, kind, struct_nulls=True),
            path,
            compression=codec,
            use_dictionary=dictionary,
            data_page_version=version,
            row_group_size=100,
            **small,
        )
        pf = pq.ParquetFile(path)
        leaf = binary_leaf(pf.metadata, pf.schema_arrow, "images")
        assert leaf is not None
        fd = os.open(path, os.O_RDONLY)
        try:
            # Every row group read before any is compared: a value that were a view of a buffer
            # used again would have changed by then.
            got = [
                read_binary_chunk(
                    fd, pf.metadata.row_group(rg).column(leaf[0]), leaf[1], pf.metadata.row_group(rg).num_rows
                )
                for rg in range(pf.metadata.num_row_groups)
            ]
        finally:
            os.close(fd)
        for rg, read in enumerate(got):
            if read is not None:
                assert [None if v is None else bytes(v.data) for v in read] == _arrow_values(pf, rg), (
                    path.name,
                    rg,
                )
                # Each value's magic words, found in its page, are where a record holding it is cut.
                assert [v.magic for v in read if v is not None] == [
                    aligned_magic_offsets(bytes(v.data)) for v in read if v is not None
                ], (path.name, rg)
                read_by_pages.append((codec, dictionary, version, pages))
    # The hub's layout (pyarrow's defaults, what `datasets` writes) and plain pages are read here.
    assert ("snappy", True, "1.0", "default") in read_by_pages
    assert ("snappy", False, "1.0", "small") in read_by_pages
    assert ("none", True, "1.0", "small") in read_by_pages


def test_a_damaged_chunk_is_left_to_arrow_or_read_as_arrow_reads_it(tmp_path):
    rng = np.random.default_rng(2)
    path = tmp_path / "hub.parquet"
    pq.write_table(
        _table(_values(rng, 100), "struct", struct_nulls=False), path, row_group_size=100, compression="none"
    )
    pf = pq.ParquetFile(path)
    leaf = binary_leaf(pf.metadata, pf.schema_arrow, "images")
    chunk = pf.metadata.row_group(0).column(leaf[0])
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    data = path.read_bytes()
    for at in rng.integers(start, start + chunk.total_compressed_size, 60).tolist():
        damaged = tmp_path / "damaged.parquet"
        damaged.write_bytes(data[:at] + bytes([data[at] ^ 0xA5]) + data[at + 1 :])
        fd = os.open(damaged, os.O_RDONLY)
        try:
            got = read_binary_chunk(fd, chunk, leaf[1], 100)
        finally:
            os.close(fd)
        if got is not None:  # what the page reader takes, Arrow reads the same
            assert [None if v is None else bytes(v.data) for v in got] == _arrow_values(
                pq.ParquetFile(damaged), 0
            ), at


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


# Thrift compact headers whose lengths claim far more than the bytes that follow (a boolean in a map
# or list takes one byte, a double eight, and a double's bytes are never read), and lists nested past
# any depth a page header has.
CRAFTED_HEADERS = {
    "list of doubles": b"\x19\xf7" + _varint(2**35),
    "list of binaries": b"\x19\xf8" + _varint(2**35) + b"\x00",
    "map of booleans": b"\x1b" + _varint(2**35) + b"\x11",
    "binary": b"\x18" + _varint(2**35),
    "lists nested 16 deep": b"\x19" * 16,
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("what", sorted(CRAFTED_HEADERS))
def test_a_length_in_a_page_header_is_bounded_by_the_bytes_left(tmp_path, what):
    # Once: minutes at 100% CPU and growing memory, where Arrow refuses the file at once. Now the
    # page reader refuses the header, Arrow refuses the row group, and its rows are skipped with the reason.
    path = tmp_path / "hub.parquet"
    pq.write_table(
        _table(_values(np.random.default_rng(3), 20), "struct", struct_nulls=False),
        path,
        row_group_size=20,
        compression="none",
    )
    pf = pq.ParquetFile(path)
    leaf = binary_leaf(pf.metadata, pf.schema_arrow, "images")
    chunk = pf.metadata.row_group(0).column(leaf[0])
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    data = path.read_bytes()
    _, end = parquet_pages._struct(memoryview(data), start)  # the page header as written
    crafted = CRAFTED_HEADERS[what]
    assert len(crafted) <= end - start
    path.write_bytes(data[:start] + crafted + bytes(end - start - len(crafted)) + data[end:])  # same length
    with pytest.raises(parquet_pages._Unread):
        parquet_pages._struct(memoryview(crafted + bytes(8)), 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_binary_chunk(fd, chunk, leaf[1], 20) is None  # left to Arrow
    finally:
        os.close(fd)
    from src.convert.sources import make_source

    source = make_source([path], "parquet")
    items = list(source.items(source.units()[0]))
    assert len(items) == 20 and {i.error for i in items} == {"broken_row"}
    assert items[0].detail.startswith("row group 0: ")


def test_containers_nested_past_any_page_header_are_refused_not_recursed():
    with pytest.raises(parquet_pages._Unread, match="nested too deep"):  # once a RecursionError
        parquet_pages._struct(memoryview(b"\x19" * 5001 + bytes(8)), 0)


def test_a_value_count_past_the_row_groups_rows_is_refused_before_anything_is_allocated():
    # A data page header claiming 2^40 values (once a MemoryError, where a smaller claim took the
    # machine's memory): a page holds at most the rows of its row group not yet read.
    def i32(field_delta: int, value: int) -> bytes:
        return bytes([field_delta << 4 | 6]) + _varint(value << 1)  # zigzag of a non-negative number

    body = bytes(8)
    data_page = i32(1, 2**40) + i32(1, 0) + i32(1, 3) + b"\x00"  # num_values, PLAIN, RLE levels
    header = i32(1, 0) + i32(1, len(body)) + i32(1, len(body)) + b"\x2c" + data_page + b"\x00"
    with pytest.raises(parquet_pages._Unread, match="data page header"):
        parquet_pages._pages(memoryview(header + body), None, 1, 20)


def test_other_columns_are_left_to_arrow(tmp_path):
    path = tmp_path / "other.parquet"
    table = pa.table(
        {"images": pa.array([[b"a"], [b"b"]], pa.list_(pa.binary())), "texts": pa.array(["x", "y"])}
    )
    pq.write_table(table, path)
    pf = pq.ParquetFile(path)
    assert binary_leaf(pf.metadata, pf.schema_arrow, "images") is None  # a list of images
    assert binary_leaf(pf.metadata, pf.schema_arrow, "texts") is None  # strings: Arrow's path names the type


def _with_magic(image: bytes, at: int) -> bytes:
    """`image` with RecordIO's magic word at byte `at` (8 or more), in a comment segment after SOI."""
    filler = b"x" * (at - 6)
    return (
        image[:2] + b"\xff\xfe" + (2 + len(filler) + 4).to_bytes(2, "big") + filler + MAGIC_BYTES + image[2:]
    )


def test_the_converter_writes_the_same_shards_with_arrow_alone(tmp_path, monkeypatch):
    rng = np.random.default_rng(3)
    # With the magic word where the record is cut (aligned) and where it is not, in small images
    # and in ones large enough for the numpy scan: the page reader finds the words, Arrow's path
    # leaves them to the writer.
    magic = [
        _with_magic(jpeg(w, h, seed=50 + w, quality=100), at)
        for w, h in ((32, 24), (160, 120))
        for at in (8, 9, 12)
    ]
    assert max(map(len, magic)) >= 8192 and all(aligned_magic_offsets(m) in ([], [8], [12]) for m in magic)
    images = [jpeg(32, 24, seed=i) for i in range(40)] + magic + [b"not a jpeg", None]
    table = _table(images, "struct", struct_nulls=False)
    for i in range(3):
        pq.write_table(table, tmp_path / f"train-{i}.parquet", row_group_size=int(rng.integers(5, 20)))
    inputs = sorted(tmp_path.glob("*.parquet"))
    opts = ConvertOptions(
        image=ImageOptions(), workers=1, shard_size=50, progress=False, max_skip_fraction=None
    )
    by_pages = convert(inputs, tmp_path / "pages" / "out", opts)
    monkeypatch.setattr(parquet_pages, "read_binary_chunk", lambda *a: None)
    monkeypatch.setattr("src.convert.sources.parquet.read_binary_chunk", lambda *a: None)
    by_arrow = convert(inputs, tmp_path / "arrow" / "out", opts)
    assert by_pages["written"] == by_arrow["written"] == 138
    assert by_pages["skipped_by_reason"] == by_arrow["skipped_by_reason"]
    for name in sorted(p.name for p in (tmp_path / "pages").glob("out-*")):
        assert (tmp_path / "pages" / name).read_bytes() == (tmp_path / "arrow" / name).read_bytes(), name
