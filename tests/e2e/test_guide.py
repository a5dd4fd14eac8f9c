"""The published how-to guide's four commands, verbatim, in a fresh copy of the repository.

A user with the guide open runs, from the repository root:

    bash data/download_YFCC15M.sh
    python data2rec.py
    python dali.py --data-dir /path/to/YFCC15M --rec-file datarec.rec
    export DATA_ROOT=/path/to/YFCC15M; bash shell/train_RWKV_CLIP_B32_YFCC15M.sh

Here `HF_ENDPOINT` points at the project's own hub server on 127.0.0.1 serving a
YFCC15M-format repository, and only the training command gets extra arguments appended (a tiny
model and a few CPU steps), as the guide's own "[extra train.py flags...]" allows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from src.demo.corpus import write_hub_corpus
from src.open_alip.hub_server import serve_in_background
from tests._repo import fresh_copy

TINY_RUN = [
    "--config",
    "RWKV_CLIP_tiny",
    "--global-batch-size",
    "16",
    "--batch-size",
    "16",
    "--epochs",
    "1",
    "--max-steps",
    "2",
    "--device",
    "cpu",
    "--workers",
    "1",
    "--log-every-n-steps",
    "1",
    # Compiling is tested in test_train_e2e; here it would only add half a minute of C++ builds.
    "--no-compile",
]


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, (
        f"{command!r} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.mark.slow
def test_the_guides_four_commands_work_verbatim(tmp_path):
    hub = tmp_path / "hub"
    write_hub_corpus(hub, num_samples=96, image_size=32, num_shards=2, captions_per_row=1, progress=False)
    clone = fresh_copy(tmp_path / "RWKV-CLIP")
    assert not (clone / ".venv").exists() and not (clone / "YFCC15M").exists()
    env = {
        **os.environ,
        # `python` in the guide is the project's environment; put it first on PATH, as activating it would.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "HOME": str(tmp_path / "home"),
        "OMP_NUM_THREADS": "1",
        "RWKV_CLIP_CACHE": str(tmp_path / "cache"),
    }
    with serve_in_background(hub, "Kaichengalex/YFCC15M") as server:
        env["HF_ENDPOINT"] = server.endpoint
        _run("bash data/download_YFCC15M.sh", clone, env)
    dataset = clone / "YFCC15M"
    assert sorted(p.name for p in (dataset / "data").glob("*.parquet")) == [
        "train-00000-of-00002.parquet",
        "train-00001-of-00002.parquet",
    ]

    converted = _run("python data2rec.py", clone, env)
    assert "no input given: converting ./YFCC15M" in converted.stdout + converted.stderr
    assert (dataset / "datarec.rec").is_file() and (dataset / "datarec.idx").is_file()
    assert sum(1 for _ in open(dataset / "datarec.idx")) == 96

    smoke = _run(f"python dali.py --data-dir {dataset} --rec-file datarec.rec", clone, env)
    assert "all checks passed" in smoke.stdout

    trained = _run(
        f"export DATA_ROOT={dataset}; bash shell/train_RWKV_CLIP_B32_YFCC15M.sh " + " ".join(TINY_RUN),
        clone,
        env,
    )
    log = trained.stdout + trained.stderr
    assert "datarec.rec" in log and "96" in log  # the launcher names the shard it found and its records
    run_dir = clone / "output" / "RWKV_CLIP_B32_YFCC15M"
    assert (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").glob("*.pt"))
    assert "finished at step 2" in (run_dir / "train.log").read_text()
