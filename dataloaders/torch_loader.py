"""Pure-PyTorch fallback loader over the same `.rec/.idx` shards (no DALI needed).

For machines where DALI does not install (macOS, Windows). It reads records with
`src.recordio`, decodes with PIL and applies the DALI pipeline's transforms
(src/open_alip/transform.py: random-resized crop over area [0.7, 1] and aspect [0.8, 1.25],
resize, flip with p=0.5, CLIP normalisation; eval: shorter side resize and centre crop). Each rank
reads the same record range as the DALI backend and chooses captions with the
same per-batch seeds, so both backends give the same captions for the same
records. Augmentation parameters are drawn per sample from (seed, epoch, rank,
position), so results do not depend on the number of workers, and a mid-epoch
resume skips the consumed batches without decoding them.
"""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from dataloaders.base import _SEED_AUG, _SEED_ORDER, BaseLoader, CorruptRecordError
from dataloaders.shards import ShardSet

# Records are read by byte offset, not through MXIndexedRecordIO by key: that would parse
# each shard's whole index into a dict per worker, ~1.5 GB per worker at 15M records.
from src.open_alip.constants import CLIP_MEAN, CLIP_STD
from src.open_alip.transform import augment_pil
from src.recordio import read_record_at, unpack

__all__ = ["RecordDataset", "TorchLoader"]

_MEAN = np.asarray(CLIP_MEAN, np.float32) * 255
_STD = np.asarray(CLIP_STD, np.float32) * 255


class RecordDataset(Dataset):
    """Record `i` of a ShardSet -> (image float32 [3, S, S], label float32 [K*77]).

    Items are addressed by (record, augmentation seed) pairs so that a sample's crop
    and flip do not depend on which worker process decodes it.
    """

    def __init__(self, shardset: ShardSet, input_size: int, train: bool) -> None:
        self.shardset = shardset
        self.input_size = input_size
        self.train = train
        self._handles: dict[int, Any] = {}
        self._pid = os.getpid()

    def __len__(self) -> int:
        return self.shardset.total_records

    def __getstate__(self) -> dict[str, Any]:
        # Worker processes open their own file handles.
        state = dict(self.__dict__)
        state["_handles"] = {}
        return state

    def _file(self, shard: int):
        if self._pid != os.getpid():
            self._handles, self._pid = {}, os.getpid()
        handle = self._handles.get(shard)
        if handle is None:
            handle = self._handles[shard] = open(self.shardset.shards[shard].rec, "rb")
        return handle

    def read(self, record: int) -> tuple[np.ndarray, bytes]:
        """The label array and image bytes of record number `record`."""
        shard = int(np.searchsorted(self.shardset.starts, record, side="right")) - 1
        offset = int(self.shardset.offsets[record])
        data = read_record_at(self._file(shard), offset, str(self.shardset.shards[shard].rec))
        header, payload = unpack(data)
        label = np.array(header.label, dtype=np.float32).reshape(-1)  # a writable copy
        return label, payload

    def __getitem__(self, item: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        record, aug_seed = item
        label, payload = self.read(record)
        try:
            with Image.open(io.BytesIO(payload)) as img:
                img = img.convert("RGB")
        except Exception as e:
            shard, key, offset = self.shardset.locate(record)
            raise CorruptRecordError(
                f"undecodable image in {shard.rec} record key {key} at byte {offset} ({e}). "
                "Check the shard with data2rec's verification and reconvert it, or leave it out of --data"
            ) from None
        size = self.input_size
        if self.train:
            img = augment_pil(img, size, np.random.default_rng(aug_seed))
        else:
            scale = size / min(img.width, img.height)
            new = (max(size, round(img.width * scale)), max(size, round(img.height * scale)))
            img = img.resize(new, Image.BILINEAR)
            left, top = (new[0] - size) // 2, (new[1] - size) // 2
            img = img.crop((left, top, left + size, top + size))
        pixels = (np.asarray(img, dtype=np.float32) - _MEAN) / _STD
        return torch.from_numpy(pixels.transpose(2, 0, 1).copy()), torch.from_numpy(label)


def _collate(items: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.stack([im for im, _ in items])
    # Records with fewer captions are padded with empty (all-zero) ones, as in the DALI pipeline.
    width = max(lab.numel() for _, lab in items)
    labels = torch.zeros(len(items), width, dtype=torch.float32)
    for i, (_, lab) in enumerate(items):
        labels[i, : lab.numel()] = lab
    return images, labels


class TorchLoader(BaseLoader):
    """torch.utils.data loader with the same contract as the DALI loader."""

    backend = "torch"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dataset = RecordDataset(self.shardset, self.input_size, self.train)

    def epoch_batches(self, epoch: int) -> list[list[tuple[int, int]]]:
        """The (record, augmentation seed) items of each batch of `epoch` on this rank."""
        lo, hi = self.record_range(epoch)
        records = np.arange(lo, hi)
        if self.train:
            records = np.random.default_rng(self.seed_for(epoch, _SEED_ORDER)).permutation(records)
        records = records[: self.num_samples]
        aug = np.random.default_rng(self.seed_for(epoch, _SEED_AUG)).integers(0, 2**63 - 1, len(records))
        items = list(zip(records.tolist(), aug.tolist()))
        b = self.batch_size
        return [items[i : i + b] for i in range(0, len(items), b)][: self._len]

    def _start(self) -> None:
        batches = self.epoch_batches(self.epoch)[self.batch :]
        workers = max(0, self.num_threads)
        loader = DataLoader(
            self.dataset,
            batch_sampler=batches,
            num_workers=workers,
            collate_fn=_collate,
            pin_memory=self.device.type == "cuda",
            prefetch_factor=4 if workers else None,
        )
        self._iter = iter(loader)

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            images, labels = next(self._iter)
        except CorruptRecordError as e:
            # A worker's error arrives wrapped in its traceback; keep the one line that matters.
            lines = [ln for ln in str(e).splitlines() if "CorruptRecordError: " in ln]
            if not lines:
                raise
            raise CorruptRecordError(lines[-1].split("CorruptRecordError: ", 1)[1]) from None
        return images.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
