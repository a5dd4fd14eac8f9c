"""Peak memory of one call on the CPU, where torch keeps no allocator statistics.

Measured in a fresh child process started with glibc told to serve every allocation above
16 KiB by mmap (MALLOC_MMAP_THRESHOLD_), so freed tensors leave the resident set at once.
Before the measured call the child resets the kernel's resident-set high-water mark (writing 5
to /proc/self/clear_refs); VmHWM - VmRSS afterwards is the peak of the memory the call added,
at page granularity: what it allocated beyond what was already resident (weights, inputs).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

CHILD_ENV = {"MALLOC_MMAP_THRESHOLD_": "16384"}


def child_env() -> dict[str, str]:
    """The environment to start a measuring child with."""
    return {**os.environ, **CHILD_ENV}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def peak_growth(call: Callable[[], object]) -> int:
    """Bytes by which the resident set peaked above its level before `call()` (Linux only)."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before = _status_kib("VmRSS")
    result = call()
    peak = _status_kib("VmHWM")
    del result
    return (peak - before) * 1024
