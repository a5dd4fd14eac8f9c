"""Every inference CLI loads weights through the one loader (src/evaluation/model_loader.py): a .pt
file, a .safetensors file and hf-hub:ORG/REPO from the project's hub server give the same numbers;
and an unreadable image among good ones, decoded in DataLoader workers, is skipped, counted and
named instead of ending the run with a worker traceback."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import embed as embed_cli
import retrieval as retrieval_cli
import zero_shot as zero_shot_cli
from src.evaluation.clip_bench import load_for_clip_benchmark
from src.open_alip import tokenize
from src.open_alip.hub_server import serve_in_background
from src.open_alip.model import get_model_config
from tests._repo import REPO as REPO_ROOT
from tests.conftest import TINY, save_safetensors

HUB_REPO = "testorg/rwkv-clip-tiny"


def _photos(folder: Path, count: int = 3, corrupt: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / f"good_{i}.jpg")
    if corrupt:  # a JPEG start marker, then garbage: PIL refuses it when decoding
        (folder / corrupt).write_bytes(b"\xff\xd8\xff\xe0" + b"not really a jpeg" * 8)
    return folder


@pytest.fixture
def weights(tiny_weights, tmp_path, monkeypatch):
    """The tiny model's weights as .pt, .safetensors and hf-hub: (served from a folder)."""
    pt = tmp_path / "tiny.pt"
    torch.save(tiny_weights.model.state_dict(), pt)
    repo = tmp_path / "repo"
    repo.mkdir()
    save_safetensors(tiny_weights.model, repo / "model.safetensors")
    for name in list(os.environ):
        if name.startswith(("HF_", "HUGGING_FACE")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with serve_in_background(repo, HUB_REPO, repo_type="model") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        yield {"pt": str(pt), "safetensors": str(tiny_weights.path), "hub": f"hf-hub:{HUB_REPO}"}


def _common(out: Path) -> list[str]:
    return [
        "--model-name",
        TINY,
        "--device",
        "cpu",
        "--workers",
        "0",
        "--no-progress",
        "--output-dir",
        str(out),
    ]


def test_every_cli_loads_pt_safetensors_and_hf_hub(weights, tiny_weights, tmp_path, capsys):
    photos = _photos(tmp_path / "photos")
    manifest = tmp_path / "pairs.csv"
    with open(manifest, "w", newline="") as f:
        csv.writer(f).writerows(
            [["image", "caption"], *[[f"photos/good_{i}.jpg", f"photo {i}"] for i in range(3)]]
        )
    texts = tmp_path / "texts.txt"
    texts.write_text("a cat\na dog\n")
    expected_texts = F.normalize(
        tiny_weights.model.encode_text(tokenize(["a cat", "a dog"], 77)).float(), dim=-1
    )

    labels, recalls = [], []
    for kind, source in weights.items():
        out = tmp_path / kind
        rc = zero_shot_cli.main(
            [*_common(out), "--model-weight", source, "--images", str(photos), "--labels", "cat,dog"]
        )
        assert rc == 0, capsys.readouterr().err
        labels.append((out / "labels.tsv").read_text())
        rc = retrieval_cli.main([*_common(out), "--model-weight", source, "--datasets", f"pairs={manifest}"])
        assert rc == 0, capsys.readouterr().err
        recalls.append(json.loads((out / "retrieval_pairs.json").read_text())["metrics"])
        rc = embed_cli.main(
            [
                "--model-name",
                TINY,
                "--model-weight",
                source,
                "--texts",
                str(texts),
                "--device",
                "cpu",
                "--output",
                str(out / "texts.npy"),
                "--no-progress",
            ]
        )
        assert rc == 0, capsys.readouterr().err
        torch.testing.assert_close(torch.from_numpy(np.load(out / "texts.npy")), expected_texts)
        model, transform, tokenizer = load_for_clip_benchmark(
            TINY, source, device="cpu"
        )  # clip_benchmark_eval.py's
        torch.testing.assert_close(
            F.normalize(model.encode_text(tokenizer(["a cat", "a dog"])), dim=-1), expected_texts
        )
        assert transform.size == 32
    assert labels[0] == labels[1] == labels[2] and recalls[0] == recalls[1] == recalls[2]


@pytest.mark.parametrize("script", ["zero_shot.py", "retrieval.py", "embed.py"])
def test_help_names_every_weights_form(script):
    text = subprocess.run(
        [sys.executable, script, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert ".safetensors" in text and "hf-hub:ORG/REPO" in text and ".pt" in text
    assert "(default: the config the weights record" in " ".join(text.split())  # --model-name's default


def test_the_config_comes_from_the_weights_and_a_mismatch_is_one_line(tiny_weights, tmp_path, capsys):
    photos = _photos(tmp_path / "photos")
    state = tiny_weights.model.state_dict()
    recorded = tmp_path / "epoch_001.pt"  # as train.py saves it: the config beside the tensors
    torch.save({"state_dict": state, "config": get_model_config(TINY)}, recorded)
    bare = tmp_path / "bare.pt"
    torch.save(state, bare)
    common = ["--device", "cpu", "--workers", "0", "--no-progress"]
    for weights, how in (
        (recorded, "recorded in the weights"),
        (bare, "the one shipped config the weights fit"),
    ):
        out = tmp_path / weights.stem
        rc = zero_shot_cli.main(
            [
                *common,
                "--model-weight",
                str(weights),
                "--images",
                str(photos),
                "--labels",
                "cat,dog",
                "--output-dir",
                str(out),
            ]
        )
        err = capsys.readouterr().err
        assert rc == 0 and f"[zero_shot] model: {TINY}, {how}" in err, err
        assert (
            embed_cli.main(
                [
                    *common,
                    "--model-weight",
                    str(weights),
                    "--images",
                    str(photos),
                    "--output",
                    str(out / "e.npy"),
                ]
            )
            == 0
        )
        assert f"[embed] model: {TINY}, {how}" in capsys.readouterr().err
        assert json.loads((out / "e.index.json").read_text())["model"] == TINY
    for weights, hint in (
        (recorded, f"they record their own config, {TINY}: leave out --model-name"),
        (bare, f"they fit {TINY}: leave out --model-name, or pass --model-name {TINY}"),
    ):
        rc = zero_shot_cli.main(
            [
                *common,
                "--model-name",
                "RWKV_CLIP_demo",
                "--model-weight",
                str(weights),
                "--images",
                str(photos),
                "--labels",
                "cat,dog",
                "--output-dir",
                str(tmp_path),
            ]
        )
        err = capsys.readouterr().err
        assert rc == 2 and err == (
            f"zero_shot.py: error: --model-weight {weights} does not fit --model-name "
            f"RWKV_CLIP_demo (124 tensors of other shapes); {hint}\n"
        ), err


def test_unreadable_image_is_skipped_counted_and_named_with_workers(tiny_weights, tmp_path):
    photos = _photos(tmp_path / "photos", corrupt="broken.jpg")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            "zero_shot.py",
            "--model-name",
            TINY,
            "--model-weight",
            str(tiny_weights.path),
            "--device",
            "cpu",
            "--workers",
            "2",
            "--no-progress",
            "--images",
            str(photos),
            "--labels",
            "cat,dog",
            "--output-dir",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Original Traceback" not in proc.stderr and "Traceback" not in proc.stderr
    assert "skipped 1 unreadable image(s)" in proc.stderr and "broken.jpg" in proc.stderr
    rows = (out / "labels.tsv").read_text().splitlines()
    assert len(rows) == 4 and not any("broken.jpg" in r for r in rows)  # header + the 3 good images


def test_datasets_skip_unreadable_images_and_list_them(tiny_weights, tmp_path, capsys):
    tree = tmp_path / "tree"
    _photos(tree / "cat", 2, corrupt="broken.jpg")
    _photos(tree / "dog", 2)
    out = tmp_path / "out"
    rc = zero_shot_cli.main(
        [
            *_common(out),
            "--workers",
            "2",
            "--model-weight",
            str(tiny_weights.path),
            "--datasets",
            f"pets_like={tree}",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "skipped 1 unreadable image(s)" in captured.out and "broken.jpg" in captured.out
    result = json.loads((out / "classification_pets_like.json").read_text())
    assert result["num_images"] == 4 and [Path(s["image"]).name for s in result["skipped_images"]] == [
        "broken.jpg"
    ]

    pairs = tmp_path / "tree" / "pairs.csv"  # retrieval: the broken image's caption goes with it
    pairs.write_text("image,caption\ncat/good_0.jpg,one\ncat/broken.jpg,two\ndog/good_1.jpg,three\n")
    rc = retrieval_cli.main(
        [
            *_common(out),
            "--workers",
            "2",
            "--model-weight",
            str(tiny_weights.path),
            "--datasets",
            f"pairs={pairs}",
        ]
    )
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    result = json.loads((out / "retrieval_pairs.json").read_text())
    assert result["num_images"] == 2 and result["num_captions"] == 2 and len(result["skipped_images"]) == 1
    assert "broken.jpg" in captured.out


def test_shell_scripts_take_hf_hub_weights(weights, tmp_path):
    _photos(tmp_path / "photos")
    manifest = tmp_path / "pairs.csv"
    manifest.write_text("image,caption\n" + "".join(f"photos/good_{i}.jpg,photo {i}\n" for i in range(3)))
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "MODEL_NAME": TINY,
        "MODEL_WEIGHT": weights["hub"],
        "COCO": str(manifest),
        "FLICKR": str(manifest),
        "OUTPUT_DIR": str(tmp_path / "run"),
        "DEVICE": "cpu",
    }
    proc = subprocess.run(
        ["bash", "shell/test_zero_shot_retrieval.sh", "--workers", "0", "--no-progress"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        json.loads((tmp_path / "run" / "eval" / "retrieval_coco.json").read_text())["checkpoint"]
        == weights["hub"]
    )
    proc = subprocess.run(
        ["bash", "shell/test_zero_shot_classificaiton.sh"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**env, "MODEL_WEIGHT": str(tmp_path / "missing.pt")},
        timeout=60,
    )
    assert proc.returncode == 2 and "hf-hub:ORG/REPO" in proc.stderr
