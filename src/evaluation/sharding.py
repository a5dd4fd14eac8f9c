"""Spreading one evaluation over the ranks of a process group and gathering the results.

Rank r takes a contiguous slice of the items, the first `count % world` ranks one more (the
original evaluation splits its datasets the same way). Gathering uses `torch.distributed`
directly: every rank pads its rows to the largest slice, all ranks all_gather, and each keeps
the true rows. With one process nothing is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Shard:
    rank: int = 0
    world_size: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} of {self.world_size}: need 0 <= rank < world_size")

    def sizes(self, count: int) -> list[int]:
        base, extra = divmod(count, self.world_size)
        return [base + (r < extra) for r in range(self.world_size)]

    def range(self, count: int) -> tuple[int, int]:
        """[start, stop) of this rank's items among `count`."""
        sizes = self.sizes(count)
        start = sum(sizes[: self.rank])
        return start, start + sizes[self.rank]

    def gather(self, local: torch.Tensor, count: int, device: torch.device | str) -> torch.Tensor:
        """The rows of every rank's `local` (this rank's slice of `count` rows), in rank order,
        on every rank. `device` is where the collective runs (the rank's GPU under NCCL)."""
        if self.world_size == 1:
            return local
        sizes = self.sizes(count)
        if local.shape[0] != sizes[self.rank]:
            raise ValueError(
                f"rank {self.rank} holds {local.shape[0]} rows, its slice has {sizes[self.rank]}"
            )
        padded = torch.zeros((max(sizes), *local.shape[1:]), dtype=local.dtype, device=device)
        padded[: local.shape[0]] = local.to(device)
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return torch.cat([part[:size] for part, size in zip(parts, sizes)]).to(local.device)


SINGLE = Shard()
