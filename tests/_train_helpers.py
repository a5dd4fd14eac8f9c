"""Shared pieces of the training tests: a toy CLIP model and gloo workers.

The workers run in processes started by torch.multiprocessing.spawn; they import this
module as `tests._train_helpers` (spawned children inherit the parent's import path, which pytest's
`pythonpath` setting starts at the repository root).
"""

import math
import os
import socket
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

DIM, VOCAB, SIDE = 8, 40, 4


class ToyClip(nn.Module):
    """Same call shape as RWKV_CLIP: (images, tokens, normalize) -> (image_emb, text_emb,
    exp(logit_scale))."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.image = nn.Sequential(
            nn.Flatten(), nn.Linear(3 * SIDE * SIDE, 16), nn.Tanh(), nn.Linear(16, DIM)
        )
        self.text = nn.Embedding(VOCAB, DIM)
        self.drop = nn.Dropout(0.25)  # exercises the RNG replay of gradient accumulation
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() > 0:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, images, tokens, normalize: bool = True):
        image, text = self.drop(self.image(images)), self.text(tokens).mean(1)
        if normalize:
            image, text = F.normalize(image, dim=-1), F.normalize(text, dim=-1)
        return image, text, self.logit_scale.exp()


def toy_batch(n: int, seed: int = 1, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, SIDE, SIDE, generator=g, dtype=dtype)
    tokens = torch.randint(0, VOCAB, (n, 5), generator=g)
    return images, tokens


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def set_torchrun_env(rank: int, world_size: int, port: int) -> None:
    """What torchrun exports for each worker, so init_distributed() is tested as used."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )


def run_guarded(fn, rank: int, out: Path, *args) -> None:
    """Run a worker body; write its traceback to `out/error_<rank>.txt` on failure."""
    try:
        fn(rank, out, *args)
    except BaseException:
        (out / f"error_{rank}.txt").write_text(traceback.format_exc())
        raise


def grads_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def run_ranks(
    module: str,
    args: list[str],
    world_size: int = 2,
    timeout: float = 240.0,
    env: dict[str, str] | None = None,
) -> list[tuple[int, str, str]]:
    """`python -m module *args` as `world_size` ranks of one gloo group, torchrun-style variables
    set for each; (exit code, stdout, stderr) per rank. Ranks that outlive `timeout` (a hang:
    ranks waiting in different collectives) are killed and the test fails saying so."""
    import subprocess
    import sys

    from tests._repo import REPO

    port = free_port()
    procs = []
    for rank in range(world_size):
        rank_env = {
            **os.environ,
            **(env or {}),
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", module, *args],
                cwd=REPO,
                env=rank_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append((proc.returncode, out, err))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        tails = [err[-1500:] for _, _, err in results] + [
            p.communicate()[1][-1500:] for p in procs[len(results) :]
        ]
        raise AssertionError(
            f"the ranks did not finish in {timeout:g} s (a hang); stderr tails: {tails}"
        ) from None
    return results
