"""linear_probe.py and shell/test_linear_probe.sh on a micro model: a linearly separable folder of
your own reaches 100%, the paper's datasets give the paper's linear-probe row, features are read
back from the cache for the same weights (in any file form) and extracted again when the weights
change, unreadable images are skipped and counted, CLIP_benchmark's protocol runs on the same
features, and bad input is refused in one line before the model loads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import linear_probe as linear_probe_cli
from src.open_alip.model import get_model_config
from tests import _eval_layouts as layouts
from tests._repo import REPO
from tests.conftest import save_safetensors

# Distinct colours, a little noise: the micro model's (random) features separate them linearly.
COLOURS = [(220, 30, 30), (30, 200, 40), (40, 40, 220), (230, 220, 30)]


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("probe")
    config = root / "micro.json"
    config.write_text(json.dumps(get_model_config("RWKV_CLIP_tiny", **layouts.MICRO)))
    model = layouts.micro_model()
    weights = root / "micro.pt"
    torch.save(model.state_dict(), weights)
    same = save_safetensors(model, root / "micro.safetensors")
    other = root / "other.pt"
    torch.save(layouts.micro_model(seed=1).state_dict(), other)
    own = layouts.write_own_splits(root / "own", COLOURS, {"train": 8, "val": 3, "test": 4})
    return {"root": root, "config": config, "weights": weights, "same": same, "other": other, "own": own}


def _run(micro, tmp_path, capsys, *extra: str, weights: Path | None = None) -> tuple[int, str, str]:
    args = [
        "--model-name",
        str(micro["config"]),
        "--model-weight",
        str(weights or micro["weights"]),
        "--device",
        "cpu",
        "--workers",
        "0",
        "--no-progress",
        "--wkv-impl",
        "reference",
        "--output-dir",
        str(tmp_path / "out"),
        *extra,
    ]
    rc = linear_probe_cli.main(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_separable_set_reaches_100_and_the_cache_follows_the_weights(micro, tmp_path, capsys):
    own = f"own={micro['own']}"
    rc, out, err = _run(micro, tmp_path, capsys, "--datasets", own)
    assert rc == 0, err
    result = json.loads((tmp_path / "out" / "linear_probe_own.json").read_text())
    assert result["task"] == "linear_probe" and result["protocol"] == "paper" and result["metric"] == "top1"
    assert result["metrics"]["top1"] == 100.0 and result["score"] == 100.0
    assert result["images"] == {"train": 32, "val": 12, "test": 16}
    assert result["validation"] == "the dataset's val split"
    reg = result["regularization"]
    assert (
        reg["lambda"] == pytest.approx(1 / reg["C"])
        and 7 <= reg["fits"] <= 16
        and len(reg["sweep"]) == reg["fits"] - 1
    )
    summary = json.loads((tmp_path / "out" / "linear_probe.json").read_text())
    assert summary == {"own": result["metrics"]}
    assert (
        out.count("features extracted in") == 3
        and "fit 1: lambda 1e-6.000" in out
        and "L-BFGS iterations" in out
    )
    entries = sorted(p.name for p in (tmp_path / "out" / "features").iterdir())
    assert len(entries) == 3 and all(name.startswith("own-") for name in entries)

    # the same weights as .safetensors: every split read back from the cache, the same result
    rc, out, _ = _run(micro, tmp_path, capsys, "--datasets", own, weights=micro["same"])
    assert rc == 0 and out.count("features read from the cache") == 3 and "extracted" not in out
    again = json.loads((tmp_path / "out" / "linear_probe_own.json").read_text())
    assert again["metrics"] == result["metrics"] and again["regularization"] == {
        **reg,
        "sweep": again["regularization"]["sweep"],
    }
    assert [s["lambda"] for s in again["regularization"]["sweep"]] == [s["lambda"] for s in reg["sweep"]]

    # other weights: new entries, extracted again
    rc, out, _ = _run(micro, tmp_path, capsys, "--datasets", own, weights=micro["other"])
    assert rc == 0 and out.count("features extracted in") == 3
    assert len(list((tmp_path / "out" / "features").iterdir())) == 6


def test_the_papers_datasets_and_the_papers_row(micro, tmp_path, capsys):
    data = tmp_path / "data"
    layouts.write_dtd(data)
    layouts.write_pets(data)
    dtd = layouts.write_probe_splits(data, "dtd")
    layouts.write_probe_splits(data, "pets")
    rc, out, err = _run(micro, tmp_path, capsys, "--data-root", str(data))  # every dataset found there
    assert rc == 0, err
    results = {
        name: json.loads((tmp_path / "out" / f"linear_probe_{name}.json").read_text())
        for name in ("dtd", "pets")
    }
    assert results["dtd"]["validation"] == "the dataset's val split"
    assert results["dtd"]["images"] == {"train": len(dtd["train"][0]), "val": len(dtd["val"][0]), "test": 47}
    assert (
        results["pets"]["validation"] == "0.2 of train held out (seed 0)"
        and results["pets"]["images"]["val"] == 1
    )
    assert results["pets"]["metric"] == "mean_per_class_recall" and results["dtd"]["metric"] == "top1"
    lines = out.splitlines()
    header = lines[lines.index("The paper's linear-probe table (paper protocol):") + 1]
    assert [c.strip() for c in header.split("|")] == [
        "Model",
        "CIFAR10",
        "CIFAR100",
        "Food101",
        "Pets",
        "Flowers",
        "SUN397",
        "Cars",
        "DTD",
        "Caltech101",
        "Aircraft",
        "Average",
    ]
    row = [c.strip() for c in lines[lines.index(header) + 1].split("|")]
    assert (
        row[0] == "micro"
        and row[4] == f"{results['pets']['score']:.1f}"
        and row[8] == f"{results['dtd']['score']:.1f}"
    )
    assert row[1] == "-" and row[-1] == "-"  # not every dataset probed: no average


def test_unreadable_images_are_skipped_and_counted(micro, tmp_path, capsys):
    own = tmp_path / "own"
    layouts.write_own_splits(own, COLOURS[:2], {"train": 4, "test": 2})
    (own / "train" / "class1" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    rc, out, err = _run(micro, tmp_path, capsys, "--datasets", f"own={own}")
    assert rc == 0, err
    result = json.loads((tmp_path / "out" / "linear_probe_own.json").read_text())
    assert [(s["split"], Path(s["image"]).name) for s in result["skipped_images"]] == [
        ("train", "broken.png")
    ]
    assert result["images"]["train"] + result["images"]["val"] == 8  # the 8 readable training images
    assert "skipped 1 unreadable image(s)" in out


def test_clip_benchmarks_protocol_on_the_same_features(micro, tmp_path, capsys):
    own = f"own={micro['own']}"
    rc, out, err = _run(
        micro, tmp_path, capsys, "--datasets", own, "--protocol", "clip_benchmark", "--cb-epochs", "2"
    )
    assert rc == 0, err
    result = json.loads((tmp_path / "out" / "linear_probe_own.json").read_text())
    cb = result["clip_benchmark_metrics"]
    assert result["protocol"] == "clip_benchmark" and cb["lp_acc1"] * 100 == pytest.approx(
        result["metrics"]["top1"]
    )
    assert cb["lp_acc5"] is None and result["metrics"]["top5"] is None  # 4 classes: its acc5 is NaN
    assert cb["weight_decay"] == result["clip_benchmark"]["weight_decay"] and cb["epochs"] == 2
    assert "weight decay" in out and "final fit on train + val" in out


@pytest.mark.parametrize(
    "extra,needle",
    [
        ((), "no datasets given; use --datasets NAME=PATH"),
        (("--datasets", "flat={root}/flat"), "has no train/ and test/ folders"),
        (("--data-root", "{root}/flat"), "none of the linear-probe datasets is there"),
        (("--datasets", "own={own}", "--val-fraction", "1.5"), "--val-fraction 1.5"),
        (
            ("--datasets", "own={own}", "--feature-cache", "/proc/no"),
            "--feature-cache /proc/no: cannot write there",
        ),
    ],
)
def test_bad_input_is_one_line_before_the_model_loads(micro, tmp_path, capsys, extra, needle):
    (tmp_path / "flat" / "cat").mkdir(parents=True)
    args = [a.format(root=tmp_path, own=micro["own"]) for a in extra]
    rc = linear_probe_cli.main(
        ["--model-weight", str(tmp_path / "missing.pt"), "--output-dir", str(tmp_path / "o"), *args]
    )
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("linear_probe.py: error:") and needle in err, (
        err
    )


def test_list_datasets_and_the_shell_script(micro, tmp_path, capsys):
    assert linear_probe_cli.main(["--list-datasets"]) == 0
    assert "flowers       102      1,020   1,020  6,149   its own val split" in capsys.readouterr().out
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    data = tmp_path / "data"
    layouts.write_flowers(data)
    layouts.write_probe_splits(data, "flowers")
    env.update(
        MODEL_NAME=str(micro["config"]),
        MODEL_WEIGHT=str(micro["weights"]),
        DATA_ROOT=str(data),
        OUTPUT_DIR=str(tmp_path / "run"),
        DEVICE="cpu",
        WORKERS="0",
        PYTHON=sys.executable,
    )
    proc = subprocess.run(
        ["bash", "shell/test_linear_probe.sh", "--wkv-impl", "reference", "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "datasets: flowers=" in proc.stdout
    result = json.loads((tmp_path / "run" / "eval" / "linear_probe_flowers.json").read_text())
    assert result["metric"] == "mean_per_class_recall" and result["images"] == {
        "train": 1,
        "val": 1,
        "test": 3,
    }
    assert (tmp_path / "run" / "eval" / "features").is_dir()
