"""Write one shard under temporary names and publish it by rename only when it is complete."""

from __future__ import annotations

import os
from pathlib import Path

from ..recordio import MXIndexedRecordIO

TMP_SUFFIX = ".tmp"


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _IndexStreamer(MXIndexedRecordIO):
    """MXIndexedRecordIO that streams index lines without also keeping them in memory:
    a single 15M-record output would otherwise hold a 15M-entry dict."""

    def write_idx_parts(self, idx, head: bytes, payload: bytes | memoryview) -> None:
        pos = self.tell()
        self.write_parts(head, payload)
        self.fidx.write(f"{int(idx)}\t{pos}\n")


class ShardWriter:
    """`.rec` + `.idx` written as `NAME.rec.tmp` / `NAME.idx.tmp`, renamed by `commit()`.

    A reader that sees `NAME.rec` can rely on it being whole: the index is renamed
    first, the data file last, both after an fsync.
    """

    def __init__(self, rec: Path, idx: Path) -> None:
        self.rec, self.idx = rec, idx
        self.tmp_rec, self.tmp_idx = temp_paths(rec, idx)
        self._committing = False
        self._io = _IndexStreamer(str(self.tmp_idx), str(self.tmp_rec), "w")
        self.records = 0
        self.first_id: int | None = None
        self.last_id: int | None = None

    def write(self, key: int, head: bytes, payload: bytes | memoryview) -> None:
        """Append the record `head + payload` (see caption_record_head) under `key`."""
        self._io.write_idx_parts(key, head, payload)
        self.records += 1
        if self.first_id is None:
            self.first_id = key
        self.last_id = key

    def commit(self) -> dict:
        """Publish the shard; returns its summary for the report."""
        size = self._io.tell()
        self._committing = True
        self._io.close()
        for tmp in (self.tmp_idx, self.tmp_rec):
            fsync_path(tmp)
        os.replace(self.tmp_idx, self.idx)
        os.replace(self.tmp_rec, self.rec)
        fsync_path(self.rec.parent)
        return {
            "rec": self.rec.name, "idx": self.idx.name, "records": self.records, "bytes": size,
            "first_id": self.first_id, "last_id": self.last_id,
        }

    def abort(self) -> None:
        """Drop the unfinished shard. Closing flushes what is buffered, which fails again on a
        full disk: that error is moot (the files are deleted next) and must not stop the clean-up
        or leave a half-closed file to complain at exit ("Exception ignored ... OSError")."""
        fidx = self._io.fidx  # MXIndexedRecordIO.close skips it when closing the .rec fails
        for close in (self._io.close, fidx.close if fidx is not None else None):
            try:
                if close is not None:
                    close()
            except OSError:
                pass
        discard_temps(self.rec, self.idx)
        if self._committing and not self.rec.exists():  # stopped between the two renames
            self.idx.unlink(missing_ok=True)


def temp_paths(rec: Path, idx: Path) -> tuple[Path, Path]:
    """The names a shard's `.rec` and `.idx` are written under until `commit()`."""
    return rec.with_name(rec.name + TMP_SUFFIX), idx.with_name(idx.name + TMP_SUFFIX)


def discard_temps(rec: Path, idx: Path) -> None:
    """Delete a shard's unfinished files, also where a stop came while its writer was being made
    (SIGTERM raises anywhere: the files may exist before the writer does)."""
    for tmp in temp_paths(rec, idx):
        tmp.unlink(missing_ok=True)
