"""Pure-PyTorch fallback loader over the same `.rec/.idx` shards (no DALI needed).

For machines where DALI does not install (macOS, Windows). It reads records with
dataloaders/records.py, decodes with PIL and applies the DALI pipeline's transforms:
the crop box and flip of the sample's own seed from src/open_alip/crops.py (those the
DALI backend gets) applied with `transform.resize_box_pil`, CLIP normalisation; eval: shorter side resize
and centre crop. Batches hold the records BaseLoader assigns,
so both backends deliver the same records, crops and captions.

A record a worker cannot read or decode comes back marked instead of raising; the
loader skips it (BaseLoader.skip) and restarts its workers at the same batch, whose
stream has that record left out.
"""

from __future__ import annotations

import gc
import io
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from dataloaders.base import BaseLoader
from dataloaders.records import BadRecord, RecordReader
from dataloaders.shards import ShardSet
from src.open_alip.constants import CLIP_MEAN, CLIP_STD
from src.open_alip.crops import crop_and_flip
from src.open_alip.transform import resize_box_pil

__all__ = ["RecordDataset", "TorchLoader"]

# The CLIP mean and std on the 0-255 pixel scale, float32: what both backends normalise with.
PIXEL_MEAN = np.asarray(CLIP_MEAN, np.float32) * 255
PIXEL_STD = np.asarray(CLIP_STD, np.float32) * 255


def normalize_pixels(img: Image.Image) -> torch.Tensor:
    """float32 [3, H, W]: an RGB image's pixels normalised with the CLIP mean and std."""
    pixels = (np.asarray(img, dtype=np.float32) - PIXEL_MEAN) / PIXEL_STD
    return torch.from_numpy(pixels.transpose(2, 0, 1).copy())


class RecordDataset(Dataset):
    """(record, augmentation seed) -> (image float32 [3, S, S], label float32 [K*77]), or, for a
    record that cannot be used, (None, record, reason)."""

    def __init__(self, shardset: ShardSet, input_size: int, train: bool) -> None:
        self.shardset = shardset
        self.input_size = input_size
        self.train = train
        self.reader = RecordReader(shardset)

    def __len__(self) -> int:
        return self.shardset.total_records

    def read(self, record: int) -> tuple[np.ndarray, bytes]:
        """The label array and image bytes of record number `record` (BadRecord if unusable)."""
        return self.reader.read(record)

    def transform(self, img: Image.Image, aug_seed: int) -> torch.Tensor:
        size = self.input_size
        if self.train:
            *box, mirror = crop_and_flip(img.width, img.height, aug_seed)
            img = resize_box_pil(img, size, tuple(box), mirror)
        else:
            scale = size / min(img.width, img.height)
            new = (max(size, round(img.width * scale)), max(size, round(img.height * scale)))
            img = img.resize(new, Image.BILINEAR)
            left, top = (new[0] - size) // 2, (new[1] - size) // 2
            img = img.crop((left, top, left + size, top + size))
        return normalize_pixels(img)

    def __getitem__(self, item: tuple[int, int]):
        record, aug_seed = item
        try:
            label, payload = self.read(record)
        except BadRecord as e:
            return None, record, e.reason
        try:
            with Image.open(io.BytesIO(payload)) as img:
                img = img.convert("RGB")
        except Exception as e:  # PIL raises many kinds for undecodable data
            text = str(e).splitlines()[0] if str(e) else type(e).__name__
            return None, record, f"PIL cannot decode its image ({text})"
        return self.transform(img, aug_seed), torch.from_numpy(label)


def _collate(items: list) -> tuple[torch.Tensor | None, torch.Tensor | None, list[tuple[int, str]]]:
    bad = [(item[1], item[2]) for item in items if item[0] is None]
    good = [i for i in items if i[0] is not None]
    if bad or not good:
        return None, None, bad  # the loader skips and asks again: no point stacking this batch
    images = torch.stack([im for im, _ in good])
    # Records with fewer captions are padded with empty (all-zero) ones, as in the DALI backend.
    width = max(lab.numel() for _, lab in good)
    labels = torch.zeros(len(good), width, dtype=torch.float32)
    for i, (_, lab) in enumerate(good):
        labels[i, : lab.numel()] = lab
    return images, labels, bad


class TorchLoader(BaseLoader):
    """torch.utils.data loader with the same contract as the DALI loader."""

    backend = "torch"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dataset = RecordDataset(self.shardset, self.input_size, self.train)

    def epoch_batches(self, epoch: int, start: int = 0) -> list[list[tuple[int, int]]]:
        """The (record, augmentation seed) items of batches `start`.. of `epoch` on this rank."""
        return [
            list(zip(*(a.tolist() for a in self.batch_items(epoch, b))))
            for b in range(start, self.batches_in(epoch))
        ]

    def _start(self) -> None:
        workers = max(0, self.num_threads)
        if workers:
            # Garbage left in this process would be collected in the forked workers: a DALI
            # pipeline among it would wait there forever for threads the fork did not copy.
            gc.collect()
        loader = DataLoader(
            self.dataset,
            batch_sampler=self.epoch_batches(self.epoch, self.batch),
            num_workers=workers,
            collate_fn=_collate,
            pin_memory=self.device.type == "cuda",
            prefetch_factor=4 if workers else None,
        )
        self._iter = iter(loader)

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        while True:
            images, labels, bad = next(self._iter)
            if not bad:
                return images.to(self.device, non_blocking=True), labels
            # Every batch behind this one shifts: restart the workers on the new stream.
            self._drop_iterator()
            for record, reason in bad:
                self.skip(record, reason)
            if self.batch >= self.batches_in(self.epoch):
                raise StopIteration
            self._start()
