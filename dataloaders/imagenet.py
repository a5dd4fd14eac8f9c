"""The training/evaluation data loader: `.rec/.idx` shards -> (images, caption token ids).

`build_loader` returns an iterable the trainer consumes as
`for images, tokens in loader`: images float32 [B, 3, S, S] normalised with the
CLIP mean/std on the loader's device, tokens int64 [B, 77] (one caption per
sample, drawn uniformly among its non-empty ones) or [B, K, 77] with
`all_captions`. Two backends read the same files in the same per-rank record
ranges: DALI (this module; `fn.readers.mxnet`, GPU decoding when there is a
GPU) and a pure-PyTorch fallback (`dataloaders.torch_loader`) for machines
where DALI does not install.

Determinism: everything random in an epoch (shuffle, crops, flips, caption
choice) is seeded from (seed, epoch, rank, world_size), and the DALI pipeline is
rebuilt at each epoch with those seeds, so `set_epoch(e)` reproduces epoch `e`
without replaying the earlier ones. Mid-epoch resume restores a DALI pipeline
checkpoint (readers and random ops both support it in DALI 2.4); if a checkpoint
cannot be restored the loader replays the consumed batches instead (costs the
time of decoding them once).

DALI is imported only when a DALI pipeline is built, so the fallback backend and
the helpers here work without it.
"""

from __future__ import annotations

import io
import os
import sys
import warnings
from typing import Any

import numpy as np
import torch

from dataloaders.base import (
    _SEED_CROP,
    _SEED_FLIP,
    _SEED_PIPE,
    _SEED_READER,
    BaseLoader,
    CorruptRecordError,
    dist_env,
    select_captions,
)
from dataloaders.shards import load_shards
from dataloaders.torch_loader import TorchLoader
from src.devices import resolve_device
from src.open_alip.constants import CLIP_MEAN, CLIP_STD
from src.open_alip.transform import TRAIN_AREA, TRAIN_ASPECT, TRAIN_CROP_ATTEMPTS

__all__ = ["CorruptRecordError", "DaliLoader", "build_loader", "select_captions"]

DEFAULT_SHUFFLE_BUFFER = 16384


class DaliLoader(BaseLoader):
    """DALI pipeline over `.rec` shards, wrapped like the original DALIWarper."""

    backend = "dali"

    def __init__(self, *args: Any, shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shuffle_buffer = shuffle_buffer
        self._pipe = None
        self._checkpoint: str | None = None  # to restore on the next pipeline build

    # -- pipeline --------------------------------------------------------------------------
    def _build_pipeline(self, epoch: int, checkpoint: str | None = None, probe: bool = False):
        from nvidia.dali import Pipeline, fn, types

        lo, hi = self.record_range(epoch)
        gpu = self.device.type == "cuda"
        pipe = Pipeline(
            batch_size=self.batch_size,
            num_threads=max(1, self.num_threads),
            device_id=self.device.index if gpu else None,
            seed=self.seed_for(epoch, _SEED_PIPE),
            enable_checkpointing=not probe,
            checkpoint=checkpoint,
        )
        with pipe:
            jpegs, labels = fn.readers.mxnet(
                path=[str(s.rec) for s in self.shardset.shards],
                index_path=[str(self.shardset.index_path)],
                shard_id=self.shard_id(epoch),
                num_shards=self.world_size,
                stick_to_shard=True,
                random_shuffle=self.train,
                initial_fill=max(1, min(self.shuffle_buffer, hi - lo)),
                pad_last_batch=not self.drop_last,
                seed=self.seed_for(epoch, _SEED_READER),
                name="reader",
            )
            if probe:
                pipe.set_outputs(jpegs, labels)
                return pipe
            decoder = "mixed" if gpu else "cpu"
            size = self.input_size
            if self.train:
                images = fn.decoders.image_random_crop(
                    jpegs,
                    device=decoder,
                    output_type=types.RGB,
                    random_area=list(TRAIN_AREA),
                    random_aspect_ratio=list(TRAIN_ASPECT),
                    num_attempts=TRAIN_CROP_ATTEMPTS,
                    seed=self.seed_for(epoch, _SEED_CROP),
                )
                images = fn.resize(images, resize_x=size, resize_y=size, interp_type=types.INTERP_LINEAR)
                mirror = fn.random.coin_flip(probability=0.5, seed=self.seed_for(epoch, _SEED_FLIP))
            else:
                images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB)
                images = fn.resize(images, resize_shorter=size, interp_type=types.INTERP_LINEAR)
                mirror = 0
            images = fn.crop_mirror_normalize(
                images,
                dtype=types.FLOAT,
                output_layout="CHW",
                crop=(size, size),
                mean=[m * 255 for m in CLIP_MEAN],
                std=[s * 255 for s in CLIP_STD],
                mirror=mirror,
            )
            # Shards may hold different numbers of captions per record; shorter label
            # arrays get zero (empty) captions so the batch is one tensor.
            labels = fn.pad(labels, fill_value=0)
            pipe.set_outputs(images, labels.gpu() if gpu else labels)
        return pipe

    def _make_iterator(self, pipe):
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        policy = LastBatchPolicy.DROP if self.drop_last else LastBatchPolicy.PARTIAL
        return DALIGenericIterator(
            [pipe], ["images", "labels"], reader_name="reader", last_batch_policy=policy, auto_reset=False
        )

    def _start(self) -> None:
        checkpoint, self._checkpoint = self._checkpoint, None
        if self.batch and checkpoint is not None:
            try:
                self._pipe = self._build_pipeline(self.epoch, checkpoint=checkpoint)
                self._iter = self._make_iterator(self._pipe)
                return
            except RuntimeError as e:
                warnings.warn(
                    f"could not restore the DALI checkpoint ({str(e).splitlines()[0]}); "
                    f"replaying {self.batch} batches instead",
                    stacklevel=3,
                )
        self._pipe = self._build_pipeline(self.epoch)
        try:
            self._iter = self._make_iterator(self._pipe)
            # Without a checkpoint, replay the consumed batches: same seeds, same batches.
            for _ in range(self.batch):
                next(self._iter)
        except RuntimeError as e:
            raise self._diagnose(e, self.batch) from None

    def _drop_iterator(self) -> None:
        super()._drop_iterator()
        self._pipe = None
        self._checkpoint = None

    # -- iteration -------------------------------------------------------------------------
    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        try:
            out = next(self._iter)[0]
        except StopIteration:
            # The reader ran dry before len() batches: a bookkeeping bug, not an epoch end.
            raise RuntimeError(
                f"DALI reader ended after {self.batch} of {self._len} batches (rank {self.rank})"
            ) from None
        except RuntimeError as e:
            raise self._diagnose(e, self.batch) from None
        return out["images"], out["labels"]

    # -- resume ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["dali_checkpoint"] = None
        if self._iter is not None and 0 < self.batch < self._len:
            state["dali_checkpoint"] = self._iter.checkpoints()[0]
        elif self._checkpoint is not None:
            state["dali_checkpoint"] = self._checkpoint
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("backend") == "dali":
            self._checkpoint = state.get("dali_checkpoint")

    # -- corrupt records -------------------------------------------------------------------
    def _diagnose(self, error: RuntimeError, batch: int) -> RuntimeError:
        """Turn DALI's anonymous decode failure into an error naming shard and record.

        DALI aborts the pipeline without saying which sample failed, so a reader-only
        pipeline with the same seeds replays this epoch's order up to the failing batch
        (reading, not decoding) and each of its samples is checked with PIL.
        """
        text = str(error)
        self._iter = self._pipe = None  # DALI pipelines are unusable after a critical error
        if "decoder" not in text and "nvImageCodec" not in text:
            return error
        where = f"rank {self.rank}, epoch {self.epoch}, batch {batch}"
        print(f"DALI failed to decode an image at {where}; locating the record "
              f"(reading {batch + 1} batches without decoding)...", file=sys.stderr)
        bad = []
        try:
            bad = self._find_undecodable(batch)
        except Exception as e:  # the diagnosis must not hide the original failure
            print(f"could not locate the record: {e}", file=sys.stderr)
        reason = next((ln.strip() for ln in text.splitlines() if "failure" in ln or "rror" in ln), "")
        if bad:
            names = "; ".join(f"{rec} record key {key} at byte {off}" for rec, key, off in bad[:3])
            msg = f"undecodable image in {names} ({where})"
        else:
            msg = f"DALI could not decode an image at {where} ({reason}), and the record was not located"
        return CorruptRecordError(
            msg + ". Check the shard with data2rec's verification and reconvert it, or leave it out of --data"
        )

    def _find_undecodable(self, batch: int) -> list[tuple[str, int, int]]:
        from PIL import Image

        pipe = self._build_pipeline(self.epoch, probe=True)
        pipe.build()
        found = []
        # DALI runs a few iterations ahead; the failing sample is in this batch or the next ones.
        for i in range(batch + 3):
            if i >= self._len:
                break
            jpegs, _ = pipe.run()
            if i < batch:
                continue
            for j in range(len(jpegs)):
                sample = jpegs[j]
                try:
                    with Image.open(io.BytesIO(np.array(sample).tobytes())) as img:
                        img.convert("RGB").load()
                    continue
                except Exception:
                    pass
                rec_name, _, offset = sample.source_info().rpartition(" at index ")
                hit = self.shardset.key_at(rec_name, int(offset)) if offset.isdigit() else None
                if hit is not None:
                    found.append((str(hit[0].rec), hit[1], int(offset)))
            if found:
                break
        return found


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
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
) -> BaseLoader:
    """A loader over the shards named by `data` (prefix, .rec, folder, glob, or a list).

    Raises `ShardError` (one-line message) for missing, empty or unmatched input.
    Building is cheap: shards are indexed (or the cached index is read) but no
    pipeline or worker starts before the first iteration.
    """
    if backend not in ("dali", "torch"):
        raise ValueError(f"backend {backend!r}: use dali or torch")
    shardset = load_shards(data, cache_dir=cache_dir)
    rank, world_size = dist_env(rank, world_size)
    args = (shardset, batch_size, input_size, train, resolve_device(device), num_threads,
            rank, world_size, seed, all_captions, train if drop_last is None else drop_last)
    if backend == "torch":
        return TorchLoader(*args)
    return DaliLoader(*args, shuffle_buffer=shuffle_buffer)
