"""One writer per train.py --output, a full disk during a checkpoint save, metrics.jsonl after
a resume, and demo.py on a read-only --output.

The full disk is a real one: a small tmpfs mounted for the test when the test runs as root;
otherwise a real file-size limit (RLIMIT_FSIZE) in a subprocess, which makes the kernel fail
the write with EFBIG the same way.
"""

import json
import os
import resource
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from src.lock import OutputLock, OutputLocked
from src.training import checkpoint as ckpt_io
from src.training.errors import TrainingError
from src.training.observe import RunLog
from tests._repo import REPO

MB = 1 << 20


@contextmanager
def small_disk(path: Path, size: int, read_only: bool = False):
    """A real filesystem of `size` bytes at `path` (a tmpfs), or skip where mounting needs root."""
    path.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(path)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)  # lazy: a failed save may hold a file open


def test_a_full_disk_during_a_save_is_one_line_naming_the_space_needed(tmp_path):
    with small_disk(tmp_path / "disk", 1 * MB) as disk:
        with pytest.raises(TrainingError) as info:
            ckpt_io.atomic_save({"w": torch.zeros(MB)}, disk / "checkpoints" / "step_000000001.pt")  # 4 MB
        assert str(info.value).startswith(f"no space left on device, need ≈ {4 * MB / 1e9:.3g} GB at ")
        assert str(disk / "checkpoints") in str(info.value) and "\n" not in str(info.value)
        assert list((disk / "checkpoints").iterdir()) == []  # no half-written file stays


def test_a_file_size_limit_gives_the_same_line(tmp_path):
    # Works without root: the kernel refuses writes past RLIMIT_FSIZE with EFBIG.
    code = (
        "import resource, signal, sys, torch\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({MB}, {MB}))\n"
        "from src.training import checkpoint as c\n"
        "from src.training.errors import TrainingError\n"
        "try:\n"
        f"    c.atomic_save({{'w': torch.zeros({MB})}}, {str(tmp_path / 'step_000000001.pt')!r})\n"
        "except TrainingError as e:\n"
        "    print(e); sys.exit(3)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"no space left on device, need ≈ {4 * MB / 1e9:.3g} GB at {tmp_path} "), (
        proc.stdout
    )
    assert resource.getrlimit(resource.RLIMIT_FSIZE)  # the limit lived in the child only


def test_a_disk_holding_exactly_keep_checkpoints_still_saves(tmp_path):
    ckpt = {"w": torch.zeros(MB // 4)}  # 1 MB each
    with small_disk(tmp_path / "disk", int(2.6 * MB)) as disk:
        for step in (1, 2):
            ckpt_io.atomic_save(ckpt, ckpt_io.step_checkpoint_path(disk, step))
        with pytest.raises(TrainingError):  # the old order: save, then prune
            ckpt_io.atomic_save(ckpt, ckpt_io.step_checkpoint_path(disk, 3))
        ckpt_io.prune_before_save(disk, keep=2)
        ckpt_io.atomic_save(ckpt, ckpt_io.step_checkpoint_path(disk, 3))
        assert [s for s, _ in ckpt_io.list_checkpoints(disk)] == [2, 3]
        ckpt_io.prune_before_save(disk, keep=1)  # would delete the only complete checkpoint
        assert [s for s, _ in ckpt_io.list_checkpoints(disk)] == [2, 3]


def test_metrics_are_truncated_to_the_resumed_step(tmp_path):
    lines = [{"kind": "train", "step": s, "loss": 1.0} for s in range(1, 8)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines) + '{"kind": "tr')
    log = RunLog(tmp_path, enabled=True, resume_step=5)
    log.scalars(6, {"loss": 0.5})
    log.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_a_metrics_line_that_is_not_utf8_is_dropped_and_counted_on_resume(tmp_path, caplog):
    # Once a UnicodeDecodeError traceback that blocked --resume latest.
    lines = [json.dumps({"kind": "train", "step": s, "loss": 1.0}).encode() + b"\n" for s in range(1, 6)]
    lines[2] = b'{"kind": "train", "step": 3, "loss": \xff}\n'
    (tmp_path / "metrics.jsonl").write_bytes(b"".join(lines) + b"\xff\xfe")
    with caplog.at_level("WARNING", logger="rwkv_clip.train"):
        log = RunLog(tmp_path, enabled=True, resume_step=4)
    log.scalars(5, {"loss": 0.5})
    log.close()
    steps = [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 4, 5]
    assert "dropped 2 line(s) of metrics.jsonl that are not UTF-8 JSON" in caplog.text


def test_a_second_writer_of_one_output_is_refused_naming_the_first(tmp_path, capsys):
    import train

    output = tmp_path / "run"
    output.mkdir()
    # The first run's lock, held by another process (as a running train.py holds it).
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from src.lock import OutputLock\n"
            f"OutputLock(Path({str(output)!r}), tool='train.py', "
            f"path=Path({str(output / 'train.lock')!r})).acquire()\n"
            "print('held', flush=True); time.sleep(120)",
        ],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert (
            train.main(["--train-data", str(tmp_path / "none"), "--output", str(output), "--device", "cpu"])
            == 2
        )
        err = capsys.readouterr().err
        assert err.startswith(
            f"train.py: error: --output {output} is being written by train.py run pid {holder.pid} on host "
        ), err
        assert err.count("\n") == 1
        assert "rerun with --resume latest" in err, err
    finally:
        holder.kill()
        holder.wait()
    # The holder died without releasing: its lock is stale and the next run takes it over.
    lock = OutputLock(output, tool="train.py", path=output / "train.lock")
    lock.acquire()
    assert lock.took_over["pid"] == holder.pid
    lock.release()
    with OutputLock(output, tool="train.py", path=output / "train.lock"):
        with pytest.raises(OutputLocked):
            OutputLock(output, tool="train.py", path=output / "train.lock").acquire()


def _holder(output: Path, then: str) -> subprocess.Popen:
    """A process that takes train.py's lock of `output`, runs `then` (with `lock` and `time` at hand),
    prints what it printed and 'held', and waits to be killed."""
    code = (
        "import os, subprocess, sys, time; from pathlib import Path; from src.lock import OutputLock\n"
        f"lock = OutputLock(Path({str(output)!r}), tool='train.py', "
        f"path=Path({str(output / 'train.lock')!r}))\n"
        f"lock.acquire()\n{then}\nprint('held', flush=True); time.sleep(120)"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )


def _wait_until_closed_in(pid: int, path: Path, timeout: float = 30.0) -> None:
    """Until process `pid` holds no descriptor of `path` (or fail after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        held = []
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                held.append(os.readlink(fd) == str(path))
            except OSError:  # closed while we looked
                pass
        if not any(held):
            return
        assert time.monotonic() < deadline, f"process {pid} still holds {path} after {timeout} s"
        time.sleep(0.05)


def test_a_forked_child_does_not_keep_the_lock_of_a_killed_run(tmp_path):
    # A loader worker (forked) once held train.py's lock for seconds after a kill -9 of the run: the
    # rerun was refused naming the dead pid. Children now drop the lock; only the run holds it.
    output = tmp_path / "run"
    output.mkdir()
    holder = _holder(
        output,
        "import multiprocessing as mp\n"
        "child = mp.get_context('fork').Process(target=time.sleep, args=(60,))\n"
        "child.start(); print(child.pid, flush=True)",
    )
    child = int(holder.stdout.readline())
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(OutputLocked):  # the run itself still holds it
            OutputLock(output, tool="train.py", path=output / "train.lock").acquire()
        # The child drops its copy when it first runs after the fork; on a loaded machine that can
        # come after the parent has gone on. A loader worker has long run by the time a run is killed.
        _wait_until_closed_in(child, output / "train.lock")
        holder.kill()
        holder.wait()
        lock = OutputLock(output, tool="train.py", path=output / "train.lock")
        lock.acquire()  # at once, with the forked child still alive
        assert lock.took_over["pid"] == holder.pid and os.path.exists(f"/proc/{child}")
        lock.release()
    finally:
        holder.kill()
        os.kill(child, 9)


def test_a_lock_held_past_its_dead_holder_says_wait_a_moment(tmp_path):
    # Whatever still holds the lock of a run that has exited (a child it handed the descriptor to),
    # the message says so instead of naming the dead pid as running.
    output = tmp_path / "run"
    output.mkdir()
    holder = _holder(
        output, "child = subprocess.Popen(['sleep', '60'], pass_fds=[lock._fd])\nprint(child.pid, flush=True)"
    )
    child = int(holder.stdout.readline())
    try:
        assert holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait()
        with pytest.raises(OutputLocked) as info:
            OutputLock(output, tool="train.py", path=output / "train.lock").acquire()
        message = str(info.value)
        assert f"train.py run pid {holder.pid}" in message and "has exited" in message
        assert "wait a moment and rerun" in message and "\n" not in message
    finally:
        os.kill(child, 9)


def test_demo_on_a_read_only_output_is_one_line(tmp_path, capsys):
    import demo

    with small_disk(tmp_path / "ro", MB, read_only=True) as ro:
        assert demo.main(["--output", str(ro / "out"), "--quick"]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"demo.py: error: --output {ro / 'out'}: cannot write there (Read-only file system); "
        "pass a folder you can write\n"
    )


def _checkpoint(step: int) -> dict:
    return {
        "state_dict": {"w": torch.zeros(4)},
        "optimizer": {},
        "step": step,
        "epoch": 0,
        "epoch_step": step,
        "data": [],
        "rng": [],
    }


def test_pruning_never_deletes_the_checkpoint_resumed_from_for_an_unreadable_newer_one(tmp_path):
    # The newest step checkpoint is unreadable (a copy cut short), an older one is good, no epoch file.
    ckpt_io.atomic_save(_checkpoint(10), ckpt_io.step_checkpoint_path(tmp_path, 10))
    ckpt_io.step_checkpoint_path(tmp_path, 20).write_bytes(b"PK\x03\x04 cut short")
    resumed, _ = ckpt_io.find_resume_checkpoint("latest", tmp_path)
    assert resumed == ckpt_io.step_checkpoint_path(tmp_path, 10)
    # --keep-checkpoints 2: room for the next save. The unreadable file goes, the good one stays...
    removed = ckpt_io.prune_before_save(tmp_path, keep=2, protect=[resumed])
    assert removed == [ckpt_io.step_checkpoint_path(tmp_path, 20)]
    # ...so that if the save then fails (a full disk, a kill), the next --resume latest still finds it.
    assert ckpt_io.find_resume_checkpoint("latest", tmp_path) == (resumed, [])
    # Once a newer one is complete, the older one may go, never the newer.
    ckpt_io.atomic_save(_checkpoint(11), ckpt_io.step_checkpoint_path(tmp_path, 11))
    ckpt_io.prune_step_checkpoints(tmp_path, keep=2, protect=[ckpt_io.step_checkpoint_path(tmp_path, 11)])
    ckpt_io.prune_before_save(tmp_path, keep=2, protect=[ckpt_io.step_checkpoint_path(tmp_path, 11)])
    assert [s for s, _ in ckpt_io.list_checkpoints(tmp_path)] == [11]


def test_pruning_keeps_the_newest_readable_checkpoint_and_drops_unreadable_ones_first(tmp_path):
    for step in (2, 4):
        ckpt_io.atomic_save(_checkpoint(step), ckpt_io.step_checkpoint_path(tmp_path, step))
    for step in (3, 6, 8):  # unreadable, older and newer than the good ones
        ckpt_io.step_checkpoint_path(tmp_path, step).write_bytes(b"not a checkpoint")
    ckpt_io.prune_step_checkpoints(
        tmp_path, keep=2
    )  # nothing protected: the newest readable stays all the same
    assert [p.name for p in sorted(ckpt_io.checkpoint_dir(tmp_path).iterdir())] == [
        "step_000000002.pt",
        "step_000000004.pt",
    ]
    ckpt_io.prune_step_checkpoints(tmp_path, keep=1)
    assert [s for s, _ in ckpt_io.list_checkpoints(tmp_path)] == [4]
