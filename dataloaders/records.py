"""One record of a shard set -> (caption labels, image bytes), and the checks that tell a
damaged record from a dataset the loaders cannot use.

Both loader backends read records here, in the main process (DALI, which is fed the
encoded images) or in worker processes (the PyTorch fallback). A record is read with one
`pread` of the bytes between its offset and the next record's, so reader threads share
nothing but file descriptors, and only a bounded number of those per thread.

A record that cannot be used raises `BadRecord` with a reason; the loader decides
whether to skip it (dataloaders/base.py). `probe_shards` reads the first and last record
of every shard before a loader starts, so a whole dataset of the wrong kind (classification
records from im2rec, captions of another context length, an index that belongs to another
.rec) stops at once with one line instead of a skip per record.
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict

import numpy as np
from PIL import Image

from dataloaders.shards import ShardError, ShardSet
from src.caption_record import InvalidCaptions, unpack_caption_record
from src.jpeg import jpeg_info
from src.recordio import RecordIOError, record_in

__all__ = ["BadRecord", "RecordReader", "image_size", "probe_shards"]

# Open files per reader thread; 15M records come in ~1,500 shards, beyond a default ulimit.
_MAX_OPEN = 64
# JPEG start-of-frame markers (they carry the frame size); C4, C8 and CC share the range.


class BadRecord(Exception):
    """This record cannot be used; `reason` says why and `advice` what fixes the data."""

    def __init__(self, reason: str, advice: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.advice = advice or (
            "check the shard with data2rec.py --verify PREFIX --decode and reconvert it, "
            "or leave it out of the data"
        )


# data2rec refuses such captions when it converts (src/caption_record.py holds the one rule).
_CAPTIONS_ADVICE = (
    "the loaders read image-caption records as data2rec.py writes them: convert the data "
    "with it (a row it cannot convert is left out and named in its report, with the reason)"
)
_FRAMING_ADVICE = (
    "the .idx does not belong to this .rec, or one of them is damaged; rebuild the shard "
    "(data2rec.py writes both files)"
)


def image_size(payload: bytes) -> tuple[int, int]:
    """(width, height) of an encoded image from its header, as stored (EXIF orientation not applied)."""
    info = jpeg_info(payload)
    if info is not None and info[0] and info[1]:
        return info[0], info[1]
    try:
        with Image.open(io.BytesIO(payload)) as img:
            return img.size
    except Exception as e:  # PIL raises many kinds for data that is not an image
        text = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadRecord(f"its image header cannot be read ({text})") from None


class RecordReader:
    """Record number -> (label float32 [K*77], image bytes) for one ShardSet; thread- and fork-safe."""

    def __init__(self, shardset: ShardSet, max_open: int = _MAX_OPEN) -> None:
        # PIL imports its format plugins on first use; do it here, in the thread that builds the
        # loader: an import under way in a reader thread when the process forks would leave
        # the module locked in the child.
        Image.init()
        self.shardset = shardset
        self.max_open = max_open
        self._local = threading.local()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_local"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._local = threading.local()

    def _fd(self, shard: int) -> int:
        if self._pid != os.getpid():  # a forked worker: its own descriptors from here on
            self._local, self._pid = threading.local(), os.getpid()
        fds = getattr(self._local, "fds", None)
        if fds is None:
            fds = self._local.fds = OrderedDict()
        fd = fds.get(shard)
        if fd is None:
            if len(fds) >= self.max_open:
                os.close(fds.popitem(last=False)[1])
            fd = fds[shard] = os.open(self.shardset.shards[shard].rec, os.O_RDONLY)
        else:
            fds.move_to_end(shard)
        return fd

    def close(self) -> None:
        """Close this thread's files (other threads' close when they end)."""
        for fd in getattr(self._local, "fds", {}).values():
            os.close(fd)
        self._local.fds = OrderedDict()

    def read(self, record: int) -> tuple[np.ndarray, bytes]:
        return self.read_span(*self.shardset.span(record))

    def read_span(self, shard: int, offset: int, end: int) -> tuple[np.ndarray, bytes]:
        """The record in bytes [offset, end) of shard number `shard` (`ShardSet.span`)."""
        try:
            buf = os.pread(self._fd(shard), end - offset, offset)
        except OSError as e:
            raise BadRecord(f"reading it failed ({e.strerror})", "check the disk and the file") from None
        path = str(self.shardset.shards[shard].rec)
        try:
            # Errors name offsets inside `buf`, so the message is ours, with the file's offset.
            data, stop = record_in(buf, path)
            if stop != len(buf) and end == int(self.shardset.sizes[shard]):
                # Records are written back to back, so bytes after a shard's last indexed record are
                # records its index does not list (an index cut short, or stale).
                raise BadRecord(
                    f"the record there ends at byte {offset + stop} but the file ends at byte {end}: "
                    f"the index does not list the {end - stop - offset} bytes after it",
                    _FRAMING_ADVICE,
                )
            record = unpack_caption_record(data)
        except InvalidCaptions as e:
            raise BadRecord(str(e), _CAPTIONS_ADVICE) from None
        except RecordIOError as e:
            if "truncated" in str(e) or "shorter than" in str(e) or "only" in str(e):
                what = (
                    f"the record there runs past byte {end}, where the index puts the next record or the "
                    "file ends"
                )
            else:
                detail = str(e).split(": ", 1)[-1].split(" at byte offset")[0].split(" (expected")[0]
                what = f"no record starts at this offset ({detail})"
            raise BadRecord(what, _FRAMING_ADVICE) from None
        return record.tokens, record.payload


def probe_shards(shardset: ShardSet, reader: RecordReader | None = None) -> None:
    """Read the first and last record of every shard; ShardError (one line) if either is unusable."""
    reader = reader or RecordReader(shardset, max_open=1)
    starts = shardset.starts
    try:
        for i, shard in enumerate(shardset.shards):
            for record in sorted({int(starts[i]), int(starts[i + 1]) - 1}):
                try:
                    reader.read(record)
                except BadRecord as e:
                    _, key, offset = shardset.locate(record)
                    raise ShardError(
                        f"{shard.rec} record key {key} at byte {offset}: {e.reason}; {e.advice}"
                    ) from None
    finally:
        reader.close()
