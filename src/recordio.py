"""MXNet-compatible RecordIO (`.rec` + `.idx`) without MXNet.

A drop-in for `mxnet.recordio` 1.9.1: the same names, argument order and
results, and files that are byte-identical to the ones MXNet writes for the
same calls (the on-disk layout, multi-part records included, is described in
docs/formats.md section 1). Scripts switch by changing one import::

    from src import recordio  # instead of: from mxnet import recordio

Differences from MXNet, all on inputs MXNet mishandles:

* Truncated or corrupt `.rec`/`.idx` data raises `RecordIOError` (a
  `ValueError`) naming the file and byte offset (or index line) instead of
  aborting in C++ or returning a short record.
* The objects are context managers.
* Pickling an open writer raises `TypeError` (MXNet would reopen it with 'w'
  and truncate what was written); pickled readers reopen at the start, as in
  MXNet.
* Blank lines in an `.idx` file are skipped.

Extra helpers for the converter and the loaders: `read_index`,
`read_index_arrays`, `write_index`, `iter_records` and `read_record_at`, and
the magic number that starts every part (`MAGIC`, `MAGIC_BYTES` as on disk).
"""

from __future__ import annotations

import io
import numbers
import os
import struct
import warnings
from collections import namedtuple
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

import numpy as np

from src.errors import UserError
from src.fsutil import atomic_open

__all__ = [
    "MAGIC",
    "MAGIC_BYTES",
    "IRHeader",
    "MXIndexedRecordIO",
    "MXRecordIO",
    "RecordIOError",
    "iter_records",
    "pack",
    "pack_head",
    "pack_img",
    "pack_label_head",
    "read_index",
    "read_index_arrays",
    "read_record_at",
    "unpack",
    "unpack_img",
    "write_index",
]

MAGIC = 0xCED7230A
MAGIC_BYTES = struct.pack("<I", MAGIC)
_PART_HEADER = struct.Struct("<II")
_LENGTH_MASK = (1 << 29) - 1
_MAX_RECORD = 1 << 29
_PADDING = (b"", b"\0\0\0", b"\0\0", b"\0")  # indexed by length % 4

# cflag values of a part: whole record, first, middle and last part of a split record.
_WHOLE, _FIRST, _MIDDLE, _LAST = 0, 1, 2, 3

# write_parts holds payloads at least this long (at most _GATHER_PARTS parts, _WRITE_BUFFER bytes)
# and writes them with one writev, instead of copying each into the file's buffer first.
_GATHER_MIN = 16384
_GATHER_PARTS = 512  # under IOV_MAX (1024 on Linux)

# Records at least this long are scanned for magic words with numpy, shorter ones with bytes.find.
_NUMPY_SCAN_MIN = 8192

# Writes go through a large buffer: records are small and many, syscalls are not free.
_WRITE_BUFFER = 1 << 20


class RecordIOError(UserError):
    """A `.rec` or `.idx` file (or a packed record) is truncated or corrupt."""


IRHeader = namedtuple("HEADER", ["flag", "label", "id", "id2"])
IRHeader.__doc__ = """Header of an image record: flag, label, id, id2 (see docs/formats.md)."""

# MXNet uses native 'IfQQ'; on little-endian machines (all MXNet ever shipped for)
# that is exactly '<IfQQ', which also keeps files portable.
_IR = struct.Struct("<IfQQ")
_IR_SIZE = _IR.size


def pack(header: Any, s: bytes) -> bytes:
    """Pack a header (any 4-sequence) and payload into a record, as MXNet does.

    A numeric label is stored in the header with flag=0; any other label is
    converted to float32, stored after the header, and flag = its length.
    """
    return pack_head(header) + s


def pack_head(header: Any) -> bytes:
    """The bytes `pack(header, payload)` puts before the payload: the header, then the label
    array when the label is not a number. Its length is a multiple of 4, so a payload written
    after it (MXRecordIO.write_parts) keeps its 4-byte alignment within the record."""
    header = IRHeader(*header)
    if isinstance(header.label, numbers.Number):
        return _IR.pack(0, header.label, header.id, header.id2)
    return pack_label_head(header.label, header.id, header.id2)


def pack_label_head(label: Any, id: int, id2: int) -> bytes:
    """pack_head of a header whose label is an array (flag = its length): the header, then the
    label as float32."""
    label = np.ascontiguousarray(label, dtype=np.float32)
    return _IR.pack(label.size, 0.0, id, id2) + label.tobytes()


def unpack(s: bytes | memoryview) -> tuple[IRHeader, bytes]:
    """Split a record into its `IRHeader` and payload (label array decoded when flag > 0).

    The payload is copied once (a view would keep the whole record alive); the label is a
    read-only view of `s`."""
    view = memoryview(s)
    if len(view) < _IR_SIZE:
        raise RecordIOError(f"record of {len(view)} bytes is shorter than the {_IR_SIZE}-byte IRHeader")
    header = IRHeader(*_IR.unpack_from(view))
    start = _IR_SIZE
    if header.flag > 0:
        need = header.flag * 4
        if len(view) - start < need:
            raise RecordIOError(
                f"record header says {header.flag} float32 labels ({need} bytes) "
                f"but only {len(view) - start} bytes follow the header"
            )
        header = header._replace(label=np.frombuffer(view, np.float32, header.flag, offset=start))
        start += need
    return header, view[start:].tobytes()


def unpack_img(s: bytes, iscolor: int = -1) -> tuple[IRHeader, np.ndarray]:
    """Unpack a record and decode its payload with OpenCV (`cv2.imdecode(..., iscolor)`)."""
    import cv2  # lazily: most users of this module never touch pixels

    header, s = unpack(s)
    img = cv2.imdecode(np.frombuffer(s, dtype=np.uint8), iscolor)
    return header, img


def pack_img(header: Any, img: np.ndarray, quality: int = 95, img_fmt: str = ".jpg") -> bytes:
    """Encode `img` with OpenCV (JPEG quality / PNG compression = `quality`) and pack it."""
    import cv2

    encode_params = None
    if img_fmt.upper() in (".JPG", ".JPEG"):
        encode_params = [cv2.IMWRITE_JPEG_QUALITY, quality]
    elif img_fmt.upper() == ".PNG":
        encode_params = [cv2.IMWRITE_PNG_COMPRESSION, quality]
    ret, buf = cv2.imencode(img_fmt, img, encode_params)
    if not ret:
        raise ValueError(f"OpenCV failed to encode the image as {img_fmt!r}")
    return pack(header, buf.tobytes())


def aligned_magic_offsets(buf: bytes | memoryview) -> list[int]:
    """Offsets of the magic word at 4-byte-aligned positions of `buf`, in order: where a record
    holding `buf` is cut into parts."""
    if len(buf) >= _NUMPY_SCAN_MIN:
        # One vectorised compare of every aligned word beats bytes.find on large,
        # random-looking data, where the magic's first byte turns up every 256 bytes.
        found = np.frombuffer(buf, dtype="<u4", count=len(buf) >> 2) == MAGIC
        # A hit is about one record in 250,000 (a 64 KB JPEG): any() first skips the index list.
        return (np.flatnonzero(found) << 2).tolist() if found.any() else []
    buf = bytes(buf)  # a view has no find(); short, so the copy is cheap
    hits = []
    hit = buf.find(MAGIC_BYTES)
    while hit >= 0:
        if hit & 3:
            hit = buf.find(MAGIC_BYTES, hit + 1)
        else:
            hits.append(hit)
            hit = buf.find(MAGIC_BYTES, hit + 4)
    return hits


def _rest(parts: list, sent: int) -> list:
    """What is left of `parts` once their first `sent` bytes are written."""
    for k, part in enumerate(parts):
        if sent < len(part):
            return [memoryview(part)[sent:], *parts[k + 1 :]]
        sent -= len(part)
    return []


def _encode_record(buf: bytes) -> tuple[list[bytes | memoryview], int]:
    """The headers, parts and padding that store one record, in write order, and their size.

    The payload is cut at every 4-byte-aligned magic word (the word itself is
    dropped; readers put it back), exactly where dmlc-core's writer cuts it.
    """
    length = len(buf)
    if length >= _MAX_RECORD:
        raise ValueError(f"RecordIO records must be shorter than 2**29 bytes, got {length}")
    pad = _PADDING[length & 3]
    hits = aligned_magic_offsets(buf)
    if not hits:
        return [_PART_HEADER.pack(MAGIC, length), buf, pad], 8 + length + len(pad)
    chunks: list[bytes | memoryview] = []
    view = memoryview(buf)
    start = 0  # first byte of the current part
    for hit in hits:
        chunks.append(_PART_HEADER.pack(MAGIC, ((_FIRST if start == 0 else _MIDDLE) << 29) | (hit - start)))
        chunks.append(view[start:hit])
        start = hit + 4
    chunks.append(_PART_HEADER.pack(MAGIC, (_LAST << 29) | (length - start)))
    chunks.append(view[start:])
    chunks.append(pad)
    # Each of the len(hits) dropped magic words became an extra 8-byte part header.
    return chunks, 8 + length + 4 * len(hits) + len(pad)


def _read_record(f: BinaryIO, path: str, offset: int) -> tuple[bytes | None, int]:
    """Read the record whose first part starts at `offset` (the file's current position).

    Returns (record, offset after it), or (None, offset) at a clean end of file.
    """
    parts: list[bytes] = []
    pos = offset
    while True:
        head = f.read(8)
        if len(head) < 8:
            if not head and not parts:
                return None, pos
            raise RecordIOError(
                f"{path}: truncated RecordIO part header at byte offset {pos} "
                f"(record starting at {offset}): {len(head)} of 8 bytes present"
            )
        magic, lrec = _PART_HEADER.unpack(head)
        if magic != MAGIC:
            raise RecordIOError(
                f"{path}: bad magic 0x{magic:08x} at byte offset {pos} "
                f"(expected 0x{MAGIC:08x}); not a RecordIO file, a corrupt one, "
                "or an index offset that is not the start of a record"
            )
        cflag = lrec >> 29
        length = lrec & _LENGTH_MASK
        if parts and cflag not in (_MIDDLE, _LAST):
            raise RecordIOError(
                f"{path}: part at byte offset {pos} has cflag {cflag} inside the multi-part "
                f"record starting at {offset} (expected 2 or 3)"
            )
        if not parts and cflag not in (_WHOLE, _FIRST):
            raise RecordIOError(
                f"{path}: part at byte offset {pos} has cflag {cflag} but starts a record "
                "(expected 0 or 1); corrupt file or an index offset into the middle of a record"
            )
        pad = -length & 3
        data = f.read(length)
        # Read the padding separately: slicing it off would copy the whole part.
        if len(data) < length or (pad and len(f.read(pad)) < pad):
            raise RecordIOError(
                f"{path}: truncated record at byte offset {pos}: the part declares {length} bytes "
                f"(+{pad} padding) but the file ends before that"
            )
        pos += 8 + length + pad
        parts.append(data)
        if cflag in (_WHOLE, _LAST):
            break
    record = parts[0] if len(parts) == 1 else MAGIC_BYTES.join(parts)
    return record, pos


# How many times this process came out of a fork as the child (os.register_at_fork). A handle
# that saw the same count at open() is in the process that opened it, known without asking the
# kernel for the pid on every record (a system call: 5% of data2rec's time writing records).
_forks_in_child = 0
_FORKS_COUNTED = hasattr(os, "register_at_fork")


def _count_fork() -> None:
    global _forks_in_child
    _forks_in_child += 1


if _FORKS_COUNTED:
    os.register_at_fork(after_in_child=_count_fork)


class MXRecordIO:
    """Sequential reader (`flag='r'`) or writer (`flag='w'`, truncates) of a `.rec` file."""

    def __init__(self, uri: str | os.PathLike[str], flag: str) -> None:
        self.uri = os.fspath(uri)
        self.flag = flag
        self.pid: int | None = None
        self.is_open = False
        self.writable = False
        self._file: BinaryIO | None = None
        self._pos = 0
        self.open()

    def open(self) -> None:
        if self.flag == "w":
            self._file = open(self.uri, "wb", buffering=_WRITE_BUFFER)
            self.writable = True
        elif self.flag == "r":
            self._file = open(self.uri, "rb")
            self.writable = False
        else:
            raise ValueError(f"Invalid flag {self.flag}")
        self._pos = 0
        self._gather: list[bytes | memoryview] = []  # parts write_parts holds for one writev
        self._gathered = 0  # their bytes
        self.pid = os.getpid()
        self._forks_at_open = _forks_in_child
        self.is_open = True

    def close(self) -> None:
        if not self.is_open:
            return
        assert self._file is not None
        try:
            self._write_gathered()
        finally:  # closed even when that write fails (a full disk): no open file is left behind
            self._file.close()
            self._file = None
            self.is_open = False
            self.pid = None

    def reset(self) -> None:
        """Reopen: a reader starts over; a writer, as in MXNet, truncates the file."""
        self.close()
        self.open()

    def __enter__(self) -> MXRecordIO:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # A half-built object (open() raised) has no is_open attribute yet.
        if getattr(self, "is_open", False):
            self.close()

    def __getstate__(self) -> dict[str, Any]:
        if self.is_open and self.writable:
            raise TypeError(f"cannot pickle {self.uri} open for writing: reopening it would truncate it")
        state = dict(self.__dict__)
        state["_file"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        was_open = self.is_open
        self.is_open = False
        if was_open:
            self.open()

    def _check_pid(self, allow_reset: bool) -> None:
        # A forked child shares the file offset with its parent; it must reopen.
        if _FORKS_COUNTED and self.pid is not None and self._forks_at_open == _forks_in_child:
            return  # no fork since open(): still the process that opened it
        if self.pid != os.getpid():
            if allow_reset:
                self.reset()
            else:
                raise RuntimeError("Forbidden operation in multiple processes")

    def _require_open(self, writable: bool) -> BinaryIO:
        if not self.is_open or self._file is None:
            raise ValueError(f"{self.uri}: RecordIO file is closed")
        if self.writable != writable:
            mode = "writing" if self.writable else "reading"
            raise ValueError(f"{self.uri}: RecordIO file is open for {mode}")
        return self._file

    def write(self, buf: bytes) -> None:
        """Append one record (any bytes-like object)."""
        f = self._require_open(writable=True)
        self._check_pid(allow_reset=False)
        if not isinstance(buf, bytes):
            try:
                buf = memoryview(buf).tobytes()  # any bytes-like; never bytes(int) or a str
            except TypeError:
                raise TypeError(f"MXRecordIO.write takes bytes, not {type(buf).__name__}") from None
        chunks, size = _encode_record(buf)
        self._write_gathered()
        for chunk in chunks:
            f.write(chunk)
        self._pos += size

    def write_parts(
        self, head: bytes, payload: bytes | memoryview, payload_magic: list[int] | None = None
    ) -> None:
        """Append the record `head + payload` without joining them (for a large payload the
        join is a copy of it). `head`'s length must be a multiple of 4, as pack_head's is.
        `payload_magic`: aligned_magic_offsets(payload), when the caller found them already (while
        the bytes were in its cache: here they are read from memory again); None: found here."""
        if len(head) & 3:
            raise ValueError(f"the head of a record must be a multiple of 4 bytes long, not {len(head)}")
        length = len(head) + len(payload)
        if payload_magic is None:
            payload_magic = aligned_magic_offsets(payload)
        if length >= _MAX_RECORD or aligned_magic_offsets(head) or payload_magic:
            self.write(head + payload)  # too long (write says so), or split where the magic words are
            return
        f = self._require_open(writable=True)
        self._check_pid(allow_reset=False)
        pad = _PADDING[length & 3]
        start = _PART_HEADER.pack(MAGIC, length) + head
        if len(payload) < _GATHER_MIN:
            self._write_gathered()
            f.write(start)
            f.write(payload)
            f.write(pad)
        else:  # held, and written with others in one writev: the payload is never copied here
            self._gather += (start, payload, pad) if pad else (start, payload)
            self._gathered += 8 + length + len(pad)
            if self._gathered >= _WRITE_BUFFER or len(self._gather) > _GATHER_PARTS:
                self._write_gathered()
        self._pos += 8 + length + len(pad)

    def _write_gathered(self) -> None:
        """Write the parts write_parts holds, after whatever the file's buffer holds."""
        if not self._gather:
            return
        parts, todo = self._gather, self._gathered
        self._gather, self._gathered = [], 0  # dropped even if the write fails: the file is lost then
        f = self._file
        assert f is not None
        f.flush()
        while todo:
            done = os.writev(f.fileno(), parts)
            todo -= done
            if todo:  # rare on a regular file: drop what went out, send the rest
                parts = _rest(parts, done)

    def read(self) -> bytes | None:
        """The next record, or None at the end of the file."""
        self._require_open(writable=False)
        self._check_pid(allow_reset=True)
        f = self._file  # reset() may have reopened it
        assert f is not None
        record, self._pos = _read_record(f, self.uri, self._pos)
        return record


class MXIndexedRecordIO(MXRecordIO):
    """A `.rec` file with a `key\\toffset` `.idx` beside it, for random access by key."""

    def __init__(
        self,
        idx_path: str | os.PathLike[str],
        uri: str | os.PathLike[str],
        flag: str,
        key_type: type = int,
    ) -> None:
        self.idx_path = os.fspath(idx_path)
        self.idx: dict[Any, int] = {}
        self.keys: list[Any] = []
        self.key_type = key_type
        self.fidx: Any = None
        super().__init__(uri, flag)

    def open(self) -> None:
        super().open()
        self.idx = {}
        self.keys = []
        try:
            if self.writable:
                self.fidx = open(self.idx_path, "w", buffering=_WRITE_BUFFER)
                return
            self.fidx = open(self.idx_path)
            for key, offset in _parse_index(self.fidx, self.idx_path, self.key_type):
                self.idx[key] = offset
                self.keys.append(key)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if not self.is_open:
            return
        super().close()
        if self.fidx is not None:
            self.fidx.close()
            self.fidx = None

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["fidx"] = None
        return state

    def seek(self, idx: Any) -> None:
        """Position the reader at the record with key `idx` (KeyError if absent)."""
        self._require_open(writable=False)
        self._check_pid(allow_reset=True)
        f = self._file
        assert f is not None
        self._pos = self.idx[idx]
        f.seek(self._pos)

    def tell(self) -> int:
        """Byte offset where the writer's next record will start."""
        self._require_open(writable=True)
        return self._pos

    def read_idx(self, idx: Any) -> bytes:
        """The record with key `idx`."""
        self.seek(idx)
        record = self.read()
        if record is None:
            raise RecordIOError(
                f"{self.uri}: index {self.idx_path} puts key {idx!r} at byte offset {self.idx[idx]}, "
                "at or past the end of the file (truncated .rec?)"
            )
        return record

    def write_idx(self, idx: Any, buf: bytes) -> None:
        """Append record `buf` under key `idx`."""
        key = self.key_type(idx)
        pos = self.tell()
        self.write(buf)
        self.fidx.write(f"{key}\t{pos}\n")
        self.idx[key] = pos
        self.keys.append(key)


def _parse_index(lines: Iterable[str], path: str, key_type: type = int) -> Iterator[tuple[Any, int]]:
    lineno = 0
    try:
        for lineno, line in enumerate(lines, 1):  # noqa: B007 (used in the error below)
            fields = line.strip().split("\t")
            if len(fields) != 2:
                if not line.strip():
                    continue
                fields = line.split()
                if len(fields) != 2:
                    raise RecordIOError(
                        f"{path}: line {lineno}: expected 'key<TAB>offset', got {line.rstrip()[:80]!r}"
                    )
            try:
                key = key_type(fields[0])
                offset = int(fields[1])
            except ValueError:
                raise RecordIOError(
                    f"{path}: line {lineno}: expected 'key<TAB>offset', got {line.rstrip()[:80]!r}"
                ) from None
            if offset < 0:
                raise RecordIOError(f"{path}: line {lineno}: negative offset {offset}")
            yield key, offset
    except UnicodeDecodeError as e:
        raise RecordIOError(f"{path}: not a text index file (undecodable byte after line {lineno})") from e


def _load_index_fast(path: str) -> np.ndarray | None:
    """(n, 2) int64 array of a well-formed index, or None: the slow parser then says what is wrong."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy warns about an empty file
            table = np.loadtxt(path, dtype=np.int64, delimiter="\t", ndmin=2, comments=None, encoding="utf-8")
    except (ValueError, UnicodeDecodeError, OverflowError):
        return None
    if table.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if table.shape[1] != 2 or (table[:, 1] < 0).any():
        return None
    return table


def read_index_arrays(idx_path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """Keys and offsets of an `.idx` file as two int64 arrays, in file order.

    The fast way to combine many shard indexes (offsets shift by the sizes of
    the shards before them); raises `RecordIOError` naming file and line.
    """
    path = os.fspath(idx_path)
    table = _load_index_fast(path)
    if table is None:
        pairs = read_index(path)
        try:
            table = np.array(pairs, dtype=np.int64).reshape(-1, 2)
        except OverflowError:
            raise RecordIOError(f"{path}: a key or offset does not fit in int64") from None
    return table[:, 0].copy(), table[:, 1].copy()


def read_index(idx_path: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """The (key, offset) pairs of an `.idx` file, in file order; `RecordIOError` names a bad line."""
    path = os.fspath(idx_path)
    table = _load_index_fast(path)
    if table is not None:
        return list(zip(table[:, 0].tolist(), table[:, 1].tolist()))
    with open(path, encoding="utf-8") as f:
        return list(_parse_index(f, path))


def write_index(idx_path: str | os.PathLike[str], entries: Iterable[tuple[Any, int]]) -> None:
    """Write (key, offset) pairs as an `.idx` file, atomically (temp name, then rename)."""
    with atomic_open(idx_path, "w", buffering=_WRITE_BUFFER) as f:
        f.writelines(f"{key}\t{offset}\n" for key, offset in entries)


def read_record_span(f: BinaryIO, offset: int, path: str) -> tuple[bytes, int]:
    """(the record starting at byte `offset` of `f`, the offset just after it, padding included):
    what a reader needs to check that an index's next entry, or the file's end, follows it."""
    f.seek(offset)
    record, stop = _read_record(f, path, offset)
    if record is None:
        raise RecordIOError(f"{path}: no record at byte offset {offset} (truncated .rec?)")
    return record, stop


def record_in(buf: bytes, path: str) -> tuple[bytes | memoryview, int]:
    """`read_record_span` of the record at the start of `buf` (bytes read from a `.rec` file).

    A record stored whole in one part, as nearly all are, comes back as a view of `buf`, not
    a copy; anything else goes the general way, with its errors."""
    if len(buf) >= 8:
        magic, lrec = _PART_HEADER.unpack_from(buf)
        length = lrec & _LENGTH_MASK
        stop = 8 + length + (-length & 3)
        if magic == MAGIC and lrec >> 29 == _WHOLE and stop <= len(buf):
            return memoryview(buf)[8 : 8 + length], stop
    return read_record_span(io.BytesIO(buf), 0, path)


def read_record_at(f: BinaryIO, offset: int, path: str) -> bytes:
    """The record starting at byte `offset` of the open `.rec` file `f`.

    For readers that already hold record offsets (a loader's combined index):
    `MXIndexedRecordIO` would parse the whole `.idx` into a dict first, which at
    millions of records costs far more memory than the offsets themselves.
    `path` only names the file in errors. Raises `RecordIOError` when the file
    ends at `offset` or the bytes there are not a whole record.
    """
    f.seek(offset)
    record, _ = _read_record(f, path, offset)
    if record is None:
        raise RecordIOError(f"{path}: no record at byte offset {offset} (truncated .rec?)")
    return record


def iter_records(uri: str | os.PathLike[str]) -> Iterator[tuple[int, bytes]]:
    """Every (byte offset, record) of a `.rec` file, in order; raises on any corruption."""
    path = os.fspath(uri)
    with open(path, "rb") as f:
        pos = 0
        while True:
            record, end = _read_record(f, path, pos)
            if record is None:
                return
            yield pos, record
            pos = end
