"""benchmarks/linear_probe_time.py: its generated datasets read as linear_probe.py reads the real ones,
and the timings of a first and a cached run come out, with the JSON written."""

from __future__ import annotations

import json

import torch

from benchmarks import linear_probe_time as bench
from src.open_alip.model import get_model_config
from tests import _eval_layouts as layouts


def test_generated_layouts_probe_and_time_a_first_and_a_cached_run(tmp_path, capsys):
    config = tmp_path / "micro.json"
    config.write_text(json.dumps(get_model_config("RWKV_CLIP_tiny", **layouts.MICRO)))
    weights = tmp_path / "micro.pt"
    torch.save(layouts.micro_model().state_dict(), weights)
    output = tmp_path / "timings.json"
    assert (
        bench.main(
            [
                "--model-weight",
                str(weights),
                "--model-name",
                str(config),
                "--datasets",
                "dtd,cifar100",
                "--scale",
                "0.004",
                "--workers",
                "0",
                "--data",
                str(tmp_path / "data"),
                "--output",
                str(output),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    report = json.loads(output.read_text())
    assert set(report["datasets"]) == {"dtd", "cifar100"} and report["scale"] == 0.004
    dtd = report["datasets"]["dtd"]
    assert dtd["images"] == {"train": 47, "val": 47, "test": 47}  # every class once, whatever the scale
    assert report["datasets"]["cifar100"]["images"]["test"] == 100
    for entry in report["datasets"].values():
        assert entry["extract_seconds"] > 0 and entry["fits"] == len(entry["lbfgs_iterations"]) <= 16
        assert entry["cached_wall_seconds"] > 0 and entry["first_cpu_seconds"] > 0
    assert "cached run s" in out and "[bench] dtd: first run" in out
    assert (tmp_path / "data" / "dtd" / ".generated").read_text() == "0.004"  # kept, reused by a rerun


def test_solver_mode_times_a_fit_on_memory_mapped_features(tmp_path, capsys):
    assert bench.main(["--solver", "20000x16x8", "--max-iter", "4", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "[bench] solver: 20,000 x 16 features (0.00 GB, memory-mapped), 8 classes, on cpu" in out
    assert "s per evaluation" in out and "anonymous memory" in out
    assert list(tmp_path.iterdir()) == []  # the feature file is gone
