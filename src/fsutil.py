"""Writing files so that a reader never sees half of one.

Everything is written under a temporary name in the target's own folder (so the final
rename is atomic on POSIX) and renamed over the target only when complete; on any
error the temporary file is removed. A kill between the two leaves the old file or
none, plus at most a stray `*.tmp` that `remove_stale_temp_files` can clear.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

TMP_SUFFIX = ".tmp"


def temp_path_for(path: str | os.PathLike[str]) -> Path:
    """The temporary name beside `path`: hidden, and unique per process so that two
    writers never share one."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Make a rename inside `folder` durable (the directory entry itself is data)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, durable: bool = False) -> Iterator[Path]:
    """Yield a temporary path to write; it replaces `path` when the block succeeds.

    With `durable`, the new file and the rename are fsynced: a power cut after the
    block leaves the complete new file (checkpoints, resume state).
    """
    path = Path(path)
    tmp = temp_path_for(path)
    try:
        yield tmp
        if durable:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    if durable:
        fsync_dir(path.parent)


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", *, durable: bool = False, **kwargs: Any) -> Iterator[IO]:
    """`open(path, mode)` for writing, through `atomic_path`."""
    if not mode.startswith("w"):
        raise ValueError(f"atomic_open writes whole files; mode {mode!r} must start with 'w'")
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    with atomic_path(path, durable=durable) as tmp, open(tmp, mode, **kwargs) as f:
        yield f


def atomic_write_text(path: str | os.PathLike[str], text: str, *, durable: bool = False) -> Path:
    with atomic_open(path, "w", durable=durable) as f:
        f.write(text)
    return Path(path)


def atomic_write_json(path: str | os.PathLike[str], data: Any, *, durable: bool = False, **dumps: Any) -> Path:
    """JSON with a trailing newline; `dumps` go to json.dumps (default indent=2)."""
    dumps.setdefault("indent", 2)
    return atomic_write_text(path, json.dumps(data, **dumps) + "\n", durable=durable)


def remove_stale_temp_files(folder: str | os.PathLike[str], name_glob: str = "*") -> list[Path]:
    """Delete temporaries that `atomic_path` left for `name_glob` targets in `folder` when
    their writer was killed (their process is gone); returns what was removed."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for tmp in folder.glob(f".{name_glob}.*{TMP_SUFFIX}"):
        pid = tmp.name[: -len(TMP_SUFFIX)].rsplit(".", 1)[-1]
        if pid.isdigit() and not _process_alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True
