"""A researcher's own images, end to end, as the README tells them: every command is the repository's
CLI called by its absolute path from a folder outside the repository, with relative paths there.

own photos + a CSV manifest (Hugging Face's `file_name` column) -> data2rec.py -> train.py with the
docs' tiny CPU model for one epoch (--resume latest on an empty folder says it starts afresh) ->
train.py --resume latest for a second epoch -> zero_shot.py on own class folders and on own labels,
with no --model-name (the config comes from the checkpoint) -> embed.py of the same folder.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests._repo import REPO

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
PER_COLOUR = 16  # 48 images: 3 steps of 16 per epoch


def _photo(path: Path, colour: tuple[int, int, int], seed: int) -> None:
    """A photo-sized picture: the colour with noise, not square, as a phone would save it."""
    rng = np.random.default_rng(seed)
    pixels = np.clip(np.array(colour) + rng.normal(0, 25, (48, 64, 3)), 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=90)


def _run(cwd: Path, script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python /abs/path/SCRIPT args` in the user's folder, as a user starts it (no PYTHONPATH)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(REPO / script), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"{script} {args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> Path:
    """The user's folder: photos/ with a metadata.csv, and held-out class folders under eval/."""
    home = tmp_path_factory.mktemp("researcher")
    assert REPO not in home.parents
    rows = [("file_name", "text")]
    for c, (name, colour) in enumerate(COLOURS.items()):
        for i in range(PER_COLOUR):
            _photo(home / "photos" / f"{name}_{i:02d}.jpg", colour, seed=100 * c + i)
            rows.append((f"{name}_{i:02d}.jpg", f"a photo of a {name} thing"))
        for i in range(3):
            _photo(home / "eval" / name / f"{i}.jpg", colour, seed=1000 + 100 * c + i)
    with open(home / "photos" / "metadata.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return home


@pytest.mark.slow
def test_own_images_convert_train_resume_evaluate_and_embed(user):
    # 1. convert: the manifest's file_name column is found without --image-column
    _run(user, "data2rec.py", "photos/metadata.csv", "--output", "rec/own", "--workers", "1", "--no-progress")
    assert json.loads((user / "rec" / "own.report.json").read_text())["written"] == 3 * PER_COLOUR

    # 2. train one epoch of the docs' tiny CPU model; --resume latest finds nothing and says so
    tiny = [
        "--train-data",
        "rec/",
        "--output",
        "runs/tiny",
        "--config",
        "RWKV_CLIP_tiny",
        "--batch-size",
        "16",
        "--precision",
        "fp32",
        "--device",
        "cpu",
        "--workers",
        "1",
        "--resume",
        "latest",
    ]
    first = _run(user, "train.py", *tiny, "--epochs", "1")
    log = (user / "runs" / "tiny" / "train.log").read_text()
    assert (
        "--resume latest: no checkpoint in runs/tiny/checkpoints yet, so this run starts from step 0" in log
    )
    metrics = [
        json.loads(line) for line in (user / "runs" / "tiny" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == [1, 3]  # the first step at once, then the epoch's end
    assert "finished at step 3: 3 steps, 48 samples in " in first.stdout
    assert (user / "runs" / "tiny" / "loss_curve.png").is_file()

    # 3. resume for a second epoch; the summary names the command that evaluates the last checkpoint
    second = _run(user, "train.py", *tiny, "--epochs", "2")
    assert "resumed from runs/tiny/checkpoints/epoch_001.pt at step 3" in second.stdout
    last = "runs/tiny/checkpoints/epoch_002.pt"
    assert f"evaluate the last one: python {REPO / 'zero_shot.py'} --model-weight {last} " in second.stdout
    assert (
        "finished at step 6: 3 steps, 48 samples in " in second.stdout
        and "resumed at step 3" in second.stdout
    )

    # 4. zero-shot on own class folders, no --model-name: the checkpoint's own config
    run = _run(
        user,
        "zero_shot.py",
        "--model-weight",
        last,
        "--datasets",
        "colours=eval",
        "--workers",
        "0",
        "--no-progress",
        "--output-dir",
        "results",
    )
    assert "[zero_shot] model: RWKV_CLIP_tiny, recorded in the weights" in run.stdout
    result = json.loads((user / "results" / "classification_colours.json").read_text())
    assert result["model"] == "RWKV_CLIP_tiny" and result["num_images"] == 9 and result["num_classes"] == 3
    assert [c["class"] for c in result["per_class"]] == ["blue", "green", "red"]
    assert result["templates"] and result["templates_from"].startswith("the default for a dataset")
    for suffix in (".predictions.tsv", ".confusion.csv", ".confusion.png"):
        assert (user / "results" / f"classification_colours{suffix}").is_file()

    labels = _run(
        user,
        "zero_shot.py",
        "--model-weight",
        last,
        "--images",
        "eval",
        "--labels",
        "red,green,blue",
        "--workers",
        "0",
        "--output-dir",
        "labelled",
    )
    assert len(labels.stdout.strip().splitlines()) == 9
    assert json.loads((user / "labelled" / "labels.json").read_text())["images"] == 9

    # 5. embed the photos through their manifest, again with the checkpoint's config
    embedded = _run(
        user,
        "embed.py",
        "--model-weight",
        last,
        "--images",
        "photos/metadata.csv",
        "--workers",
        "0",
        "--no-progress",
        "--output",
        "photos.npy",
    )
    assert "[embed] model: RWKV_CLIP_tiny, recorded in the weights" in embedded.stderr
    vectors = np.load(user / "photos.npy")
    assert vectors.shape == (3 * PER_COLOUR, 64) and np.allclose(
        np.linalg.norm(vectors, axis=1), 1, atol=1e-5
    )
    assert json.loads((user / "photos.index.json").read_text())["model"] == "RWKV_CLIP_tiny"
