"""What both loader backends share: per-rank record ranges, the order of an epoch, seeds,
caption choice, skipped records, epoch bookkeeping and resume state.

`BaseLoader` decides which records make each batch and counts batches itself, not the
backend, which is what makes `len()`, resume and epoch ends agree between the DALI backend
(dataloaders/imagenet.py) and the PyTorch one (dataloaders/torch_loader.py): both deliver
the same records in the same batches with the same crops and captions. Both import this
module; neither imports the other.

Skipping a record. An epoch's stream is the rank's records in a seeded order (a full
permutation when training) with the known bad records left out, cut into batches. When a
backend meets a record it cannot read or decode, `skip()` adds it to the bad records and
the backend rebuilds the stream from the same batch on: the records behind it move up by
one, each keeping its own augmentation seed. Leaving a record out before it is reached
gives the same batches as meeting and skipping it, so a resume that knows the bad records
(`state_dict()` lists them) continues exactly, and never meets them again. With
`drop_last` (training) every rank keeps `len()` batches of `batch_size`: records from the
end of the permutation (or, if the rank has none to spare, from its start) fill the gap,
so DDP ranks stay in step.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch

from dataloaders.limits import DEFAULT_MAX_BAD_RECORDS
from dataloaders.shards import ShardError, ShardSet
from src.errors import UserError
from src.open_alip.constants import CONTEXT_LENGTH

LOG = logging.getLogger("dataloaders")


# Streams of randomness drawn from one (seed, epoch, rank, world) tuple: the order of the
# epoch and the per-sample augmentation seeds (the values keep earlier runs' orders).
_SEED_ORDER, _SEED_AUG = 4, 5
_SEED_CAPTION_BASE = 1 << 20  # + batch number: one caption stream per batch


class CorruptRecordError(UserError):
    """A record's image could not be read or decoded; the message names the shard and record."""


class BadRecordLimitError(CorruptRecordError):
    """More bad records than `max_bad_records` allows (one line: how many, the last one, what to do)."""


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
        raise ValueError(
            f"labels of shape {tuple(labels.shape)}: expected [B, K*{CONTEXT_LENGTH}] caption tokens"
        )
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
    at batch `self.batch`) and `_next_batch` (batch `self.batch` of `batch_items`: images
    on the loader's device and float32 labels [B, K*77] on the CPU; records it cannot use
    go through `skip()`); it extends `_drop_iterator` if it holds more than `self._iter`.
    Counting batches here, not in the backend, is what makes `len()`, resume and epoch
    ends agree between backends.
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
        max_bad_records: int = DEFAULT_MAX_BAD_RECORDS,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size {batch_size}: must be at least 1")
        if input_size < 1:
            raise ValueError(f"input_size {input_size}: must be at least 1")
        if max_bad_records < 0:
            raise ValueError(f"max_bad_records {max_bad_records}: must be 0 or more")
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
        self.max_bad_records = int(max_bad_records)
        self._skipped: list[int] = []  # bad record numbers, in the order they became known
        self._skipped_set: set[int] = set()
        self._stream_key: tuple[int, int] | None = None
        self._stream: tuple[np.ndarray, np.ndarray] = (np.empty(0, np.int64), np.empty(0, np.int64))
        self.epoch = 0
        self.batch = 0  # batches of `epoch` already handed out
        self._iter: Any = None

    def __len__(self) -> int:
        return self._len

    def shard_id(self, epoch: int) -> int:
        # Training ranks move to the next block of records each epoch (as DALI's readers do
        # with stick_to_shard=False), so no rank is tied to one subset of the data.
        return (self.rank + epoch) % self.world_size if self.train else self.rank

    def record_range(self, epoch: int) -> tuple[int, int]:
        return shard_range(self.total_records, self.shard_id(epoch), self.world_size)

    def seed_for(self, epoch: int, stream: int) -> int:
        return derive_seed(self.seed, epoch, self.rank, self.world_size, stream)

    def tokens_for(self, labels: torch.Tensor, epoch: int, batch: int) -> torch.Tensor:
        return select_captions(labels, self.seed_for(epoch, _SEED_CAPTION_BASE + batch), self.all_captions)

    # -- the order of an epoch ---------------------------------------------------------------
    def epoch_stream(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(record numbers, augmentation seeds) this rank delivers in `epoch`, in order."""
        key = (epoch, len(self._skipped))
        if self._stream_key == key:
            return self._stream
        lo, hi = self.record_range(epoch)
        records = np.arange(lo, hi, dtype=np.int64)
        if self.train:
            records = np.random.default_rng(self.seed_for(epoch, _SEED_ORDER)).permutation(records)
        # One seed per position of the permutation, so a record keeps its seed when others are skipped.
        seeds = np.random.default_rng(self.seed_for(epoch, _SEED_AUG)).integers(0, 2**63 - 1, len(records))
        if self._skipped_set:
            keep = ~np.isin(records, np.fromiter(self._skipped_set, np.int64))
            records, seeds = records[keep], seeds[keep]
        if self.drop_last:
            need = self._len * self.batch_size
            if len(records) < need:
                if not len(records):
                    raise BadRecordLimitError(
                        f"rank {self.rank}: every record of epoch {epoch} is a known bad record"
                    )
                records, seeds = np.resize(records, need), np.resize(seeds, need)
            records, seeds = records[:need], seeds[:need]
        self._stream_key, self._stream = key, (records, seeds)
        return self._stream

    def batches_in(self, epoch: int) -> int:
        """Batches of `epoch`: len(), or fewer when skips emptied the last one of a non-drop_last epoch."""
        if self.drop_last:
            return self._len
        return min(self._len, -(-len(self.epoch_stream(epoch)[0]) // self.batch_size))

    def batch_items(self, epoch: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
        """(record numbers, augmentation seeds) of batch `batch` of `epoch`."""
        records, seeds = self.epoch_stream(epoch)
        b = self.batch_size
        return records[batch * b : (batch + 1) * b], seeds[batch * b : (batch + 1) * b]

    # -- bad records -------------------------------------------------------------------------
    @property
    def bad_records(self) -> int:
        """How many bad records this loader knows of (skipped here, or listed by a resumed state)."""
        return len(self._skipped)

    @property
    def skipped_records(self) -> list[int]:
        """Their record numbers (positions in the shard set, as `shardset.describe` takes them)."""
        return list(self._skipped)

    def skip(self, record: int, reason: str) -> None:
        """Leave `record` out from now on; name it once; stop past `max_bad_records`."""
        record = int(record)
        if record in self._skipped_set:
            return
        self._skipped.append(record)
        self._skipped_set.add(record)
        where = self.shardset.describe(record)
        count = len(self._skipped)
        if count > self.max_bad_records:
            check = (
                "check the shards with data2rec.py --verify PREFIX --decode and reconvert or leave out the "
                "damaged ones"
            )
            if not self.max_bad_records:
                raise BadRecordLimitError(
                    f"{where}: {reason}; no bad record may be skipped (max_bad_records=0): "
                    f"{check}, or allow some (--max-bad-records N)"
                )
            raise BadRecordLimitError(
                f"rank {self.rank}: {count} unreadable or undecodable record(s), more than max_bad_records="
                f"{self.max_bad_records} allows; the last: {where} ({reason}). "
                f"{check[0].upper()}{check[1:]}, or allow more (--max-bad-records)"
            )
        LOG.warning(
            "rank %d: skipping %s: %s (%d skipped, at most %d allowed)",
            self.rank,
            where,
            reason,
            count,
            self.max_bad_records,
        )

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
        if self.batch >= self.batches_in(self.epoch):
            self._finish_epoch()
            raise StopIteration
        if self._iter is None:
            self._start()
        try:
            images, labels = self._next_batch()
        except StopIteration:  # skips emptied the last batch of an epoch without drop_last
            self._finish_epoch()
            raise
        # Captions are chosen on the CPU (labels never leave it) and the tokens moved once.
        tokens = self.tokens_for(labels, self.epoch, self.batch)
        if self.device.type == "cuda":
            tokens = tokens.pin_memory().to(self.device, non_blocking=True)
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
        done = self.batch >= self.batches_in(self.epoch)
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
            "bad_records": self.bad_records,
            "skipped_records": self.skipped_records,
        }

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Continue from `state_dict()`'s output: this rank's, or every rank's as a list (indexed
        by rank), in which case the bad records all ranks found are left out here too."""
        if isinstance(state, list | tuple):
            if len(state) != self.world_size:
                raise ShardError(
                    f"loader states of {len(state)} ranks but this run has {self.world_size}; "
                    "resume with the same number of processes"
                )
            known = [r for s in state for r in s.get("skipped_records", ())]
            state = state[self.rank]
        else:
            known = list(state.get("skipped_records", ()))
        for name in ("seed", "rank", "world_size", "batch_size", "total_records", "train"):
            if name in state and state[name] != getattr(self, name):
                raise ShardError(
                    f"loader state has {name}={state[name]!r} but this loader has {getattr(self, name)!r}; "
                    "resume with the same data, batch size, seed and number of processes"
                )
        if not 0 <= int(state["batch"]) <= self._len:
            raise ShardError(f"loader state batch {state['batch']} is outside this epoch's 0..{self._len}")
        if any(not 0 <= int(r) < self.total_records for r in known):
            raise ShardError("loader state lists bad records outside this data; resume with the same data")
        self._drop_iterator()
        for record in known:  # no warning: the run that found them named them
            if int(record) not in self._skipped_set:
                self._skipped.append(int(record))
                self._skipped_set.add(int(record))
        self.epoch, self.batch = int(state["epoch"]), int(state["batch"])
