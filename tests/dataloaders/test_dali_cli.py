"""dali.py, the loader smoke test: real shards, real DALI CPU pipelines."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import dali
from dataloaders.smoke import check_batch
from src.figures import caption_font
from src.recordio import IRHeader, MXIndexedRecordIO, pack
from tests._loader_helpers import caption_tokens, write_shard
from tests._repo import REPO


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    write_shard(d / "s-0", range(24), k={i: 1 + i % 3 for i in range(24)})  # 1, 2 or 3 captions per record
    write_shard(d / "s-1", range(50, 60), k=1)
    return d


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = dali.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_checks_pass_and_grid_is_written(data, tmp_path, capsys):
    grid = tmp_path / "grid.png"
    code, out, err = run_main(
        capsys,
        "--data",
        str(data),
        "--batch-size",
        "8",
        "--steps",
        "5",
        "--input-size",
        "32",
        "--device",
        "cpu",
        "--workers",
        "2",
        "--save-grid",
        str(grid),
        "--cache-dir",
        str(tmp_path / "c"),
    )
    assert code == 0, err
    assert "all checks passed" in out and "checked 40 images in 5 batch(es)" in out
    assert "images/s (40 images in 5 batches after the first, timed back to back without the checks)" in out
    assert "34 records in 2 shard(s)" in out
    # The bar counts the batches read, 5 timed and 5 checked, and stops there.
    # (A count past the total would read "11/10 [", or "11batch [" had the bar no total; a rate
    # such as "11.71batch/s" is neither.)
    counts = [int(n) for n in re.findall(r"(\d+)(?:/10|batch) \[", err)]
    assert counts and max(counts) == 10, err
    # Captions keep their spaces: at Pillow's default size a space is about a pixel wide.
    assert caption_font().getlength(" ") >= 3
    with Image.open(grid) as img:
        # 8 images in 4 columns, 160-pixel cells with a caption strip under each.
        assert img.size == (4 * 160, 2 * (160 + 64))
        assert len({tuple(px) for px in np.asarray(img.convert("RGB")).reshape(-1, 3)[::97].tolist()}) > 4
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def test_eval_reader_processes_and_torch_backend(data, tmp_path, capsys):
    for extra in (["--eval"], ["--reader-workers", "1"], ["--backend", "torch", "--workers", "0"]):
        code, out, err = run_main(
            capsys,
            "--data",
            str(data / "s-0"),
            "--data",
            str(data / "s-1.rec"),
            "--batch-size",
            "6",
            "--steps",
            "3",
            "--input-size",
            "32",
            "--device",
            "cpu",
            "--cache-dir",
            str(tmp_path / "c"),
            *extra,
        )
        assert code == 0, (extra, err)
        assert "all checks passed" in out


def test_captions_without_an_end_token_fail_the_checks(tmp_path, capsys):
    prefix = tmp_path / "noend"
    with MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "w") as rec:
        jpg = tmp_path / "x.jpg"
        Image.new("RGB", (40, 30), (10, 200, 30)).save(jpg)
        for i in range(8):
            label = np.zeros(77, np.float32)
            label[:3] = [49406, 320 + i, 320]  # captions that never end
            rec.write_idx(i, pack(IRHeader(0, label, i, 0), jpg.read_bytes()))
    code, out, err = run_main(
        capsys,
        "--data",
        str(prefix),
        "--batch-size",
        "4",
        "--steps",
        "2",
        "--input-size",
        "32",
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path / "c"),
    )
    assert code == 1
    assert "no end token 49407" in err
    assert "all checks passed" not in out


def test_corrupt_record_fails_with_its_name(tmp_path, capsys):
    write_shard(tmp_path / "broken", range(8), corrupt={6})
    args = [
        "--data",
        str(tmp_path / "broken"),
        "--batch-size",
        "4",
        "--steps",
        "2",
        "--eval",
        "--input-size",
        "32",
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    for backend in ("dali", "torch"):
        code, out, err = run_main(capsys, *args, "--backend", backend, "--workers", "1")
        assert code == 1, err
        failed = [ln for ln in err.splitlines() if "FAILED" in ln]
        assert len(failed) == 1 and "broken.rec record key 6 at byte" in failed[0] and "Traceback" not in err
    # Allowed to skip one, the run passes and says so.
    code, out, err = run_main(capsys, *args, "--max-bad-records", "1")
    assert code == 0 and "all checks passed" in out and "skipped 1 record(s)" in err


def _shard_with_labels(prefix: Path, labels: list) -> None:
    jpg = prefix.parent / "x.jpg"
    Image.new("RGB", (40, 30), (10, 200, 30)).save(jpg)
    with MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "w") as rec:
        for i, label in enumerate(labels):
            rec.write_idx(i, pack(IRHeader(0, label, i, 0), jpg.read_bytes()))


def _move_offset(prefix: Path, line: int, by: int) -> None:
    idx = Path(f"{prefix}.idx")
    rows = [ln.split("\t") for ln in idx.read_text().splitlines()]
    rows[line][1] = str(int(rows[line][1]) + by)
    idx.write_text("".join(f"{k}\t{o}\n" for k, o in rows))


def _keep_index_rows(prefix: Path, keep: slice) -> Path:
    idx = Path(f"{prefix}.idx")
    idx.write_text("".join(idx.read_text().splitlines(keepends=True)[keep]))
    return prefix


def _other_shards_index(d: Path, rec: str) -> Path:
    """`rec`.rec beside the index of the other shard (small: 64x48 images, big: 160x120)."""
    write_shard(d / "small", range(10))
    write_shard(d / "big", range(10), size=(160, 120))
    shutil.copy(d / f"{'small' if rec == 'big' else 'big'}.idx", d / f"{rec}.idx")
    return d / rec


@pytest.mark.parametrize(
    "make_data, code, fragments",
    [
        # An offset that falls inside a record: in the middle it is met while reading, at the end
        # the check before the run finds it.
        (
            lambda d: (write_shard(d / "s", range(8)), _move_offset(d / "s", 5, 8), d / "s")[-1],
            1,
            ["s.rec record key 5 at byte", "no record starts at this offset (bad magic"],
        ),
        (
            lambda d: (write_shard(d / "s", range(8)), _move_offset(d / "s", 7, 8), d / "s")[-1],
            2,
            ["s.rec record key 7 at byte", "does not belong to this .rec"],
        ),
        (
            lambda d: (write_shard(d / "s", range(8)), _move_offset(d / "s", 3, 2), d / "s")[-1],
            2,
            ["s.idx: offset", "is not the start of a record"],
        ),
        (
            lambda d: _other_shards_index(d, "big"),
            2,
            ["big.rec record key 0 at byte 0", "runs past byte", "does not belong to this .rec"],
        ),
        (lambda d: _other_shards_index(d, "small"), 2, ["small.idx: offset", "past the end of small.rec"]),
        # An index of the first 100 of 256 records: the rest of the .rec was once never read, unseen.
        (
            lambda d: (write_shard(d / "s", range(256)), _keep_index_rows(d / "s", slice(0, 100)))[-1],
            2,
            [
                "s.rec record key 99 at byte",
                "but the file ends at byte",
                "the index does not list the",
                "bytes after it",
            ],
        ),
        # An index that skips records in the middle (the probe reads the first and last record of a
        # shard: the last before the gap is met when the smoke test reads it).
        (
            lambda d: (write_shard(d / "s", range(6)), _keep_index_rows(d / "s", slice(0, 6, 2)))[-1],
            2,
            ["s.rec record key 4 at byte", "but the file ends at byte"],
        ),
        # im2rec's classification records: one number as the label.
        (
            lambda d: (_shard_with_labels(d / "im2rec", [float(i % 3) for i in range(8)]), d / "im2rec")[-1],
            2,
            ["im2rec.rec record key 0", "single number (flag 0)", "data2rec.py"],
        ),
        # Captions of another tool's context length: 32 token values per record.
        (
            lambda d: (
                _shard_with_labels(d / "ctx32", [caption_tokens(i, 1)[0, :32] for i in range(8)]),
                d / "ctx32",
            )[-1],
            2,
            [
                "ctx32.rec record key 0",
                "32 caption token values, not a positive multiple of 77",
                "convert the data with it",
            ],
        ),
        (
            lambda d: (
                _shard_with_labels(
                    d / "vocab", [np.where(np.arange(77) == 0, 49406, 60000).astype(np.float32)] * 8
                ),
                d / "vocab",
            )[-1],
            2,
            ["vocab.rec record key 0", "outside 0..49407"],
        ),
    ],
    ids=[
        "offset-inside-a-record",
        "last-offset-inside",
        "misaligned-offset",
        "rec-with-a-smaller-shards-idx",
        "rec-with-a-larger-shards-idx",
        "index-of-part-of-the-rec",
        "index-with-gaps",
        "scalar-label",
        "context-length-32",
        "tokens-outside-vocabulary",
    ],
)
def test_unusable_data_gets_one_line_naming_the_file(tmp_path, capsys, make_data, code, fragments):
    data = make_data(tmp_path)
    got, out, err = run_main(
        capsys,
        "--data",
        str(data),
        "--batch-size",
        "4",
        "--steps",
        "2",
        "--input-size",
        "32",
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path / "c"),
    )
    lines = [ln for ln in err.splitlines() if "error:" in ln or "FAILED" in ln]
    assert got == code and len(lines) == 1, err
    assert all(f in lines[0] for f in fragments), lines[0]
    assert "Traceback" not in err and "all checks passed" not in out


def test_the_guides_data_dir_and_rec_file(tmp_path, capsys, monkeypatch):
    guide = tmp_path / "YFCC15M"
    write_shard(guide / "datarec", range(12), k={i: 1 + i % 3 for i in range(12)})
    write_shard(guide / "extra", range(30, 36))
    common = [
        "--batch-size",
        "4",
        "--steps",
        "2",
        "--input-size",
        "32",
        "--device",
        "cpu",
        "--cache-dir",
        str(tmp_path / "c"),
    ]
    # Verbatim, in a real process, as the guide writes it (with the folder and tiny sizes filled in).
    ran = subprocess.run(
        [sys.executable, "dali.py", "--data-dir", str(guide), "--rec-file", "datarec.rec", *common],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "12 records in 1 shard(s)" in ran.stdout and "all checks passed" in ran.stdout
    # --data-dir alone: every shard in the folder.
    code, out, err = run_main(capsys, "--data-dir", str(guide), *common)
    assert code == 0 and "18 records in 2 shard(s)" in out, err
    # Not under --data-dir: the working folder is next.
    monkeypatch.chdir(guide)
    code, out, err = run_main(capsys, "--data-dir", str(tmp_path), "--rec-file", "extra.rec", *common)
    assert code == 0 and "6 records in 1 shard(s)" in out, err
    code, out, err = run_main(capsys, "--data-dir", str(tmp_path), "--rec-file", "missing.rec", *common)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"not found in {tmp_path} nor in the working folder {guide}" in err


def test_check_batch_catches_layout_and_range_errors():
    tokens = torch.zeros(2, 77, dtype=torch.int64)
    tokens[:, 0], tokens[:, 1] = 49406, 49407
    good = torch.zeros(2, 3, 8, 8)
    assert check_batch(good, tokens, 2, 8) == []
    assert "shape" in check_batch(torch.zeros(2, 8, 8, 3), tokens, 2, 8)[0]
    assert "outside the CLIP-normalised range" in check_batch(good + 100, tokens, 2, 8)[0]  # 0..255 pixels
    assert "float32" in check_batch(good.double(), tokens, 2, 8)[0]
    late = tokens.clone()
    late[0, 5] = 7
    assert "after the end token" in check_batch(good, late, 2, 8)[0]


def test_cli_help_and_bad_input_in_a_real_process(tmp_path, capsys):
    helped = subprocess.run([sys.executable, "dali.py", "--help"], cwd=REPO, capture_output=True, text=True)
    assert helped.returncode == 0 and "--save-grid" in helped.stdout and "--data" in helped.stdout
    missing = subprocess.run(
        [sys.executable, "dali.py", "--data", str(tmp_path / "none"), "--cache-dir", str(tmp_path / "c")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and "none" in lines[0] and "Traceback" not in missing.stderr
    bad_arg = subprocess.run(
        [sys.executable, "dali.py", "--data", "x", "--steps", "0"], cwd=REPO, capture_output=True, text=True
    )
    assert bad_arg.returncode == 2 and "--steps must be at least 1" in bad_arg.stderr
    for argv, fragment in [
        (["--data", "x", "--workers", "100000"], "--workers 100000: use 0 to"),
        (["--data-dir", str(tmp_path / "none")], "no such folder"),
        ([], "no shards given"),
    ]:
        with pytest.raises(SystemExit) as stop:
            dali.parse_args(argv)
        assert stop.value.code == 2 and fragment in capsys.readouterr().err
    cores = len(os.sched_getaffinity(0))
    assert dali.max_workers() == max(8, 4 * cores)
