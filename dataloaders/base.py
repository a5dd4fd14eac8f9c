"""What both loader backends share: per-rank record ranges, seeds, caption choice, epoch
bookkeeping and resume state.

`BaseLoader` counts batches itself, not the backend, which is what makes `len()`, resume and
epoch ends agree between the DALI backend (dataloaders/imagenet.py) and the PyTorch one
(dataloaders/torch_loader.py). Both import this module; neither imports the other.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from dataloaders.shards import ShardError, ShardSet
from src.errors import UserError
from src.open_alip.constants import CONTEXT_LENGTH

# Streams of randomness drawn from one (seed, epoch, rank, world) tuple.
_SEED_PIPE, _SEED_READER, _SEED_CROP, _SEED_FLIP, _SEED_ORDER, _SEED_AUG = range(6)
_SEED_CAPTION_BASE = 1 << 20  # + batch number: one caption stream per batch


class CorruptRecordError(UserError):
    """A record's image could not be decoded; the message names the shard and record."""


def derive_seed(*parts: int) -> int:
    """A 31-bit seed that is a pure function of `parts` (DALI wants non-negative ints)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0] >> 1)


def dist_env(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world_size): arguments win, then torchrun's environment, then 0/1."""
    env = os.environ
    world = int(world_size if world_size is not None else env.get("WORLD_SIZE", 1))
    rank = int(rank if rank is not None else env.get("RANK", 0))
    if world < 1 or not 0 <= rank < world:
        raise ShardError(f"rank {rank} / world_size {world}: need 0 <= rank < world_size")
    return rank, world


def shard_range(total: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """Records [lo, hi) of shard `shard_id`, split exactly as DALI's readers split them."""
    return total * shard_id // num_shards, total * (shard_id + 1) // num_shards


def select_captions(labels: torch.Tensor, seed: int, all_captions: bool = False) -> torch.Tensor:
    """Token ids from the float label arrays [B, K*77]: one non-empty caption per sample.

    The choice is uniform among a sample's non-empty captions (start token present)
    and is made on the labels' device for the whole batch at once.
    """
    if labels.ndim != 2 or labels.shape[1] % CONTEXT_LENGTH or labels.shape[1] == 0:
        raise ValueError(f"labels of shape {tuple(labels.shape)}: expected [B, K*{CONTEXT_LENGTH}] caption tokens")
    b = labels.shape[0]
    tokens = labels.reshape(b, -1, CONTEXT_LENGTH).to(torch.int64)
    if all_captions:
        return tokens
    gen = torch.Generator(device=tokens.device).manual_seed(seed)
    scores = torch.rand(tokens.shape[:2], generator=gen, device=tokens.device)
    # The largest of independent uniforms is equally likely to be any present caption.
    scores = scores.masked_fill(tokens[:, :, 0] == 0, -1.0)
    choice = scores.argmax(dim=1)
    return tokens[torch.arange(b, device=tokens.device), choice]


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
        device: torch.device,
        num_threads: int,
        rank: int,
        world_size: int,
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
        self.rank, self.world_size = rank, world_size
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
                raise ShardError(
                    f"loader state has {name}={state[name]!r} but this loader has {getattr(self, name)!r}; "
                    "resume with the same data, batch size, seed and number of processes"
                )
        if not 0 <= int(state["batch"]) <= self._len:
            raise ShardError(f"loader state batch {state['batch']} is outside this epoch's 0..{self._len}")
        self._drop_iterator()
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])


