"""The training loader (named imagenet.py, as in the original repository): `.rec/.idx` shards ->
(images, caption token ids), for training and for evaluation on shards.

`build_loader` returns an iterable the trainer consumes as
`for images, tokens in loader`: images float32 [B, 3, S, S] normalised with the
CLIP mean/std on the loader's device, tokens int64 [B, 77] (one caption per
sample, drawn uniformly among its non-empty ones) or [B, K, 77] with
`all_captions`. Two backends deliver the same records in the same batches: DALI
(this module; GPU decoding with the `mixed` decoder when the loader's device is a
GPU) and a pure-PyTorch fallback (`dataloaders.torch_loader`) for machines where
DALI does not install.

How the DALI backend is fed. The loader reads the records itself, batches ahead in
processes of its own, off the training thread's GIL (dataloaders/read_ahead.py), and hands
DALI the encoded images through an external source, with each sample's crop box and flip
(src/open_alip/crops.py: the PyTorch fallback's draws); DALI decodes and cuts out the crop box, which
is then resized alone (the fallback's crop-then-resize), flipped and normalised: by DALI on the GPU,
by torch on the CPU (dataloaders/resize.py: DALI's CPU resize cost twice PIL's). Nothing random runs
inside DALI, which gives:

- one pipeline for the whole run, kept across epochs (each epoch only resets it);
- `set_epoch(e)` reproduces epoch `e` without replaying earlier ones;
- an exact mid-epoch resume from (epoch, batch, bad records) alone, no DALI checkpoint;
- a record DALI cannot decode is skipped: a failed batch kills a DALI pipeline, so the
  loader finds the record (each image of the batches in flight decoded alone), leaves it
  out of the epoch's order (dataloaders/base.py) and continues with a new pipeline from
  the same batch.

The order of an epoch is a full permutation of the rank's records (not a shuffle buffer
over the file order), so batches mix the whole share of the data; records are read at
random offsets, which wants storage that serves random reads (local disk, page cache).
On the GPU (`mixed`) the full image is decoded, so that JPEGs can go to the hardware decoder,
which does not decode regions, and the box is sliced out; on the CPU only each crop's window is
decoded (`_crops`).

DALI is imported only when a DALI pipeline is built, so the fallback backend and the
helpers here work without it.
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dataloaders.base import (
    DEFAULT_MAX_BAD_RECORDS,
    LOG,
    BadRecordLimitError,
    BaseLoader,
    CorruptRecordError,
    derive_seed,
    dist_env,
    select_captions,
)
from dataloaders.limits import BACKENDS, READER_MIN_CORES, READER_WORKERS
from dataloaders.read_ahead import BatchReader, ReaderDiedError
from dataloaders.records import probe_shards
from dataloaders.resize import CropResizer
from dataloaders.shards import load_shards
from dataloaders.torch_loader import TorchLoader
from src.devices import resolve_device
from src.open_alip.constants import CLIP_MEAN, CLIP_STD

__all__ = [
    "DEFAULT_MAX_BAD_RECORDS",
    "BadRecordLimitError",
    "CorruptRecordError",
    "DaliLoader",
    "build_loader",
    "select_captions",
]

# The original's DALI settings (deepglint/RWKV-CLIP dataloaders): nvJPEG's device and pinned-host
# buffers preallocated large enough that big images cause no reallocation, three batches in flight.
# (Its 100 crop attempts are constants.TRAIN_CROP_ATTEMPTS, shared with the PyTorch fallback.)
DEVICE_MEMORY_PADDING = 211025920
HOST_MEMORY_PADDING = 140544512
PREFETCH_DEPTH = 3
# Share of JPEG work given to the GPU's hardware decoder (A100, H100, H200 have one; elsewhere the
# setting is ignored). DALI's own tuning for A100; measure with benchmarks/gpu.py before changing.
HW_DECODER_LOAD = 0.65
READ_AHEAD = 2  # batches read (from disk, by the reader processes) before DALI asks for them
# Processes reading records for each loader (READER_WORKERS, dataloaders/limits.py); 0 reads in a
# thread of the training process, which then shares the GIL with the training loop.


def auto_reader_workers() -> int:
    """READER_WORKERS where each local process has READER_MIN_CORES cores or more, else 0."""
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return READER_WORKERS if cores // local >= READER_MIN_CORES else 0


_ABANDONED: list = []  # DALI pipeline backends a forked child must never shut down
_FORK_HOOK = False


def _abandon_dali_pipelines_in_child() -> None:
    """After fork: DALI's worker threads were not copied, so shutting a pipeline down in the child
    (its destructor, run by the garbage collector in, say, a DataLoader worker) waits forever.
    The child cannot use the pipelines anyway; keep their backends alive and unreachable instead."""
    try:
        from nvidia.dali import Pipeline

        for ref in list(getattr(Pipeline, "_pipes", ())):
            pipe = ref()
            if pipe is not None and getattr(pipe, "_pipe", None) is not None:
                _ABANDONED.append(pipe._pipe)
                pipe._pipe = None
    except Exception:  # a DALI without these internals: nothing to do here
        pass


def _guard_forks() -> None:
    global _FORK_HOOK
    if not _FORK_HOOK and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_abandon_dali_pipelines_in_child)
        _FORK_HOOK = True


@dataclass
class _Batch:
    """One batch handed to DALI: what it is, and what DALI does not carry."""

    epoch: int
    index: int
    records: np.ndarray
    labels: np.ndarray  # float32 [n, K*77], padded with empty captions
    payloads: list[np.ndarray]  # kept to find an undecodable image after a failure
    read: Any = None  # the reader's handle: its buffer is free again once the batch is delivered
    mirror: np.ndarray | None = None  # int32 [n]: flip left-right (training)


class _Source:
    """The pipeline's external source, holding its loader weakly.

    A pipeline that held the loader (a bound method) would make a reference cycle, and a cycle
    is freed by the garbage collector whenever it runs, even inside a forked DataLoader worker,
    where freeing a DALI pipeline waits forever for threads the fork did not copy.
    """

    def __init__(self, loader: DaliLoader) -> None:
        self.loader = weakref.ref(loader)

    def __call__(self):
        loader = self.loader()
        if loader is None:
            raise StopIteration
        return loader._source()


class DaliLoader(BaseLoader):
    """DALI pipeline over `.rec` shards, fed by the loader, kept for the whole run."""

    backend = "dali"

    def __init__(self, *args: Any, reader_workers: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        workers = auto_reader_workers() if reader_workers is None else reader_workers
        self.reader = BatchReader(self.shardset, workers)
        # Stop the reader processes when the loader goes (the finalizer holds the reader, not the loader).
        weakref.finalize(self, self.reader.close)
        self.resizer = CropResizer.beside(
            max(1, self.num_threads)
        )  # the CPU pipeline's resize (resizes_in_torch)
        weakref.finalize(self, self.resizer.close)
        self._pipe = None
        self._pipe_dirty = False  # scheduled since it was built or last reset
        self._fed: deque[_Batch] = deque()  # handed to DALI, not yet delivered
        self._feed_at: tuple[int, int] = (0, 0)  # (epoch, batch) the source hands DALI next
        self._feed_stop = False
        self._ahead: dict[tuple, Future] = {}
        self.pipelines_built = 0  # how many times a pipeline was built (kept across epochs: 1)
        # Training decodes only each crop's window on the CPU; `mixed` decodes whole images.
        self.roi_decode = self.device.type != "cuda"

    # -- pipeline --------------------------------------------------------------------------
    def _device_id(self) -> int | None:
        if self.device.type != "cuda":
            return None
        # resolve_device gives an index; a bare torch.device("cuda") means the current GPU.
        return self.device.index if self.device.index is not None else torch.cuda.current_device()

    def _decoder_args(self, probe: bool = False) -> dict[str, Any]:
        from nvidia.dali import types

        # Orientation as stored, as the PyTorch fallback and the evaluation transform see the
        # image, and as the crop box (computed from the stored size) assumes.
        args: dict[str, Any] = {"output_type": types.RGB, "adjust_orientation": False}
        if self.device.type == "cuda":
            args["device"] = "mixed"
            if not probe:
                args.update(
                    device_memory_padding=DEVICE_MEMORY_PADDING,
                    host_memory_padding=HOST_MEMORY_PADDING,
                    hw_decoder_load=HW_DECODER_LOAD,
                )
        else:
            args["device"] = "cpu"
        return args

    def _crops(self, jpegs, roi_start, roi_end):
        """Each image's crop box (uint8 HWC), as crop-then-resize wants it: the resize sees the box's
        pixels only, as torchvision's RandomResizedCrop and the original's cropping decoder do.

        The box in whole pixels is what the stored relative (y, x) corners round to (the box
        crops.py drew). `mixed` decodes whole images (the hardware decoder takes nothing else) and
        slices the box out; on the CPU (`roi_decode`) the decoder decodes the box only
        (libjpeg-turbo skips the rows below it and the inverse DCT of the columns beside it).
        """
        from nvidia.dali import fn, types
        from nvidia.dali import math as dmath

        shape = fn.peek_image_shape(jpegs, adjust_orientation=False)  # (H, W, C) as stored
        extent = fn.cast(shape[0:2], dtype=types.FLOAT)
        start = fn.cast(dmath.floor(roi_start * extent + 0.5), dtype=types.INT32)
        end = fn.cast(dmath.floor(roi_end * extent + 0.5), dtype=types.INT32)
        if self.roi_decode:
            return fn.decoders.image_slice(
                jpegs, start=start, end=end, axis_names="HW", **self._decoder_args()
            )
        return fn.slice(
            fn.decoders.image(jpegs, **self._decoder_args()), start=start, end=end, axis_names="HW"
        )

    @property
    def resizes_in_torch(self) -> bool:
        """Training on the CPU: DALI hands over the decoded crops, torch resizes them
        (dataloaders/resize.py: several times faster than DALI's CPU resize)."""
        return self.train and self.roi_decode

    def _images(self, size: int):
        """The pipeline's output: normalised CHW float images, or, where torch resizes
        (`resizes_in_torch`), each image's decoded crop box."""
        from nvidia.dali import fn, types

        if not self.train:
            (jpegs,) = fn.external_source(
                source=_Source(self), num_outputs=1, batch=True, dtype=[types.UINT8], ndim=[1]
            )
            images = fn.decoders.image(jpegs, **self._decoder_args())
            images, mirror = fn.resize(images, resize_shorter=size, interp_type=types.INTERP_LINEAR), 0
        elif self.resizes_in_torch:  # the flips are applied with the resize, from the fed batch's record
            jpegs, roi_start, roi_end = fn.external_source(
                source=_Source(self),
                num_outputs=3,
                batch=True,
                dtype=[types.UINT8, types.FLOAT, types.FLOAT],
                ndim=[1, 1, 1],
            )
            return self._crops(jpegs, roi_start, roi_end)
        else:
            jpegs, roi_start, roi_end, mirror = fn.external_source(
                source=_Source(self),
                num_outputs=4,
                batch=True,
                dtype=[types.UINT8, types.FLOAT, types.FLOAT, types.INT32],
                ndim=[1, 1, 1, 0],
            )
            images = fn.resize(
                self._crops(jpegs, roi_start, roi_end),
                resize_x=size,
                resize_y=size,
                interp_type=types.INTERP_LINEAR,
            )
        return fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            crop=(size, size),
            mean=[m * 255 for m in CLIP_MEAN],
            std=[s * 255 for s in CLIP_STD],
            mirror=mirror,
        )

    def _build_pipeline(self):
        from nvidia.dali import Pipeline

        _guard_forks()
        size = self.input_size
        pipe = Pipeline(
            batch_size=self.batch_size,
            num_threads=max(1, self.num_threads),
            device_id=self._device_id(),
            prefetch_queue_depth=PREFETCH_DEPTH,
            seed=derive_seed(self.seed, self.rank),  # nothing in the pipeline draws from it
        )
        with pipe:
            pipe.set_outputs(self._images(size))
        pipe.build()
        self.pipelines_built += 1
        return pipe

    # -- the external source ---------------------------------------------------------------
    def _submit(self, epoch: int, batch: int) -> Future | None:
        if batch >= self.batches_in(epoch):
            return None
        key = (epoch, batch, self.bad_records)
        fut = self._ahead.get(key)
        if fut is None:
            records, seeds = self.batch_items(epoch, batch)
            fut = self._ahead[key] = self.reader.submit(records, seeds, self.train)
        return fut

    def _source(self):
        """DALI's external source: the next batch of the stream, or StopIteration at the epoch's end."""
        epoch, batch = self._feed_at
        if self._feed_stop or batch >= self.batches_in(epoch):
            raise StopIteration
        while True:
            handle = self._submit(epoch, batch)
            read = handle.result()
            self._ahead.pop((epoch, batch, self.bad_records), None)
            if not read.bad:
                break
            # Unreadable records: leave them out; this batch and all later ones change.
            self.reader.release(handle)
            self._drop_ahead()
            for record, reason in read.bad:
                self.skip(record, reason)
            if batch >= self.batches_in(epoch):
                raise StopIteration
        self._fed.append(
            _Batch(
                epoch,
                batch,
                self.batch_items(epoch, batch)[0],
                read.labels,
                read.payloads,
                handle,
                read.mirror,
            )
        )
        self._feed_at = (epoch, batch + 1)
        for ahead in range(batch + 1, batch + 1 + READ_AHEAD):
            self._submit(epoch, ahead)
        if self.resizes_in_torch:
            return read.payloads, read.roi_start, read.roi_end
        if self.train:
            return read.payloads, read.roi_start, read.roi_end, read.mirror
        return (read.payloads,)

    # -- positioning -----------------------------------------------------------------------
    def _forget_fed(self) -> None:
        while self._fed:
            self.reader.release(self._fed.popleft().read)

    def _drop_ahead(self) -> None:
        for handle in self._ahead.values():
            self.reader.release(handle)
        self._ahead.clear()

    def _discard_pipeline(self) -> None:
        self._pipe, self._pipe_dirty = None, False
        self._forget_fed()

    def _settle(self) -> None:
        """Bring a used pipeline back to an epoch start: deliver (and drop) what is in flight, reset."""
        if self._pipe is None or not self._pipe_dirty:
            return
        self._feed_stop = True
        try:
            self._pipe.schedule_run()  # lets the source say StopIteration if it has not yet
            while not self._pipe.empty():
                self._pipe.outputs()
            self._pipe.reset()
            self._pipe_dirty = False
            self._forget_fed()
        except Exception:  # a bad record in a dropped batch, say: a new pipeline is cheaper than care
            self._discard_pipeline()
        finally:
            self._feed_stop = False

    def _start(self) -> None:
        self._settle()
        self._feed_at = (self.epoch, self.batch)
        self._iter = True  # positioned; the pipeline itself is built on first use

    def _drop_iterator(self) -> None:
        super()._drop_iterator()
        self._drop_ahead()

    # -- iteration -------------------------------------------------------------------------
    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        from nvidia.dali.plugin.pytorch.torch_utils import to_torch_tensor

        while True:
            if self._pipe is None:
                self._pipe = self._build_pipeline()
            try:
                self._pipe_dirty = True
                self._pipe.schedule_run()
                out = self._pipe.outputs()
            except (BadRecordLimitError, ReaderDiedError, KeyboardInterrupt):
                self._discard_pipeline()
                raise
            except RuntimeError:
                # DALI stops the whole pipeline for one undecodable image and does not say which.
                suspects = list(self._fed)
                self._fed.clear()  # their buffers are released once the suspects are checked
                self._discard_pipeline()
                self._drop_ahead()
                bad = self._find_undecodable(suspects)
                for entry in suspects:
                    self.reader.release(entry.read)
                if not bad:
                    raise
                for record, reason in bad:
                    self.skip(record, reason)
                if self.batch >= self.batches_in(self.epoch):
                    raise StopIteration from None
                self._feed_at = (self.epoch, self.batch)
                continue
            entry = self._fed.popleft()
            self.reader.release(entry.read)  # DALI copied its images when the source returned
            if (entry.epoch, entry.index) != (self.epoch, self.batch):  # a bookkeeping bug, never data
                raise RuntimeError(
                    f"DALI delivered batch {entry.index} of epoch {entry.epoch}, "
                    f"expected {self.batch} of {self.epoch}"
                )
            if self.resizes_in_torch:
                crops = out[0]
                images = self.resizer(
                    [np.asarray(crops[i]) for i in range(len(crops))], entry.mirror, self.input_size
                )
            else:
                images = to_torch_tensor(out[0].as_tensor(), copy=True)
            return images, torch.from_numpy(entry.labels)

    # -- undecodable records ---------------------------------------------------------------
    def _find_undecodable(self, suspects: list[_Batch]) -> list[tuple[int, str]]:
        """Decode each image of the batches in flight alone, with the same decoder: the ones that fail."""
        from nvidia.dali import Pipeline, fn, types

        if not suspects:
            return []
        LOG.info(
            "DALI failed to decode a batch on rank %d; decoding its %d images one by one to find the bad one",
            self.rank,
            sum(len(s.payloads) for s in suspects),
        )

        def probe_pipe():
            pipe = Pipeline(batch_size=1, num_threads=1, device_id=self._device_id(), prefetch_queue_depth=1)
            with pipe:
                jpegs = fn.external_source(name="jpegs", dtype=types.UINT8, ndim=1)
                pipe.set_outputs(fn.decoders.image(jpegs, **self._decoder_args(probe=True)))
            pipe.build()
            return pipe

        found = []
        pipe = None
        for batch in suspects:
            for record, payload in zip(batch.records.tolist(), batch.payloads):
                pipe = pipe or probe_pipe()
                try:
                    pipe.run(jpegs=[payload])
                except RuntimeError as e:
                    found.append((record, f"DALI cannot decode its image ({_dali_reason(e)})"))
                    pipe = None  # a failed pipeline is unusable
            if found:  # DALI reports a failure at the batch it belongs to
                break
        return found


def _dali_reason(error: Exception) -> str:
    """The line of a DALI error that says what went wrong (its text is mostly a traceback)."""
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    useful = [
        ln
        for ln in lines
        if "failure" in ln.lower() or ("error" in ln.lower() and "pipeline" not in ln.lower())
    ]
    return (useful or lines or ["unknown error"])[-1][:200]


def build_loader(
    data,
    batch_size: int,
    input_size: int = 224,
    train: bool = True,
    backend: str = "dali",
    device: str | torch.device = "auto",
    num_threads: int = 4,
    rank: int | None = None,
    world_size: int | None = None,
    seed: int = 0,
    all_captions: bool = False,
    drop_last: bool | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    max_bad_records: int = DEFAULT_MAX_BAD_RECORDS,
    reader_workers: int | None = None,
) -> BaseLoader:
    """A loader over the shards named by `data` (prefix, .rec, folder, glob, or a list).

    Raises `ShardError` (one-line message) for missing, empty or unmatched input, and for
    shards whose first or last record is not an image-caption record (classification
    records, captions of another context length, an index that belongs to another .rec).
    A record that cannot be read or decoded later is skipped and named once; more than
    `max_bad_records` of them raise `BadRecordLimitError`. The DALI backend reads records in
    `reader_workers` processes (0: a thread of this process; None: `auto_reader_workers()`).
    Building is cheap: shards are
    indexed (or the cached index is read) and probed, but no pipeline or worker starts
    before the first iteration.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: use {' or '.join(BACKENDS)}")
    shardset = load_shards(data, cache_dir=cache_dir)
    probe_shards(shardset)
    rank, world_size = dist_env(rank, world_size)
    args = (
        shardset,
        batch_size,
        input_size,
        train,
        resolve_device(device),
        num_threads,
        rank,
        world_size,
        seed,
        all_captions,
        train if drop_last is None else drop_last,
        max_bad_records,
    )
    if backend == "torch":
        return TorchLoader(*args)
    return DaliLoader(*args, reader_workers=reader_workers)
