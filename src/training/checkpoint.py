"""Training checkpoints: atomic writes, discovery of the latest one, RNG state capture.

A checkpoint is a dict that `torch.load(..., weights_only=True)` accepts: tensors,
numbers, strings, lists, tuples and dicts only. Its `state_dict` holds the unwrapped
model's parameters (no `module.` / `_orig_mod.` prefixes), so
`create_model(config, pretrained=path)` loads it directly.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from src.fsutil import atomic_path
from src.training.errors import TrainingError

CHECKPOINT_DIR = "checkpoints"
_NAME = re.compile(r"^(?:step|epoch)_(\d+)\.pt$")
_STEP_NAME = re.compile(r"^step_(\d+)\.pt$")


def checkpoint_dir(output: str | os.PathLike) -> Path:
    return Path(output) / CHECKPOINT_DIR


def step_checkpoint_path(output: str | os.PathLike, step: int) -> Path:
    return checkpoint_dir(output) / f"step_{step:09d}.pt"


def epoch_checkpoint_path(output: str | os.PathLike, epoch: int) -> Path:
    """`epoch` counts completed epochs (1 after the first)."""
    return checkpoint_dir(output) / f"epoch_{epoch:03d}.pt"


def atomic_save(obj: Any, path: str | os.PathLike) -> Path:
    """torch.save `obj` durably under a temporary name, then rename it over `path`: a kill at
    any moment leaves either the previous file or the complete new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, durable=True) as tmp:
        torch.save(obj, tmp)
    return path


def list_checkpoints(output: str | os.PathLike) -> list[tuple[int, Path]]:
    """(global step, path) of every complete checkpoint, oldest first.

    The step is read from the file name; temporary files never match the pattern.
    """
    folder = checkpoint_dir(output)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        if _NAME.match(p.name) and p.is_file():
            found.append((_step_of(p), p))
    return sorted(found, key=lambda sp: (sp[0], sp[1].name.startswith("epoch")))


def _step_of(path: Path) -> int:
    # Epoch files are named by epoch, so their step lives inside; the header read is cheap
    # compared with the training run and only happens at start-up.
    m = _STEP_NAME.match(path.name)
    if m:
        return int(m.group(1))
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["step"])
    except Exception:
        return -1


def latest_checkpoint(output: str | os.PathLike) -> Path | None:
    found = list_checkpoints(output)
    return found[-1][1] if found else None


def prune_step_checkpoints(output: str | os.PathLike, keep: int) -> None:
    """Delete all but the newest `keep` step checkpoints (epoch checkpoints are kept)."""
    if keep <= 0:
        return
    steps = sorted(p for p in checkpoint_dir(output).glob("step_*.pt") if _STEP_NAME.match(p.name))
    for p in steps[:-keep]:
        p.unlink(missing_ok=True)


def resolve_resume(resume: str | None, output: str | os.PathLike) -> Path | None:
    """`--resume latest` -> newest checkpoint in the output folder (None on a fresh run)."""
    if not resume:
        return None
    if resume == "latest":
        return latest_checkpoint(output)
    path = Path(resume)
    if not path.is_file():
        raise FileNotFoundError(f"--resume {resume}: no such checkpoint file; pass a .pt path or 'latest'")
    return path


def load_checkpoint_file(path: str | os.PathLike) -> dict[str, Any]:
    # mmap: eight ranks of a node resuming at once share the page cache instead of
    # each holding a private copy of a multi-GB file.
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        raise TrainingError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {exc})") from exc
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise TrainingError(f"checkpoint {path} has no 'state_dict'; it is not a training checkpoint")
    return ckpt


# --- RNG state --------------------------------------------------------------------------
# numpy's state holds an ndarray, which weights_only loading refuses: store it as a tensor.


def capture_rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss_next],
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
