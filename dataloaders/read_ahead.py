"""Reading a training batch for the DALI backend, ahead of DALI, in a thread of the loader.

One batch read = a `pread` per record, the label check, the JPEG header parse and the crop
draws (dataloaders/augment.py, for the whole batch at once: a numpy Generator per sample
cost about 33 us, more than the rest of a record's read).

This thread shares the GIL with the training loop, and every `pread` lets go of the GIL and
must wait for it again: `python -m benchmarks.loader --reader` measures the reader beside a
busy Python thread (13,000 records/s alone, about 1,000 beside it on this 2-core machine).
Moving the reads into processes needs the images handed back through shared memory: passing
them through a pipe (a process pool) was measured slower still, as copying and unpickling
~19 MB per 256-record batch costs as much as reading it.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from dataloaders.augment import crops_and_flips
from dataloaders.records import BadRecord, RecordReader, image_size
from dataloaders.shards import ShardSet

__all__ = ["BatchRead", "BatchReader", "read_batch"]


@dataclass
class BatchRead:
    """One batch as DALI's external source takes it, or the records that could not be read."""

    labels: np.ndarray | None = None  # float32 [n, K*77], padded with empty captions
    payloads: list[np.ndarray] = field(default_factory=list)  # the encoded images, uint8
    roi_start: np.ndarray | None = None  # float32 [n, 2]: relative (y, x) of the crop's corner
    roi_end: np.ndarray | None = None  # float32 [n, 2]
    mirror: np.ndarray | None = None  # int32 [n]
    bad: list[tuple[int, str]] | None = None  # (record, reason) when some could not be read


def read_batch(reader: RecordReader, records: np.ndarray, seeds: np.ndarray, train: bool) -> BatchRead:
    """Read one batch: labels, images, and for training each sample's crop and flip."""
    labels, payloads, widths, heights, bad = [], [], [], [], []
    for record in records.tolist():
        try:
            label, payload = reader.read(record)
            width, height = image_size(payload) if train else (1, 1)
        except BadRecord as e:
            bad.append((record, e.reason))
            continue
        labels.append(label)
        payloads.append(np.frombuffer(payload, np.uint8))
        widths.append(width)
        heights.append(height)
    if bad:
        return BatchRead(bad=bad)
    padded = np.zeros((len(labels), max(lab.size for lab in labels)), np.float32)
    for i, lab in enumerate(labels):
        padded[i, : lab.size] = lab
    out = BatchRead(labels=padded, payloads=payloads)
    if train:
        boxes, mirror = crops_and_flips(np.array(widths), np.array(heights), seeds)
        size = np.stack([heights, widths], axis=1).astype(np.float64)
        # Relative (y, x) corners: the resize's region of interest, in the image's shape order.
        out.roi_start = (boxes[:, [1, 0]] / size).astype(np.float32)
        out.roi_end = (boxes[:, [3, 2]] / size).astype(np.float32)
        out.mirror = mirror.astype(np.int32)
    return out


class BatchReader:
    """Reads batches ahead in one thread of this process."""

    def __init__(self, shardset: ShardSet) -> None:
        self.reader = RecordReader(shardset)
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, records: np.ndarray, seeds: np.ndarray, train: bool) -> Future:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="rec-read")
        return self._pool.submit(read_batch, self.reader, records, seeds, train)

    def close(self) -> None:
        """Stop the thread once the batch it reads is done (batches not started are dropped)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
