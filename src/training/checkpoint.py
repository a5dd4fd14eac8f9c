"""Checkpoint files: atomic writes, finding the one to resume from, clearing what killed
saves left, RNG state capture. What a checkpoint holds is state.py's business.

A checkpoint is a dict that `torch.load(..., weights_only=True)` accepts: tensors,
numbers, strings, lists, tuples and dicts only. Its `state_dict` holds the unwrapped
model's parameters (no `module.` / `_orig_mod.` prefixes) in the released layout, so
`create_model(config, pretrained=path)` loads it directly.
"""

from __future__ import annotations

import errno
import os
import random
import re
import resource
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from src.fsutil import atomic_path, remove_stale_temp_files
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
    try:
        with atomic_path(path, durable=True) as tmp:
            torch.save(obj, tmp)
    except (OSError, RuntimeError) as exc:
        # torch's writer reports a full disk as a bare RuntimeError ("basic_ios::clear",
        # "file write failed"), so the free space decides what to say.
        need = _tensor_bytes(obj)
        full = isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
        if full or _room(path.parent) < need:
            raise TrainingError(
                f"no space left on device, need ≈ {need / 1e9:.3g} GB at {path.parent} for {path.name}; "
                "free some space (or lower --keep-checkpoints) and resume with --resume latest"
            ) from None
        raise
    return path


def _room(folder: Path) -> int:
    """Bytes one file may still take at `folder`: the free space, or less under a file-size limit."""
    room = shutil.disk_usage(folder).free
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return room if limit == resource.RLIM_INFINITY else min(room, limit)


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def list_checkpoints(output: str | os.PathLike) -> list[tuple[int, Path]]:
    """(global step, path) of every checkpoint file, oldest first.

    The step is read from the file name (epoch files: from inside); temporary files never
    match the pattern.
    """
    folder = checkpoint_dir(output)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        if _NAME.match(p.name) and p.is_file():
            found.append((_step_of(p), p))
    # A file whose step cannot be read sorts as the newest, so that a resume meets it and
    # says why it is skipped instead of passing over it in silence.
    return sorted(
        found, key=lambda sp: (sp[0] if sp[0] >= 0 else float("inf"), sp[1].name.startswith("epoch"))
    )


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


def prune_before_save(
    output: str | os.PathLike, keep: int, protect: Iterable[str | os.PathLike] = ()
) -> list[Path]:
    """Make room for one more step checkpoint, so that a disk holding exactly `keep` of them
    can still save: only while at least one complete checkpoint stays (keep >= 2).

    `protect`: the checkpoint the run resumed from or saved last, the one a resume needs if
    this save fails; never deleted (see prune_step_checkpoints)."""
    if keep >= 2:
        return prune_step_checkpoints(output, keep - 1, protect)
    return []


def prune_step_checkpoints(
    output: str | os.PathLike, keep: int, protect: Iterable[str | os.PathLike] = ()
) -> list[Path]:
    """Delete step checkpoints until at most `keep` remain (epoch checkpoints are kept); what was
    deleted.

    Unreadable ones go first (a copy cut short, a disk error), then the oldest readable ones.
    Never deleted: a checkpoint in `protect`, and the newest readable one, so that a resume
    always finds a complete checkpoint, whatever happens to the save this makes room for.
    """
    if keep <= 0:
        return []
    steps = sorted(p for p in checkpoint_dir(output).glob("step_*.pt") if _STEP_NAME.match(p.name))
    if len(steps) <= keep:
        return []
    kept = {_real(p) for p in protect}
    readable = [p for p in steps if _readable(p)]
    if readable:
        kept.add(_real(readable[-1]))
    unreadable = [p for p in steps if p not in readable]
    removed = []
    for p in unreadable + readable:  # unreadable first, then oldest first
        if len(steps) - len(removed) <= keep:
            break
        if _real(p) not in kept:
            p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def _real(path: str | os.PathLike) -> str:
    return os.path.realpath(path)


# Readability by (path, size, mtime): a run checks each file once, not at every save.
_READABLE: dict[tuple[str, int, int], bool] = {}


def _readable(path: Path) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    key = (_real(path), st.st_size, st.st_mtime_ns)
    if key not in _READABLE:
        try:
            load_checkpoint_file(path)
            _READABLE[key] = True
        except TrainingError:
            _READABLE[key] = False
    return _READABLE[key]


# What a file must hold to continue a run (the first format had "args" and "epoch_complete"
# where the current one has "run" and "batch"; both continue).
REQUIRED_KEYS = ("state_dict", "optimizer", "step", "epoch", "epoch_step", "data", "rng")


def load_checkpoint_file(path: str | os.PathLike) -> dict[str, Any]:
    """Read a training checkpoint; TrainingError (one line) if it cannot be read or is incomplete."""
    # mmap: eight ranks of a node resuming at once share the page cache instead of
    # each holding a private copy of a multi-GB file.
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        raise TrainingError(f"checkpoint {path} cannot be read ({type(exc).__name__}: {reason})") from exc
    if not isinstance(ckpt, dict):
        raise TrainingError(f"checkpoint {path} holds no dict; it is not a training checkpoint")
    missing = [k for k in REQUIRED_KEYS if k not in ckpt]
    if missing:
        raise TrainingError(
            f"checkpoint {path} lacks {', '.join(missing)}; it is not a training checkpoint of train.py "
            "(start a new run from its weights with --pretrained)"
        )
    return ckpt


def find_resume_checkpoint(resume: str | None, output: str | os.PathLike) -> tuple[Path | None, list[str]]:
    """The checkpoint `--resume` names, and warnings about the newer ones passed over.

    'latest' takes the newest checkpoint in `output` that can be read; an unreadable newer
    one (a disk error, a copy cut short) is skipped with a warning. A path given
    explicitly must be readable (TrainingError otherwise). None: a fresh run.
    """
    if not resume:
        return None, []
    if resume != "latest":
        path = Path(resume)
        if not path.is_file():
            raise TrainingError(f"--resume {resume}: no such checkpoint file; pass a .pt path or 'latest'")
        load_checkpoint_file(path)
        return path, []
    warnings = []
    for _, path in reversed(list_checkpoints(output)):
        try:
            load_checkpoint_file(path)
        except TrainingError as exc:
            warnings.append(f"{exc}; skipping it")
            continue
        if warnings:
            warnings.append(f"resuming from {path.name}, the newest checkpoint that can be read")
        return path, warnings
    if warnings:
        raise TrainingError(
            f"--resume latest: no checkpoint in {checkpoint_dir(output)} can be read "
            f"({'; '.join(warnings)}); start a new run with another --output"
        )
    return None, []


def remove_interrupted_saves(output: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that saves killed midway left in the run folder."""
    removed = remove_stale_temp_files(checkpoint_dir(output), "*.pt")
    removed += remove_stale_temp_files(output)
    return removed


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
