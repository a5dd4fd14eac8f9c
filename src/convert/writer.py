"""Write one shard under temporary names and publish it by rename only when it is complete."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from ..recordio import MXIndexedRecordIO
from ..shard_names import temp_path

# A shard's bytes are handed to the disk every this many while it is written (ShardWriter.write),
# so the disk works while the next records are made, and the fsync that publishes the shard finds
# little left to write. Without it the kernel holds them all until that fsync, or until a tenth of
# the memory is dirty. 0: never.
WRITEBACK_BYTES = (8 << 20) if hasattr(os, "posix_fadvise") else 0


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class _IndexStreamer(MXIndexedRecordIO):
    """MXIndexedRecordIO that streams index lines without also keeping them in memory:
    a single 15M-record output would otherwise hold a 15M-entry dict."""

    def write_idx_parts(
        self, idx, head: bytes, payload: bytes | memoryview, payload_magic: list[int] | None = None
    ) -> None:
        pos = self.tell()
        self.write_parts(head, payload, payload_magic)
        self.fidx.write(f"{int(idx)}\t{pos}\n")

    def flush_to_os(self) -> int:
        """Hand every record written so far to the kernel; returns the `.rec`'s descriptor."""
        self._write_gathered()
        self._file.flush()
        return self._file.fileno()


def _advise_write_out(fd: int, start: int, length: int) -> None:
    """Start writing a range of a file to the disk, without waiting for it. Linux starts the
    write-out of a range's dirty pages on this advice and drops only its clean ones (here none):
    what sync_file_range does, from the standard library. It does the disk's work for the range
    (block allocation, submission), so it runs on a thread of its own. Advice never loses data,
    where the write-out is not started."""
    try:
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)
    except OSError:
        pass  # only advice: the commit's fsync writes the bytes all the same


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
        self._written_back = 0  # bytes of the .rec already handed to the disk
        self._write_out: threading.Thread | None = None
        self.first_id: int | None = None
        self.last_id: int | None = None

    def write(
        self, key: int, head: bytes, payload: bytes | memoryview, payload_magic: list[int] | None = None
    ) -> None:
        """Append the record `head + payload` (see caption_record_head) under `key`; `payload_magic`
        as MXRecordIO.write_parts takes it."""
        self._io.write_idx_parts(key, head, payload, payload_magic)
        if WRITEBACK_BYTES and self._io.tell() - self._written_back >= WRITEBACK_BYTES:
            self._start_write_out()
        self.records += 1
        if self.first_id is None:
            self.first_id = key
        self.last_id = key

    def _start_write_out(self) -> None:
        """Hand the bytes written since the last time to the disk (see WRITEBACK_BYTES); one range
        at a time: while one is still on its way, the next grows."""
        if self._write_out is not None and self._write_out.is_alive():
            return
        fd, end = self._io.flush_to_os(), self._io.tell()
        self._write_out = threading.Thread(
            target=_advise_write_out,
            args=(fd, self._written_back, end - self._written_back),
            name="data2rec-write-out",
            daemon=True,
        )
        self._write_out.start()
        self._written_back = end

    def _wait_write_out(self) -> None:
        """Before the file is closed: its descriptor must not be advised once reused."""
        if self._write_out is not None:
            self._write_out.join()
            self._write_out = None

    def commit(self) -> dict:
        """Publish the shard; returns its summary for the report."""
        self._wait_write_out()
        size = self._io.tell()
        self._committing = True
        self._io.close()
        for tmp in (self.tmp_idx, self.tmp_rec):
            fsync_path(tmp)
        os.replace(self.tmp_idx, self.idx)
        os.replace(self.tmp_rec, self.rec)
        fsync_path(self.rec.parent)
        return {
            "rec": self.rec.name,
            "idx": self.idx.name,
            "records": self.records,
            "bytes": size,
            "first_id": self.first_id,
            "last_id": self.last_id,
        }

    def abort(self) -> None:
        """Drop the unfinished shard. Closing flushes what is buffered, which fails again on a
        full disk: that error is moot (the files are deleted next) and must not stop the clean-up
        or leave a half-closed file to complain at exit ("Exception ignored ... OSError")."""
        self._wait_write_out()
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
    return temp_path(rec), temp_path(idx)


def discard_temps(rec: Path, idx: Path) -> None:
    """Delete a shard's unfinished files, also where a stop came while its writer was being made
    (SIGTERM raises anywhere: the files may exist before the writer does)."""
    for tmp in temp_paths(rec, idx):
        tmp.unlink(missing_ok=True)
