"""What a long run tells its user: log lines, TensorBoard scalars, a metrics file.

Rank 0 speaks; the other ranks log warnings and errors only, so an 8-GPU job does not
print everything eight times.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from src.fsutil import atomic_write_text

LOG = logging.getLogger("rwkv_clip.train")


# The loaders' messages (e.g. a bad record skipped) belong in the run's log too; their
# loggers keep their own level and propagation, and lose these handlers when the run ends.
_ALSO_LOGGED = ("dataloaders",)


def setup_logging(output: Path | None, rank: int) -> None:
    """Rank 0: INFO to stdout and `<output>/train.log`; other ranks: WARNING to stderr."""
    close_logging()
    fmt = logging.Formatter(f"%(asctime)s [rank {rank}] %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S")
    stream = logging.StreamHandler(sys.stdout if rank == 0 else sys.stderr)
    stream.setFormatter(fmt)
    LOG.addHandler(stream)
    if rank == 0 and output is not None:
        file_handler = logging.FileHandler(output / "train.log")
        file_handler.setFormatter(fmt)
        LOG.addHandler(file_handler)
    LOG.propagate = False
    LOG.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for name in _ALSO_LOGGED:
        for handler in LOG.handlers:
            logging.getLogger(name).addHandler(handler)


def close_logging() -> None:
    """Detach and close the run's handlers (a new run in the same process sets up its own)."""
    for handler in list(LOG.handlers):
        for name in _ALSO_LOGGED:
            logging.getLogger(name).removeHandler(handler)
        LOG.removeHandler(handler)
        handler.close()


def format_duration(seconds: float) -> str:
    """`1d02h03m`, `5h07m`, `3m09s`: readable at both ends of a 26-hour run."""
    if seconds != seconds or seconds == float("inf"):
        return "?"
    s = int(round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    if d:
        return f"{d}d{h:02d}h{m:02d}m"
    if h:
        return f"{h}h{m:02d}m"
    return f"{m}m{s:02d}s"


class Throughput:
    """Samples/s, data-wait share and ETA over the interval since the last report.

    The first interval after start or resume includes warm-up (compilation, loader
    start), so the ETA uses an exponential average that later intervals soon dominate.
    """

    def __init__(self, samples_per_step: int, world_size: int, total_steps: int, start_step: int) -> None:
        self.samples_per_step = samples_per_step
        self.world_size = world_size
        self.total_steps = total_steps
        self.start_time = time.perf_counter()
        self._last_time = self.start_time
        self._last_step = start_step
        self._data_wait = 0.0
        self._step_time_ema: float | None = None

    def add_data_wait(self, seconds: float) -> None:
        self._data_wait += seconds

    def report(self, step: int) -> dict[str, float]:
        now = time.perf_counter()
        elapsed = max(now - self._last_time, 1e-9)
        steps = max(step - self._last_step, 1)
        step_time = elapsed / steps
        if self._step_time_ema is None:
            self._step_time_ema = step_time
        else:
            self._step_time_ema = 0.7 * self._step_time_ema + 0.3 * step_time
        per_rank = steps * self.samples_per_step / elapsed
        out = {
            "samples_per_s_per_rank": per_rank,
            "samples_per_s": per_rank * self.world_size,
            "data_wait_frac": min(1.0, self._data_wait / elapsed),
            "step_time_s": step_time,
            "eta_s": max(0, self.total_steps - step) * self._step_time_ema,
            "elapsed_s": now - self.start_time,
        }
        self._last_time, self._last_step, self._data_wait = now, step, 0.0
        return out


class RunLog:
    """TensorBoard scalars and `metrics.jsonl` (one JSON object per logged step), rank 0 only."""

    def __init__(self, output: Path, enabled: bool, resume_step: int = 0) -> None:
        self.enabled = enabled
        self._writer = None
        self._metrics = None
        if not enabled:
            return
        _truncate_metrics(output / "metrics.jsonl", resume_step)
        self._metrics = open(output / "metrics.jsonl", "a", buffering=1)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is optional at run time; the metrics file stays
            LOG.warning("tensorboard is not installed: scalars go to metrics.jsonl only")
        else:
            self._writer = SummaryWriter(str(output / "tensorboard"))

    def scalars(self, step: int, values: dict[str, Any], prefix: str = "train") -> None:
        if not self.enabled:
            return
        if self._writer is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)):
                    self._writer.add_scalar(f"{prefix}/{key}", value, step)
        self._metrics.write(json.dumps({"kind": prefix, "step": step, **values}) + "\n")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._metrics is not None:
            self._metrics.close()


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop the lines a killed run logged after its last checkpoint (`step`): the resumed run
    logs those steps again, and each step must appear once. A line that is not UTF-8 JSON (cut by
    the kill, a disk error's byte) is dropped and counted, never in the way of a resume."""
    try:
        lines = path.read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return
    kept, unreadable = [], 0
    for raw in lines:
        try:
            line = raw.decode("utf-8")
            logged = int(json.loads(line).get("step", 0))
        except (ValueError, AttributeError, TypeError):  # UnicodeDecodeError is a ValueError
            unreadable += 1
            continue
        if logged <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if unreadable:
        LOG.warning(
            "dropped %d line(s) of metrics.jsonl that are not UTF-8 JSON (cut by a kill or damaged)",
            unreadable,
        )
    if len(kept) != len(lines):
        atomic_write_text(path, "".join(kept))
