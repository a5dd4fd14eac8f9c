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

from dataloaders.shards import ShardError, ShardSet, load_shards

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "CTX_LEN",
    "CorruptRecordError",
    "DaliLoader",
    "build_loader",
    "select_captions",
]

CTX_LEN = 77
SOT_TOKEN, EOT_TOKEN, VOCAB_SIZE = 49406, 49407, 49408
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
# The original RWKV-CLIP training crop.
TRAIN_AREA = (0.7, 1.0)
TRAIN_ASPECT = (0.8, 1.25)
DEFAULT_SHUFFLE_BUFFER = 16384

# Streams of randomness drawn from one (seed, epoch, rank, world) tuple.
_SEED_PIPE, _SEED_READER, _SEED_CROP, _SEED_FLIP, _SEED_ORDER, _SEED_AUG = range(6)
_SEED_CAPTION_BASE = 1 << 20  # + batch number: one caption stream per batch


class CorruptRecordError(RuntimeError):
    """A record's image could not be decoded; the message names the shard and record."""


def derive_seed(*parts: int) -> int:
    """A 31-bit seed that is a pure function of `parts` (DALI wants non-negative ints)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0] >> 1)


def dist_env(rank: int | None, world_size: int | None) -> tuple[int, int, int]:
    """(rank, world_size, local_rank): arguments win, then torchrun's environment, then 0/1/0."""
    env = os.environ
    world = int(world_size if world_size is not None else env.get("WORLD_SIZE", 1))
    rank = int(rank if rank is not None else env.get("RANK", 0))
    # Without torchrun's LOCAL_RANK, ranks of one machine take its GPUs in turn.
    local_rank = int(env.get("LOCAL_RANK", rank % max(1, torch.cuda.device_count())))
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} / world_size {world}: need 0 <= rank < world_size")
    return rank, world, local_rank


def shard_range(total: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """Records [lo, hi) of shard `shard_id`, split exactly as DALI's readers split them."""
    return total * shard_id // num_shards, total * (shard_id + 1) // num_shards


def select_captions(labels: torch.Tensor, seed: int, all_captions: bool = False) -> torch.Tensor:
    """Token ids from the float label arrays [B, K*77]: one non-empty caption per sample.

    The choice is uniform among a sample's non-empty captions (start token present)
    and is made on the labels' device for the whole batch at once.
    """
    if labels.ndim != 2 or labels.shape[1] % CTX_LEN or labels.shape[1] == 0:
        raise ValueError(f"labels of shape {tuple(labels.shape)}: expected [B, K*{CTX_LEN}] caption tokens")
    b = labels.shape[0]
    tokens = labels.reshape(b, -1, CTX_LEN).to(torch.int64)
    if all_captions:
        return tokens
    gen = torch.Generator(device=tokens.device).manual_seed(seed)
    scores = torch.rand(tokens.shape[:2], generator=gen, device=tokens.device)
    # The largest of independent uniforms is equally likely to be any present caption.
    scores = scores.masked_fill(tokens[:, :, 0] == 0, -1.0)
    choice = scores.argmax(dim=1)
    return tokens[torch.arange(b, device=tokens.device), choice]


def _auto_device(device: str) -> str:
    if device not in ("auto", "cpu", "gpu"):
        raise ValueError(f"device {device!r}: use auto, cpu or gpu")
    if device == "auto":
        return "gpu" if torch.cuda.is_available() else "cpu"
    if device == "gpu" and not torch.cuda.is_available():
        raise ValueError("device 'gpu' asked for but torch sees no CUDA GPU; use --device cpu")
    return device


class BaseLoader:
    """What both backends share: per-rank ranges, epoch/batch bookkeeping, captions, state.

    A backend supplies `_start` (build this epoch's iterator in `self._iter`, positioned
    at batch `self.batch`) and `_next_batch` (the next (images, labels) on the loader's
    device, its own errors translated); it extends `_drop_iterator` if it holds more
    than `self._iter`. Counting batches here, not in the backend, is what makes
    `len()`, resume and epoch ends agree between backends.
    """

    backend = "base"

    def __init__(
        self,
        shardset: ShardSet,
        batch_size: int,
        input_size: int,
        train: bool,
        device: str,
        num_threads: int,
        rank: int,
        world_size: int,
        local_rank: int,
        seed: int,
        all_captions: bool,
        drop_last: bool,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size}: must be at least 1")
        if input_size < 1:
            raise ValueError(f"input_size {input_size}: must be at least 1")
        self.shardset = shardset
        self.batch_size = batch_size
        self.input_size = input_size
        self.train = train
        self.device = device
        self.num_threads = num_threads
        self.rank, self.world_size, self.local_rank = rank, world_size, local_rank
        self.seed = seed
        self.all_captions = all_captions
        self.drop_last = drop_last
        self.total_records = shardset.total_records
        if drop_last:
            # Every rank yields the same number of batches, or DDP would wait forever.
            self._per_rank = self.total_records // world_size
            self._len = self._per_rank // batch_size
            self.num_samples = self._len * batch_size
        else:
            lo, hi = shard_range(self.total_records, rank, world_size)
            self._per_rank = hi - lo
            self._len = -(-self._per_rank // batch_size)
            self.num_samples = self._per_rank
        if self._len == 0:
            raise ShardError(
                f"{self.total_records} records over {world_size} rank(s) make no full batch of {batch_size}; "
                "lower --batch-size or add data"
            )
        self.epoch = 0
        self.batch = 0  # batches of `epoch` already handed out
        self._iter: Any = None

    @property
    def torch_device(self) -> torch.device:
        return torch.device(f"cuda:{self.local_rank}") if self.device == "gpu" else torch.device("cpu")

    def __len__(self) -> int:
        return self._len

    def shard_id(self, epoch: int) -> int:
        # Training ranks move to the next block of records each epoch, as DALI's
        # stick_to_shard=False would, so no rank is tied to one subset of the data.
        return (self.rank + epoch) % self.world_size if self.train else self.rank

    def record_range(self, epoch: int) -> tuple[int, int]:
        return shard_range(self.total_records, self.shard_id(epoch), self.world_size)

    def seed_for(self, epoch: int, stream: int) -> int:
        return derive_seed(self.seed, epoch, self.rank, self.world_size, stream)

    def tokens_for(self, labels: torch.Tensor, epoch: int, batch: int) -> torch.Tensor:
        return select_captions(labels, self.seed_for(epoch, _SEED_CAPTION_BASE + batch), self.all_captions)

    def _drop_iterator(self) -> None:
        """Discard the running epoch's machinery (the next iteration rebuilds it)."""
        self._iter = None

    def _start(self) -> None:
        raise NotImplementedError

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __iter__(self):
        if self._iter is None:
            self._start()
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        # Ending on the count, not when the backend runs dry, keeps len() exact and ends
        # the epoch at once when a resume restored a position after its last batch.
        if self.batch >= self._len:
            self._finish_epoch()
            raise StopIteration
        if self._iter is None:
            self._start()
        images, labels = self._next_batch()
        tokens = self.tokens_for(labels, self.epoch, self.batch)
        self.batch += 1
        return images, tokens

    def set_epoch(self, epoch: int) -> None:
        """Start epoch `epoch` at its first batch on the next iteration."""
        if epoch != self.epoch or self.batch:
            self._drop_iterator()
        self.epoch, self.batch = int(epoch), 0

    def reset(self) -> None:
        """End the current epoch now; the next iteration starts the following one."""
        self._drop_iterator()
        if self.batch:
            self.epoch, self.batch = self.epoch + 1, 0

    def _finish_epoch(self) -> None:
        self._drop_iterator()
        self.epoch, self.batch = self.epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        # After the last batch of an epoch the position is the start of the next one.
        done = self.batch >= self._len
        return {
            "backend": self.backend,
            "epoch": self.epoch + 1 if done else self.epoch,
            "batch": 0 if done else self.batch,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
            "batch_size": self.batch_size,
            "total_records": self.total_records,
            "train": self.train,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name in ("seed", "rank", "world_size", "batch_size", "total_records", "train"):
            if name in state and state[name] != getattr(self, name):
                raise ValueError(
                    f"loader state has {name}={state[name]!r} but this loader has {getattr(self, name)!r}; "
                    "resume with the same data, batch size, seed and number of processes"
                )
        if not 0 <= int(state["batch"]) <= self._len:
            raise ValueError(f"loader state batch {state['batch']} is outside this epoch's 0..{self._len}")
        self._drop_iterator()
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


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
        gpu = self.device == "gpu"
        pipe = Pipeline(
            batch_size=self.batch_size,
            num_threads=max(1, self.num_threads),
            device_id=self.local_rank if gpu else None,
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
                    num_attempts=10,
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
    device: str = "auto",
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
    rank, world_size, local_rank = dist_env(rank, world_size)
    args = (shardset, batch_size, input_size, train, _auto_device(device), num_threads,
            rank, world_size, local_rank, seed, all_captions, train if drop_last is None else drop_last)
    if backend == "torch":
        from dataloaders.torch_loader import TorchLoader

        return TorchLoader(*args)
    return DaliLoader(*args, shuffle_buffer=shuffle_buffer)
