"""benchmarks/inference.py without open_clip: its ViT loader, table, growth exponents, goals, memory
children and GPU section run against a stand-in open_clip folder (a tiny CLIP with open_clip's
file layout and config schema) and the tiny RWKV-CLIP. No number from it means anything and
nothing here asserts one; the measurements come from running the benchmark itself."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from benchmarks import inference as bench

# open_clip's layout: the package __init__ must never run (the real one imports torchvision's
# transforms), and utils.py imports FrozenBatchNorm2d from torchvision.ops.misc, as open_clip's does.
_STAND_IN = {
    "__init__.py": "raise RuntimeError('the package __init__ ran')\n",
    "utils.py": "from torchvision.ops.misc import FrozenBatchNorm2d  # noqa: F401\n",
    "transformer.py": "",
    "model.py": """
import torch
from torch import nn
from . import utils  # noqa: F401


class CLIP(nn.Module):
    def __init__(self, embed_dim, vision_cfg, text_cfg):
        super().__init__()
        patch = vision_cfg["patch_size"]
        self.grid = vision_cfg["image_size"] // patch
        self.patch = nn.Conv2d(3, embed_dim, patch, patch)
        self.pos = nn.Parameter(torch.zeros(1, embed_dim, self.grid, self.grid))
        self.emb = nn.Embedding(text_cfg["vocab_size"], embed_dim)

    def encode_image(self, image):
        return (self.patch(image) + self.pos).mean((2, 3))  # fails for another size, as a ViT's table does

    def encode_text(self, text):
        return self.emb(text).mean(1)
""",
}


@pytest.fixture(scope="module")
def open_clip_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stand_in") / "open_clip"
    (folder / "model_configs").mkdir(parents=True)
    for name, text in _STAND_IN.items():
        (folder / name).write_text(text)
    for name, patch in (("ViT-B-32", 8), ("ViT-B-16", 8)):
        config = {
            "embed_dim": 16,
            "vision_cfg": {"image_size": 224, "layers": 1, "width": 16, "patch_size": patch},
            "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 16, "heads": 2, "layers": 1},
        }
        (folder / "model_configs" / f"{name}.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def tiny_pair(monkeypatch):
    """The tiny RWKV-CLIP in place of B/32 (patch 8, as the stand-in ViT's); the stand-in open_clip and
    torchvision modules leave sys.modules afterwards."""
    monkeypatch.setattr(bench, "PAIRS", {"B32": ("RWKV_CLIP_tiny", "ViT-B-32", 8)})
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("open_clip", "torchvision"):
            del sys.modules[name]


def test_a_run_prints_the_table_growth_text_and_peak_memory(open_clip_dir, tiny_pair, capsys):
    # The memory child is a fresh process: it measures the real ViT/RWKV names of the pair it is given.
    assert (
        bench.main(
            [
                "--open-clip",
                str(open_clip_dir),
                "--models",
                "B32",
                "--sizes",
                "32,64",
                "--rounds",
                "2",
                "--batch",
                "2",
                "--text-batch",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"open_clip's model code from {open_clip_dir}" in out
    number = r"[0-9.e+-]+"
    rows = re.findall(
        rf"^B/32\s+(\d+)\s+(\d+)\s+(\d+)\s+({number})\s+({number})\s+({number})x "
        rf"\[({number})-({number})\]\s+([0-9,]+)\s+([0-9,]+)$",
        out,
        re.M,
    )
    assert [r[:3] for r in rows] == [("32", "16", "2"), ("64", "64", "2")]  # px, tokens (patch 8), batch
    assert re.search(rf"RWKV-CLIP B/32\s+32->64 {number}", out) and re.search(
        rf"ViT-B/32\s+32->64 {number}", out
    )
    assert re.search(rf"encode_text, batch 2 x 77 tokens: RWKV-CLIP {number} texts/s", out)
    assert "issue 44's goals" not in out  # none of the goals' sizes was measured


def test_the_wkv_mode_times_both_forms_and_their_growth(monkeypatch, capsys):
    monkeypatch.setattr(bench, "WKV_CASES", ((2, 20), (1, 90)))  # one chunk, then chunks with boundary states
    monkeypatch.setattr(bench, "WKV_HEADS", 2)
    monkeypatch.setattr(bench, "WKV_HEAD_SIZE", 8)
    assert bench.main(["--wkv", "--rounds", "1"]) == 0  # no --threads: it would set this process's
    out = capsys.readouterr().out
    rows = re.findall(
        r"^\s+(\d+)\s+(\d+)\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+x \[[0-9.-]+\]\s+([0-9.e+-]+)$", out, re.M
    )
    assert [r[:2] for r in rows] == [("20", "2"), ("90", "1")]
    assert all(float(r[2]) < 1e-5 for r in rows)  # the two forms agree to float32 rounding
    assert re.search(r"growth exponent .*, inference form: 20->90 [0-9.-]+", out)
    assert re.search(r"growth exponent .*, autograd form: 20->90 [0-9.-]+", out)


def test_goals_and_growth_come_from_the_rows(capsys):
    rows = [
        bench.Row("B32", 224, 49, 16, rwkv=[1.0, 1.1, 0.9], vit=[0.9, 0.9, 0.9]),
        bench.Row("B32", 448, 196, 16, rwkv=[4.5, 4.0, 4.2], vit=[4.0, 4.0, 4.0]),
        bench.Row(
            "B16", 1024, 4096, 1, rwkv=[6.0, 6.5], vit=[12.0, 12.0], peaks={"rwkv": 2**20, "vit": 2**21}
        ),
    ]
    assert rows[0].ratios() == [0.9, 0.9 / 1.1, 1.0]
    assert bench.growth_exponent((49, 196), (1.0, 4.0)) == pytest.approx(1.0)
    bench.print_goals(rows)
    out = capsys.readouterr().out
    assert "met      B/32 at 224 px >= 0.85x ViT-B/32: 0.90x [0.82-1.00]" in out
    assert "met      B/32 time per image 448 px / 224 px <= 4.4: 4.20" in out
    assert "met      B/16 at 1024 px >= 1.5x ViT-B/16: 1.92x [1.85-2.00]" in out
    assert "met      B/16 peak memory at 1024 px <= ViT-B/16's: 1 MiB vs 2 MiB" in out
    rows[0].vit = [0.5, 0.5, 0.5]
    bench.print_goals(rows[:1])
    assert "NOT met  B/32 at 224 px" in capsys.readouterr().out


def test_the_models_take_turns_and_alternate_who_goes_first():
    order = []
    bench.time_turns(
        {"a": lambda: order.append("a"), "b": lambda: order.append("b")}, 3, bench.clock_of("wall")
    )
    assert order == ["a", "b", "a", "b", "b", "a", "a", "b"]  # warm-up, then a b / b a / a b


def test_large_images_shrink_the_batch_alike_for_both_models():
    assert bench.batch_for(224, 32, 16, bench.MAX_TOKENS) == 16
    assert bench.batch_for(1024, 16, 16, bench.MAX_TOKENS) == 1 and bench.tokens_of(1024, 16) == 4096
    assert bench.batch_for(640, 32, 16, bench.MAX_TOKENS) == 7


def test_bad_arguments_and_a_folder_without_open_clip_are_one_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--sizes", "16"])
    assert exc.value.code == 2 and "each size must be at least 32 px" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        bench.load_open_clip(tmp_path)
    assert str(exc.value) == (
        f"error: {tmp_path} holds no open_clip model code (model.py, transformer.py); "
        "pass --open-clip PATH/open_clip"
    )


def test_the_gpu_section_is_registered_as_an_extra_and_its_code_runs_on_the_cpu(tmp_path):
    import torch

    from benchmarks import gpu, gpu_report

    assert "inference" not in [s.name for s in gpu.build_sections(gpu.parse_args(["--output", "r.json"]))]
    args = gpu.parse_args(["--cpu-test", "--include", "inference", "--output", str(tmp_path / "r.json")])
    (section,) = [s for s in gpu.build_sections(args) if s.name == "inference"]
    results = gpu_report.Results(tmp_path / "r.json", {})
    section.run(gpu_report.Check(args, torch.device("cpu")), results, gpu_report.Budget(60))
    found = json.loads((tmp_path / "r.json").read_text())["sections"]["inference"]
    assert [c["px"] for c in found["cases"]] == [32, 64] and "no ViT" in found["note"]
    assert all(c["chunked_img_s"] > 0 and "error" not in c for c in found["cases"])
    assert set(gpu.COLUMNS["inference"]) >= {"fla_img_s", "bi_triton_img_s", "vit_img_s", "fla_over_vit"}
