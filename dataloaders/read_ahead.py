"""Reading training batches for the DALI backend, ahead of DALI and off the training thread's GIL.

One batch read = a `pread` per record, the label check, the JPEG header parse and the crop
draws (src/open_alip/crops.py, for the whole batch at once: a numpy Generator per sample
cost about 33 us, more than the rest of a record's read).

In a thread of the training process that work shares the GIL with the training loop, and
every `pread` lets go of the GIL and must wait to get it back: beside a busy Python thread
such a reader delivers a tenth of its speed. `BatchReader` therefore reads in worker
processes of its own. A worker writes a batch's images back to back into a slot, a file in
/dev/shm that the training process created and unlinked at once (the worker opens it as
/proc/PID/fd/N, so nothing is left behind even after `kill -9`), and answers over a pipe
with the small arrays (labels, image ends, crops). The training process maps the slot and
hands DALI views of it: per batch a `recv`, an `mmap` and a view per image. The training
thread itself sends and receives (no helper threads, each of which would wait for the GIL).
`workers=0` reads in one thread of this process instead.

Workers are forked, as the PyTorch DataLoader's are (and before any batch is read): they
run only this module's loop (pread, numpy, the JPEG header parser) and never touch CUDA or
DALI, whose pipelines a fork does not copy (dataloaders/imagenet.py keeps the child from
freeing them). `spawn` or `forkserver` would import the training script again in every
worker, seconds of CPU per worker per rank. The record spans of each batch come with its
request.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import signal
import tempfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from dataloaders.records import BadRecord, RecordReader, image_size
from dataloaders.shards import ShardSet
from src.errors import UserError
from src.open_alip.crops import crops_and_flips

__all__ = ["BatchRead", "BatchReader", "ReaderDiedError", "read_batch"]

_SHM = "/dev/shm"


class ReaderDiedError(UserError):
    """A reader process ended unexpectedly (killed, out of memory); the message says what to do."""


@dataclass
class BatchRead:
    """One batch as DALI's external source takes it, or the records that could not be read."""

    labels: np.ndarray | None = None  # float32 [n, K*77], padded with empty captions
    payloads: list[np.ndarray] = field(default_factory=list)  # the encoded images, uint8
    roi_start: np.ndarray | None = None  # float32 [n, 2]: relative (y, x) of the crop's corner
    roi_end: np.ndarray | None = None  # float32 [n, 2]
    mirror: np.ndarray | None = None  # int32 [n]
    bad: list[tuple[int, str]] | None = None  # (record, reason) when some could not be read
    ends: np.ndarray | None = None  # a worker's answer: image i ends at byte ends[i] of its buffer
    error: str | None = None  # a worker's answer: why it could not hand the batch over


def read_batch(
    reader: RecordReader, records: np.ndarray, seeds: np.ndarray, train: bool, spans: np.ndarray | None = None
) -> BatchRead:
    """Read one batch: labels, images, and for training each sample's crop and flip.

    `spans` (from `ShardSet.spans(records)`) lets a reader whose shard set has no per-record
    arrays (a worker's) read the records."""
    labels, payloads, widths, heights, bad = [], [], [], [], []
    spans = reader.shardset.spans(records) if spans is None else spans
    for record, (shard, offset, end) in zip(records.tolist(), spans.tolist()):
        try:
            label, payload = reader.read_span(shard, offset, end)
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


# -- the worker processes ------------------------------------------------------------------


def _worker_main(conn, shardset: ShardSet) -> None:
    """Answer read requests until the pipe closes: (id, slot path, records, seeds, spans, train)."""
    # Ctrl-C reaches the terminal's whole process group. The training process stops its readers
    # itself (its KeyboardInterrupt, then `close`); a reader that died of it first would turn the
    # interrupt into a "reader process ended" error and print a traceback of its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reader = RecordReader(shardset)
    slots: dict[str, int] = {}
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the loader is gone
            return
        if request is None:
            return
        rid, slot, records, seeds, spans, train = request
        read = read_batch(reader, records, seeds, train, spans)
        nbytes = 0
        if not read.bad:
            ends = np.cumsum([len(p) for p in read.payloads], dtype=np.int64)
            total = int(ends[-1]) if len(ends) else 0
            try:
                fd = slots.get(slot)
                if fd is None:
                    fd = slots[slot] = os.open(slot, os.O_RDWR)
                _write_all(fd, read.payloads)
            except OSError as e:  # a full /dev/shm (containers often give it 64 MB): said, not a crash
                read = BatchRead(
                    error=f"{total / 1e6:.0f} MB of images could not be written to its buffer ({e.strerror})"
                )
            else:
                nbytes = total
                read.ends = ends
                read.payloads = []
        try:
            conn.send((rid, nbytes, read))
        except (BrokenPipeError, OSError):
            return


def _write_all(fd: int, buffers: list[np.ndarray]) -> None:
    """The buffers back to back from the file's start: one `pwritev` per up to 512 of them (no
    joined copy). A short write (the buffer's size limit reached) continues, and raises on the next try."""
    views = [memoryview(b) for b in buffers]
    i = offset = 0
    while i < len(views):
        written = os.pwritev(fd, views[i : i + 512], offset)
        offset += written
        while i < len(views) and written >= len(views[i]):  # past the buffers written whole
            written -= len(views[i])
            i += 1
        if written:  # the rest of one written in part
            views[i] = views[i][written:]


class _Slot:
    """A file in /dev/shm, unlinked at once, that one batch's images are written into."""

    def __init__(self) -> None:
        self.folder = _SHM if os.path.isdir(_SHM) else tempfile.gettempdir()
        self.file = tempfile.TemporaryFile(dir=self.folder)
        self.path = f"/proc/{os.getpid()}/fd/{self.file.fileno()}"

    def view(self, nbytes: int) -> np.ndarray:
        if not nbytes:
            return np.empty(0, np.uint8)
        return np.frombuffer(mmap.mmap(self.file.fileno(), nbytes, access=mmap.ACCESS_READ), np.uint8)


class _Pending:
    """A request sent to worker `worker`; `result()` receives it (and any sent before it)."""

    def __init__(self, reader: BatchReader, rid: int, worker: int, slot: _Slot) -> None:
        self.reader, self.rid, self.worker, self.slot = reader, rid, worker, slot

    def result(self) -> BatchRead:
        return self.reader._receive(self)


class BatchReader:
    """Reads batches ahead: in `workers` processes, or in one thread of this process (0)."""

    def __init__(self, shardset: ShardSet, workers: int = 0) -> None:
        if workers < 0:
            raise ValueError(f"reader workers {workers}: must be 0 or more")
        self.shardset = shardset
        self.workers = workers
        self.reader = RecordReader(shardset)
        self._pool: ThreadPoolExecutor | None = None
        self._owner = os.getpid()  # a forked copy of the loader must not stop the parent's workers
        self._procs: list = []
        self._conns: list = []
        self._queues: list[deque[_Pending]] = []  # per worker: requests not yet received, in order
        self._done: dict[int, tuple[int, BatchRead]] = {}
        self._abandoned: set[int] = set()
        self._free: list[_Slot] = []
        self._next_id = 0
        self._turn = 0

    def submit(self, records: np.ndarray, seeds: np.ndarray, train: bool) -> Future | _Pending:
        if self.workers == 0:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="rec-read")
            return self._pool.submit(read_batch, self.reader, records, seeds, train)
        if not self._procs:
            self._start()
        worker = self._turn % self.workers
        self._turn += 1
        slot = self._free.pop() if self._free else _Slot()
        pending = _Pending(self, self._next_id, worker, slot)
        self._next_id += 1
        try:
            self._conns[worker].send(
                (pending.rid, slot.path, records, seeds, self.shardset.spans(records), train)
            )
        except (BrokenPipeError, OSError):
            self._died(worker)
        self._queues[worker].append(pending)
        return pending

    def release(self, pending: Future | _Pending) -> None:
        """The batch's images are no longer used (or the batch is not wanted): its slot may take another."""
        if not isinstance(pending, _Pending) or pending.slot is None:
            return
        queue = self._queues[pending.worker] if self._queues else ()
        if any(p is pending for p in queue):
            self._abandoned.add(pending.rid)  # still being read: the slot is free once it arrives
            return
        self._done.pop(pending.rid, None)
        self._free.append(pending.slot)
        pending.slot = None

    def pids(self) -> list[int]:
        """The reader processes running now (none before the first batch or with 0 workers)."""
        return [p.pid for p in self._procs]

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")
        light = self.shardset.without_records()  # what the worker keeps: no per-record arrays
        for _ in range(self.workers):
            ours, theirs = context.Pipe()
            proc = context.Process(target=_worker_main, args=(theirs, light), daemon=True, name="rec-read")
            proc.start()
            theirs.close()  # so that a dead worker reads as end-of-file here
            self._procs.append(proc)
            self._conns.append(ours)
            self._queues.append(deque())

    def _receive(self, pending: _Pending) -> BatchRead:
        while pending.rid not in self._done:
            queue = self._queues[pending.worker]
            if not queue:  # dropped by close(): nothing will come
                raise ReaderDiedError("the loader's record readers were stopped")
            try:
                rid, nbytes, read = self._conns[pending.worker].recv()
            except (EOFError, OSError):
                self._died(pending.worker)
            arrived = queue.popleft()
            if rid in self._abandoned:
                self._abandoned.discard(rid)
                self._free.append(arrived.slot)
                arrived.slot = None
                continue
            self._done[rid] = (nbytes, read)
        nbytes, read = self._done.pop(pending.rid)
        if read.error:
            self.close()
            raise ReaderDiedError(
                f"the data loader's record reader: {read.error} in {pending.slot.folder}; give the machine "
                "or container more shared memory (docker: --shm-size 8g or --ipc=host) or read in the "
                "training process (--reader-workers 0)"
            )
        if not read.bad:
            data = pending.slot.view(nbytes)
            starts = [0, *read.ends[:-1].tolist()]
            read.payloads = [data[a:b] for a, b in zip(starts, read.ends.tolist())]
        return read

    def _died(self, worker: int):
        code = None
        if self._procs:
            self._procs[worker].join(timeout=2)  # its exit status says how it ended
            code = self._procs[worker].exitcode
        self.close()
        how = f"exit code {code}" if code is not None else "its pipe closed"
        raise ReaderDiedError(
            f"a record reader process of the data loader in process {os.getpid()} ended unexpectedly ({how}; "
            "killed, or out of memory?): see the system log, then resume the run (--resume latest)"
        ) from None

    def close(self) -> None:
        """Stop the thread or the worker processes (batches being read are dropped)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        procs, conns = self._procs, self._conns
        self._procs, self._conns, self._queues, self._done, self._abandoned = [], [], [], {}, set()
        if os.getpid() != self._owner:
            return
        for conn in conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            conn.close()
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
