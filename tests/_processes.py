"""Which processes a test started are still running, read from /proc (Linux)."""

import os
import time


def _stat(pid: int) -> tuple[int, str, int] | None:
    """(parent pid, state, start time) of a live process, from /proc; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), fields[0], int(fields[19])


def command_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def descendants(pid: int) -> dict[int, int]:
    """{pid: start time} of every live process below `pid` (children, their children, ...)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parents[int(entry)] = st
    found, frontier = {}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, (ppid, _, start) in parents.items():
            if ppid == parent and child not in found:
                found[child] = start
                frontier.append(child)
    return found


def alive(processes: dict[int, int]) -> list[int]:
    """Which of {pid: start time} still run (a zombie waiting for its reaper counts as gone)."""
    out = []
    for pid, start in processes.items():
        st = _stat(pid)
        if st is not None and st[1] != "Z" and st[2] == start:
            out.append(pid)
    return out


def wait_for(condition, limit: float = 60.0, step: float = 0.05) -> bool:
    """Poll `condition` until it holds or `limit` seconds passed (a bound on waiting, not a timing test)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return bool(condition())
