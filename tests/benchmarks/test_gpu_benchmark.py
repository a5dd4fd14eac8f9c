"""benchmarks/gpu.py on a machine without a GPU: its one-line exit and every piece that
does not need a GPU (report writing, time budgets, section isolation, the generated
JPEG shards, the training step). No GPU number is faked here."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from benchmarks import gpu
from dataloaders.imagenet import build_loader
from src.open_alip import ClipLoss, create_model
from tests._repo import REPO


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_without_a_gpu_it_prints_one_line_and_exits_0(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "--output", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and "no CUDA GPU" in proc.stdout
    assert not out.exists()


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_budget_counts_down_and_refuses_what_does_not_fit():
    clock = FakeClock()
    budget = gpu.Budget(60, clock=clock)
    assert budget.allows(60) and budget.left() == 60
    clock.now += 45
    assert budget.elapsed() == 45 and budget.allows(15) and not budget.allows(16)
    clock.now += 30
    assert budget.left() == -15 and not budget.allows(0)


def test_report_is_rewritten_after_every_change(tmp_path):
    path = tmp_path / "r.json"
    results = gpu.Results(path, {"device": "test"})
    assert json.loads(path.read_text())["status"] == "running"
    results.add_case("wkv", {"impl": "chunked", "ms": 1.5})
    assert json.loads(path.read_text())["sections"]["wkv"]["cases"] == [{"impl": "chunked", "ms": 1.5}]
    results.set("wkv", note="x")
    assert json.loads(path.read_text())["sections"]["wkv"]["note"] == "x"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_a_failing_section_is_recorded_and_the_next_one_runs(tmp_path, capsys):
    results = gpu.Results(tmp_path / "r.json", {})

    def broken(r, b):
        r.add_case("wkv", {"impl": "chunked", "ms": 2.0})
        raise RuntimeError("kernel exploded\nsecond line")

    def fine(r, b):
        r.add_case("nccl", {"init_s": 0.5, "budget_seen": b.seconds})

    gpu.run_section("wkv", broken, results, gpu.Budget(10))
    gpu.run_section("nccl", fine, results, gpu.Budget(20))
    saved = json.loads((tmp_path / "r.json").read_text())["sections"]
    assert saved["wkv"]["status"] == "error"
    assert saved["wkv"]["error"] == "RuntimeError: kernel exploded"
    assert saved["wkv"]["cases"] == [{"impl": "chunked", "ms": 2.0}]  # what ran before the failure stays
    assert saved["nccl"]["status"] == "done" and saved["nccl"]["cases"][0]["budget_seen"] == 20
    gpu.print_tables(results)
    out = capsys.readouterr().out
    assert "== wkv: error" in out and "== nccl: done" in out


def test_a_rerun_keeps_the_sections_it_does_not_redo(tmp_path):
    path = tmp_path / "r.json"
    first = gpu.Results(path, {})
    first.add_case("train", {"model": "B32", "peak_bytes": 5})
    first.add_case("wkv", {"impl": "chunked"})
    kept = gpu._earlier_sections(path, ["wkv"])
    assert list(kept) == ["train"]
    second = gpu.Results(path, {}, keep=kept)
    gpu.run_section("wkv", lambda r, b: r.add_case("wkv", {"impl": "fla"}), second, gpu.Budget(5))
    sections = json.loads(path.read_text())["sections"]
    assert sections["train"]["cases"] == [{"model": "B32", "peak_bytes": 5}]
    assert sections["wkv"]["cases"] == [{"impl": "fla"}]
    assert gpu._earlier_sections(tmp_path / "missing.json", ["wkv"]) == {}


def test_table_layout():
    text = gpu.format_table([{"impl": "chunked", "ms": 12.3456789}, {"impl": "fla", "error": "OOM"}],
                            ["impl", "ms", "error"])
    lines = text.splitlines()
    assert lines[0].split() == ["impl", "ms", "error"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["chunked", "12.35"] and lines[3].split() == ["fla", "OOM"]


def test_training_cases_put_eager_before_compiled():
    for quick in (False, True):
        cases = gpu.train_cases(quick, "chunked")
        flags = [c["compile"] for c in cases]
        assert flags == sorted(flags) and any(flags) and not all(flags)
        assert {c["model"] for c in cases} == {"B32", "B16"}


def test_generated_photos_are_read_by_the_training_loader(tmp_path):
    prefix = gpu._photo_records(tmp_path, records=12, unique=3)
    loader = build_loader(f"{prefix}.rec", 4, input_size=32, train=True, backend="dali", device="cpu",
                          num_threads=1, rank=0, world_size=1, seed=0, cache_dir=tmp_path)
    images, tokens = next(iter(loader))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert tokens.shape == (4, 77) and tokens[:, :3].tolist() == [[49406, 320, 49407]] * 4


def test_the_training_step_trains_on_the_cpu():
    torch.manual_seed(0)
    model = create_model("RWKV_CLIP_tiny").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    images, tokens = torch.randn(8, 3, 32, 32), torch.randint(1, 400, (8, 77))
    step = gpu._train_step_fn(model, model, optimizer, ClipLoss(), images, tokens)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(UserWarning, match="CUDA is not available"):  # autocast("cuda") is off here
        step()
    moved = sum(not torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert moved > len(before) // 2
    assert all(p.grad is None for p in model.parameters())  # zero_grad(set_to_none=True)
    assert 0 <= model.logit_scale.item() <= gpu.LOGIT_SCALE_MAX


def test_the_watchdog_saves_the_report_and_stops_a_run_that_overstays(tmp_path):
    path = tmp_path / "r.json"
    code = (
        "import time\n"
        "from pathlib import Path\n"
        "from benchmarks import gpu\n"
        f"r = gpu.Results(Path({str(path)!r}), {{}})\n"
        "r.add_case('train', {'model': 'B32', 'samples_per_s': 1.0})\n"
        "gpu._watchdog(r, 0.5)\n"
        "time.sleep(60)\n"
        "print('not stopped')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert "time limit of 0.5 s reached" in proc.stdout and "not stopped" not in proc.stdout
    assert "B32" in proc.stdout  # the tables of what finished are printed
    saved = json.loads(path.read_text())
    assert saved["status"].startswith("stopped at the") and saved["sections"]["train"]["cases"]
