"""One writer per output: a lock file held with flock(2) for the whole run (data2rec's
`OUT.lock`, train.py's `--output`/train.lock).

The kernel drops the lock when its holder dies, however it dies, so a lock file whose
lock is free is stale by construction and is taken over. The file also names its holder
(pid, host, start time) so that the run refused can say who is in the way.

A flock belongs to the open file, which a forked child shares: a loader worker forked by the
run would hold the run's lock until it noticed its parent's death, seconds after a kill -9. So a
forked child closes its copy at once (os.register_at_fork); only the process that took the lock
holds it. Exec'd children never get it (the descriptor is not inheritable).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from src.errors import UserError
from src.shard_names import LOCK, side_file


class OutputLocked(UserError):
    """Another run is writing the same output."""


_HELD: set[int] = set()  # descriptors of the locks this process holds


def _drop_in_child() -> None:
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_in_child)


def _alive_here(holder: dict) -> bool | None:
    """Whether the holder's pid runs, where that can be told (on this host); None elsewhere."""
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def lock_path(prefix: Path) -> Path:
    return side_file(prefix, LOCK)


def read_holder(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def describe(holder: dict, tool: str = "data2rec") -> str:
    if not holder:
        return f"another {tool} run"
    started = holder.get("started")
    when = f", started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}" if started else ""
    return (
        f"{holder.get('tool', tool)} run pid {holder.get('pid', '?')} on host {holder.get('host', '?')}{when}"
    )


def held_by(path: Path) -> dict | None:
    """The holder of the lock at `path` if a live run holds it, else None (no lock, or stale)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return read_holder(path)
        return None
    finally:
        os.close(fd)
    return None


class OutputLock:
    """`with OutputLock(prefix):` holds OUT.lock (or `path`) or raises OutputLocked naming the holder."""

    def __init__(
        self,
        prefix: Path,
        tool: str = "data2rec",
        path: Path | None = None,
        resume_hint: str = "rerun this command afterwards to resume it",
    ) -> None:
        self.path = path if path is not None else lock_path(prefix)
        self.output = prefix
        self.tool = tool
        self.resume_hint = resume_hint
        self._fd: int | None = None
        self._owner = os.getpid()
        self.took_over: dict | None = None  # the holder of a stale lock this run replaced

    def acquire(self) -> None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    holder = read_holder(self.path)
                    if _alive_here(holder) is False:  # a process it left behind is still stopping
                        raise OutputLocked(
                            f"{self.output} is still locked, but its {describe(holder, self.tool)} has "
                            "exited; a process it started is stopping: wait a moment and rerun"
                        ) from None
                    raise OutputLocked(
                        f"{self.output} is being written by {describe(holder, self.tool)}; wait for it to "
                        f"finish or stop it ({self.resume_hint}), or choose another --output"
                    ) from None
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    print(
                        f"{self.tool}: warning: {self.path.parent} does not support file locks; make sure "
                        "no other run writes to the same --output",
                        file=sys.stderr,
                    )
                    self._fd = None
                    return
                raise
            # The file may have been unlinked by a finishing holder between our open and flock:
            # then we locked an orphan inode and must start over on the current file.
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            break
        previous = read_holder(self.path)
        if previous:
            self.took_over = previous
        record = {
            "tool": self.tool,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": round(time.time(), 3),
            "command": " ".join(sys.argv)[:500],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        self._owner = os.getpid()
        _HELD.add(fd)

    def release(self) -> None:
        if self._fd is None:
            return
        if self._owner != os.getpid():  # a forked copy: the lock and the file are the run's, not ours
            self._fd = None
            return
        _HELD.discard(self._fd)
        try:
            self.path.unlink(missing_ok=True)  # unlinked while still held: no one can lock it meanwhile
        finally:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
