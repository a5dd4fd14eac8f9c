"""The small shared helpers: atomic writes, device resolution, the user-error base class."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from src import devices
from src.devices import DeviceError, resolve_device
from src.errors import UserError, report
from src.fsutil import (
    FileTooLarge,
    NotARegularFile,
    atomic_open,
    atomic_write_json,
    atomic_write_text,
    json_safe,
    printable,
    read_regular_file,
    remove_stale_temp_files,
    temp_path_for,
    walk_files,
)

# --- atomic writes ---------------------------------------------------------------------------


def test_atomic_write_replaces_only_when_complete(tmp_path):
    target = tmp_path / "result.json"
    atomic_write_json(target, {"a": 1})
    with pytest.raises(RuntimeError, match="half way"):
        with atomic_open(target, "w") as f:
            f.write('{"a": ')
            raise RuntimeError("half way")
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]  # the temporary is gone


def test_atomic_write_durable_and_text(tmp_path):
    path = atomic_write_text(tmp_path / "x.txt", "hello\n", durable=True)
    assert path.read_text() == "hello\n"
    with pytest.raises(ValueError, match="whole files"):
        with atomic_open(tmp_path / "x.txt", "a"):
            pass


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    # A writer killed between writing and renaming leaves its temporary behind.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".step_000000008.pt.{dead_pid}.tmp"
    stale.write_bytes(b"partial")
    mine = temp_path_for(tmp_path / "step_000000009.pt")  # this process is alive: keep it
    mine.write_bytes(b"in progress")
    removed = remove_stale_temp_files(tmp_path, "step_*.pt")
    assert removed == [stale] and not stale.exists() and mine.exists()


# --- reading input files and trees -----------------------------------------------------------


def test_only_regular_files_are_read_and_only_up_to_the_cap(tmp_path):
    (tmp_path / "a.jpg").write_bytes(b"x" * 100)
    assert read_regular_file(tmp_path / "a.jpg", 100) == b"x" * 100
    assert read_regular_file(tmp_path / "a.jpg", 0) == b"x" * 100  # 0: no cap
    with pytest.raises(FileTooLarge, match="100 bytes, more than the limit of 99"):
        read_regular_file(tmp_path / "a.jpg", 99)
    os.mkfifo(tmp_path / "pipe.jpg")  # no writer: a plain open() would block forever
    with pytest.raises(NotARegularFile, match="a FIFO"):
        read_regular_file(tmp_path / "pipe.jpg")
    with pytest.raises(NotARegularFile, match="a character device"):
        read_regular_file("/dev/zero")  # would never end
    with pytest.raises(IsADirectoryError):
        read_regular_file(tmp_path)
    (tmp_path / "link.jpg").symlink_to(tmp_path / "a.jpg")  # a link to a file is that file
    assert read_regular_file(tmp_path / "link.jpg") == b"x" * 100


def test_walk_follows_links_reads_each_folder_once_and_ends_cycles(tmp_path):
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "b.jpg").write_bytes(b"")
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "a.JPG").write_bytes(b"")
    (root / "a.txt").write_bytes(b"")
    (root / ".hidden").mkdir()
    (root / ".hidden" / "h.jpg").write_bytes(b"")
    (root / "ext").symlink_to(outside)
    (root / "ext_again").symlink_to(outside)
    (root / "sub" / "back").symlink_to(root)
    (outside / "deep" / "loop").symlink_to(outside)  # a cycle outside the root
    files, notes = walk_files(root, (".jpg",))
    assert files == ["a.JPG", "ext/deep/b.jpg"]
    assert len(notes) == 3 and all(root.as_posix() in n for n in notes)
    assert any("ext_again: the same folder as" in n for n in notes)
    assert any("sub/back: a link to" in n and "the folder itself (a cycle)" in n for n in notes)
    assert any("ext/deep/loop: a link back to" in n for n in notes)
    assert walk_files(root, skip_hidden=False)[0] == [".hidden/h.jpg", "a.JPG", "a.txt", "ext/deep/b.jpg"]
    (root / "sub" / "locked").mkdir()
    (root / "sub" / "locked").chmod(0)
    try:
        if not os.access(root / "sub" / "locked", os.R_OK):  # root ignores permissions
            with pytest.raises(PermissionError):
                walk_files(root)
    finally:
        (root / "sub" / "locked").chmod(0o755)


def test_names_that_are_not_utf8_become_printable_json():
    name = os.fsdecode(b"caf\xe9.jpg")  # how Python holds such a name
    assert printable(name) == "caf\\xe9.jpg" and printable("Zürich 東京") == "Zürich 東京"
    safe = json_safe({name: [name, 1, None], "n": {"k": (name,)}})
    assert json.loads(json.dumps(safe, ensure_ascii=False).encode("utf-8")) == {
        "caf\\xe9.jpg": ["caf\\xe9.jpg", 1, None],
        "n": {"k": ["caf\\xe9.jpg"]},
    }


def test_every_text_file_written_takes_names_that_are_not_utf8(tmp_path):
    # One rule for every writer of file names (labels.tsv once died on one after all the work).
    name = os.fsdecode(b"caf\xe9.jpg")
    atomic_write_text(tmp_path / "a.tsv", f"{name}\tcat\n")
    assert (tmp_path / "a.tsv").read_text(encoding="utf-8") == "caf\\xe9.jpg\tcat\n"
    with atomic_open(tmp_path / "b.txt") as f:
        f.write(name)
    assert (tmp_path / "b.txt").read_text(encoding="utf-8") == "caf\\xe9.jpg"
    atomic_write_json(tmp_path / "c.json", {"items": [name]}, ensure_ascii=False)
    assert json.loads((tmp_path / "c.json").read_text(encoding="utf-8")) == {"items": ["caf\\xe9.jpg"]}
    atomic_write_json(tmp_path / "d.json", {"items": [name]})  # ASCII escapes: read back exactly
    assert json.loads((tmp_path / "d.json").read_text(encoding="utf-8")) == {"items": [name]}


# --- devices ---------------------------------------------------------------------------------


def test_cpu_and_auto_without_a_gpu():
    assert resolve_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        assert resolve_device("auto") == torch.device("cpu")
        with pytest.raises(DeviceError, match="--device cuda: .* sees no CUDA GPU"):
            resolve_device("cuda")


@pytest.mark.parametrize("name", ["tpu", "gpu", "cuda:x", ""])
def test_unknown_device_names_are_one_line_errors(name):
    with pytest.raises(DeviceError, match="use auto, cpu, cuda or cuda:N"):
        resolve_device(name)


def _fake_gpus(monkeypatch, count):
    # No GPU can run here: pretend torch sees `count` of them (only the bookkeeping is tested).
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices.torch.cuda, "device_count", lambda: count)


def test_each_local_rank_gets_its_own_gpu(monkeypatch):
    _fake_gpus(monkeypatch, 4)
    for rank in range(4):
        monkeypatch.setenv("LOCAL_RANK", str(rank))
        assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", rank)
    assert resolve_device("cuda:2") == torch.device("cuda", 2)


def test_more_processes_than_visible_gpus_fails_clearly(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(
        DeviceError, match=r"LOCAL_RANK 3: only 2 GPU\(s\) are visible \(CUDA_VISIBLE_DEVICES=0,1\)"
    ):
        resolve_device("auto")
    with pytest.raises(DeviceError, match="--device cuda:5: only 2"):
        resolve_device("cuda:5")


# --- errors ----------------------------------------------------------------------------------


def test_user_errors_print_one_line_and_their_exit_code(capsys):
    class Stopped(UserError):
        exit_code = 3

    assert report("prog.py", UserError("bad --flag 0: must be at least 1")) == 2
    assert report("prog.py", Stopped("loss is nan")) == 3
    err = capsys.readouterr().err.splitlines()
    assert err == ["prog.py: error: bad --flag 0: must be at least 1", "prog.py: error: loss is nan"]
    assert not issubclass(UserError, (ValueError, RuntimeError)), (
        "a bug's ValueError must not pass as a user error"
    )
