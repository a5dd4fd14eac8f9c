"""A conversion's helper processes die with it, and SIGTERM stops it the way Ctrl-C does.

The OOM killer and a scheduler's time limit kill the main process only (SIGKILL, or
SIGTERM first). Without help its forkserver, its workers (which block on a queue the
dead parent held) and multiprocessing's resource tracker would live on. On Linux each
of our processes asks the kernel for SIGKILL when its parent dies (prctl
PR_SET_PDEATHSIG): main -> forkserver -> workers, and the resource tracker exits when
the last of them has closed its pipe. Elsewhere this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_PR_SET_PDEATHSIG = 1


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, like KeyboardInterrupt, so that no `except Exception`
    on the way swallows it; the run unwinds through the same clean-up as Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send `sig` to this process when its parent dies; True if it did."""
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    # The parent may have died before the request: then nobody would send the signal.
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)
    return True


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises Terminated in the main thread (restored after)."""

    def on_term(signum, _frame):
        raise Terminated(signum)

    try:
        previous = signal.signal(signal.SIGTERM, on_term)
    except ValueError:  # not the main thread: leave SIGTERM as it is
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
