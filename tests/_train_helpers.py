"""Shared pieces of the training tests: a toy CLIP model, gloo workers, tiny .rec data.

The workers run in processes started by torch.multiprocessing.spawn; they import this
module by name (the parent's sys.path, which pytest extends with tests/, is passed on).
"""

from __future__ import annotations

import math
import os
import socket
import traceback
from pathlib import Path

import torch
from torch import nn

DIM, VOCAB, SIDE = 8, 40, 4


class ToyClip(nn.Module):
    """Same call shape as RWKV_CLIP: (images, tokens) -> (image_emb, text_emb, exp(logit_scale))."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        self.image = nn.Sequential(nn.Flatten(), nn.Linear(3 * SIDE * SIDE, 16), nn.Tanh(), nn.Linear(16, DIM))
        self.text = nn.Embedding(VOCAB, DIM)
        self.drop = nn.Dropout(0.25)  # exercises the RNG replay of gradient accumulation
        with torch.no_grad():
            for p in self.parameters():
                if p.dim() > 0:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.5)

    def forward(self, images, tokens):
        return self.drop(self.image(images)), self.text(tokens).mean(1), self.logit_scale.exp()


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
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
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


COLOURS = {
    "red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220), "yellow": (230, 220, 30),
    "black": (10, 10, 10), "white": (245, 245, 245), "purple": (140, 30, 160), "orange": (250, 140, 20),
}


def write_colour_records(prefix: Path, n: int, side: int = 40, seed: int = 0) -> Path:
    """`prefix`.rec/.idx: n noisy flat-colour JPEGs captioned with their colour's name.

    Learnable in a few dozen steps (the loss falls well below ln(batch)), and tiny.
    """
    import cv2
    import numpy as np

    from src.open_alip.tokenizer import tokenize_np
    from src.recordio import IRHeader, MXIndexedRecordIO, pack

    names = list(COLOURS)
    tokens = tokenize_np([f"a photo of a {name} square" for name in names]).astype(np.float32)
    rng = np.random.default_rng(seed)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "w") as rec:
        for i in range(n):
            c = i % len(names)
            img = np.clip(np.array(COLOURS[names[c]][::-1]) + rng.normal(0, 12, (side, side, 3)), 0, 255)
            jpg = cv2.imencode(".jpg", img.astype(np.uint8), [cv2.IMWRITE_JPEG_QUALITY, 90])[1].tobytes()
            rec.write_idx(i, pack(IRHeader(0, tokens[c], i, 0), jpg))
    return prefix
