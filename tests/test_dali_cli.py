"""dali.py, the loader smoke test: real shards, real DALI CPU pipelines."""


import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import dali
from dataloaders.smoke import check_batch
from src.recordio import IRHeader, MXIndexedRecordIO, pack
from tests._loader_helpers import write_shard

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli")
    write_shard(d / "s-0", range(24))
    write_shard(d / "s-1", range(50, 60), k=1)
    return d


def run_main(capsys, *argv: str) -> tuple[int, str, str]:
    code = dali.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_checks_pass_and_grid_is_written(data, tmp_path, capsys):
    grid = tmp_path / "grid.png"
    code, out, err = run_main(
        capsys, "--data", str(data), "--batch-size", "8", "--steps", "5", "--input-size", "32",
        "--device", "cpu", "--workers", "2", "--save-grid", str(grid), "--cache-dir", str(tmp_path / "c"),
    )
    assert code == 0, err
    assert "all checks passed" in out and "images/s" in out and "decodes/s per core" in out
    assert "34 records in 2 shard(s)" in out
    with Image.open(grid) as img:
        # 8 images in 4 columns, 160-pixel cells with a caption strip under each.
        assert img.size == (4 * 160, 2 * (160 + 64))
        assert len({tuple(px) for px in np.asarray(img.convert("RGB")).reshape(-1, 3)[::97].tolist()}) > 4
    assert not [p for p in tmp_path.iterdir() if p.suffix == ".tmp"]


def test_eval_and_torch_backend(data, tmp_path, capsys):
    for extra in (["--eval"], ["--backend", "torch", "--workers", "0"]):
        code, out, err = run_main(
            capsys, "--data", str(data / "s-0"), "--data", str(data / "s-1.rec"), "--batch-size", "6",
            "--steps", "3", "--input-size", "32", "--device", "cpu", "--cache-dir", str(tmp_path / "c"), *extra,
        )
        assert code == 0, (extra, err)
        assert "all checks passed" in out


def test_invalid_tokens_fail_the_run(tmp_path, capsys):
    prefix = tmp_path / "badtok"
    with MXIndexedRecordIO(f"{prefix}.idx", f"{prefix}.rec", "w") as rec:
        jpg = (tmp_path / "x.jpg")
        Image.new("RGB", (40, 30), (10, 200, 30)).save(jpg)
        for i in range(8):
            label = np.zeros(77, np.float32)
            label[:3] = [49406, 60000 + i, 320]  # an id past the vocabulary and no end token
            rec.write_idx(i, pack(IRHeader(0, label, i, 0), jpg.read_bytes()))
    code, out, err = run_main(capsys, "--data", str(prefix), "--batch-size", "4", "--steps", "2",
                              "--input-size", "32", "--device", "cpu", "--cache-dir", str(tmp_path / "c"))
    assert code == 1
    assert "token ids outside 0..49407" in err and "no end token 49407" in err
    assert "all checks passed" not in out


def test_corrupt_record_fails_with_its_name(tmp_path, capsys):
    write_shard(tmp_path / "broken", range(8), corrupt={6})
    code, out, err = run_main(capsys, "--data", str(tmp_path / "broken"), "--batch-size", "4", "--steps", "2",
                              "--eval", "--input-size", "32", "--device", "cpu", "--cache-dir", str(tmp_path / "c"))
    assert code == 1
    assert "broken.rec record key 6" in err


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


def test_cli_help_and_bad_input_in_a_real_process(tmp_path):
    helped = subprocess.run([sys.executable, "dali.py", "--help"], cwd=REPO, capture_output=True, text=True)
    assert helped.returncode == 0 and "--save-grid" in helped.stdout and "--data" in helped.stdout
    missing = subprocess.run(
        [sys.executable, "dali.py", "--data", str(tmp_path / "none"), "--cache-dir", str(tmp_path / "c")],
        cwd=REPO, capture_output=True, text=True,
    )
    assert missing.returncode == 2
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and "none" in lines[0] and "Traceback" not in missing.stderr
    bad_arg = subprocess.run([sys.executable, "dali.py", "--data", "x", "--steps", "0"], cwd=REPO,
                             capture_output=True, text=True)
    assert bad_arg.returncode == 2 and "--steps must be at least 1" in bad_arg.stderr
