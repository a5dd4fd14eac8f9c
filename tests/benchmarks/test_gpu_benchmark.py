"""benchmarks/gpu.py on a machine without a GPU: its one-line exit, the import check, the wheel
download (against a local folder of stand-in wheels, no network), the section runner's time
budget and report, and every section's code on the CPU through the test-only `--cpu-test`
flag (the tiny model; its numbers mean nothing and nothing here asserts one). The GPU numbers
come only from a run on a GPU."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from benchmarks import gpu, gpu_extras, gpu_report, gpu_setup, gpu_train
from dataloaders.imagenet import build_loader
from tests._repo import REPO


def _run(args: list[str], env: dict[str, str] | None = None, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "benchmarks.gpu", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_without_a_gpu_it_prints_one_line_and_exits_0(tmp_path):
    out = tmp_path / "report.json"
    proc = _run(["--output", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and "no CUDA GPU" in proc.stdout
    assert not out.exists()


def test_a_missing_fla_stops_the_run_naming_it_and_the_wheels(tmp_path):
    # sys.modules[name] = None is Python's own way to make an import fail: fla is installed here.
    code = ("import sys; sys.modules['fla'] = None\n"
            "from benchmarks import gpu; sys.exit(gpu.main(sys.argv[1:]))")
    out = tmp_path / "r.json"
    proc = _run(["--cpu-test", "--wkv-impl", "fla", "--output", str(out)], code=code)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("benchmarks.gpu: error: missing: fla (fla-core, ")
    assert "--download-wheels .whl" in lines[0] and gpu_setup.install_line() in lines[0]
    assert not out.exists()  # nothing was timed under another implementation's name


def test_the_import_check_names_each_missing_module_and_why():
    problems = gpu_setup.missing([gpu_setup.Need("json", "json", "x"),
                                  gpu_setup.Need("no_such_module_3f9a", "no-such-dist", "the test")])
    assert [(need.module, why) for need, why in problems] == [("no_such_module_3f9a", "not installed")]
    assert "no_such_module_3f9a (no-such-dist, for the test): not installed" in gpu_setup.missing_message(problems)
    assert {n.module for n in gpu_setup.needs("fla")} >= {"torch", "triton", "einops", "fla"}
    assert "fla" not in {n.module for n in gpu_setup.needs("chunked")}


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python stand-in wheel, its RECORD hashed as pip expects."""
    stem = f"{name.replace('-', '_')}-{version}"
    contents = {
        f"{name.replace('-', '_')}/__init__.py": f"__version__ = {version!r}\n",
        f"{stem}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{stem}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    contents[f"{stem}.dist-info/RECORD"] = "\n".join([*record, f"{stem}.dist-info/RECORD,,"]) + "\n"
    wheel = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in contents.items():
            z.writestr(path, text)
    return wheel


def _pip_env(index: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_FIND_LINKS=str(index), PIP_NO_CACHE_DIR="1")
    return env


def test_download_wheels_fetches_exactly_the_pins_and_says_how_to_carry_them(tmp_path):
    pins = gpu_setup.carried_pins()
    assert pins[0] == "fla-core==0.6.0"  # requirements.txt's pin
    index = tmp_path / "index"
    index.mkdir()
    for pin in pins:
        name, version = pin.split("==")
        _wheel(index, name, version)
        _wheel(index, name, "9.9.9")  # a newer one that must not be taken
    dest = tmp_path / "carried"
    proc = _run(["--download-wheels", str(dest)], env=_pip_env(index))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = sorted(p.name for p in dest.iterdir())
    assert got == sorted(f"{p.split('==')[0].replace('-', '_')}-{p.split('==')[1]}-py3-none-any.whl" for p in pins)
    assert gpu_setup.install_line(str(dest)) in proc.stdout

    # A wheel of another version left in the folder would be installed beside the pinned one.
    _wheel(dest, "einops", "0.1.0")
    proc = _run(["--download-wheels", str(dest)], env=_pip_env(index))
    assert proc.returncode == 2 and "einops-0.1.0-py3-none-any.whl, another version" in proc.stderr
    # No such version where pip looks: one line from pip's last, no traceback.
    proc = _run(["--download-wheels", str(tmp_path / "none")], env=_pip_env(tmp_path / "none"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "pip could not download" in proc.stderr


def test_download_wheels_dry_run_prints_pips_command():
    proc = _run(["--download-wheels", ".whl", "--dry-run"])
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.split()
    assert words[2:4] == ["pip", "download"] and "--no-deps" in words and words[-2:] == gpu_setup.carried_pins()
    assert words[words.index("-d") + 1] == ".whl" and words[words.index("--python-version") + 1] == "3.12"


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_budget_counts_down_and_refuses_what_does_not_fit():
    clock = FakeClock()
    budget = gpu_report.Budget(60, clock=clock)
    assert budget.allows(60) and budget.left() == 60
    clock.now += 45
    assert budget.elapsed() == 45 and budget.allows(15) and not budget.allows(16)


def test_sections_run_in_order_within_the_budget_and_the_report_is_written_as_they_finish(tmp_path):
    clock, path = FakeClock(), tmp_path / "r.json"
    results = gpu_report.Results(path, {"device": "test"})
    seen = {}

    def first(r, b):
        seen["first_budget"] = b.seconds
        r.add_case("first", {"samples_per_s": 1.0})
        clock.now += 50

    def broken(r, b):
        clock.now += 10
        raise RuntimeError("kernel exploded\nsecond line")

    def third(r, b):
        seen["on_disk"] = json.loads(path.read_text())["sections"]  # what a kill now would leave
        seen["third_budget"] = b.seconds

    sections = [gpu_report.Section("first", first, needs_s=10, cap_s=60),
                gpu_report.Section("broken", broken, needs_s=10, cap_s=100),
                gpu_report.Section("compile", lambda r, b: None, needs_s=90, cap_s=200),
                gpu_report.Section("third", third, needs_s=5, cap_s=20)]
    gpu_report.run_sections(sections, results, gpu_report.Budget(100, clock=clock))
    assert seen["first_budget"] == 60  # its cap, not all 100 s
    on_disk = seen["on_disk"]
    assert on_disk["first"]["status"] == "done" and on_disk["first"]["cases"] == [{"samples_per_s": 1.0}]
    assert on_disk["broken"]["status"] == "error" and on_disk["broken"]["error"] == "RuntimeError: kernel exploded"
    assert on_disk["compile"]["status"] == "skipped" and "40 s of the time limit left" in on_disk["compile"]["note"]
    assert seen["third_budget"] == 20
    assert json.loads(path.read_text())["sections"]["third"]["status"] == "done"
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_every_section_runs_on_the_cpu_in_order_with_the_real_trainer(tmp_path):
    out = tmp_path / "r.json"
    proc = _run(["--cpu-test", "--output", str(out), "--only", "train_eager", "--only", "wkv",
                 "--only", "profile", "--only", "dali"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["status"] == "done" and report["args"]["wkv_impl"] == "chunked"
    sections = report["sections"]
    assert list(sections) == ["train_eager", "wkv", "profile", "dali"]
    assert sections["dali"]["status"] == "skipped"
    (train,) = sections["train_eager"]["cases"]
    assert train["loss_finite"] and train["steps_timed"] == 2
    assert {"first_step_s", "second_step_s", "step_ms", "samples_per_s"} <= set(train)
    wkv = sections["wkv"]["cases"]
    assert {(c["shape"], c["inputs"]) for c in wkv} == {(s, d) for s in ("image", "text") for d in ("fp32", "bf16")}
    assert all("ms" in c for c in wkv if c["impl"] == "chunked")
    profile = sections["profile"]
    assert profile["status"] == "done" and profile["step_case"]["compile"] is False  # no compiled step this run
    assert profile["cases"] and abs(sum(profile["shares"].values()) - 1) < 1e-3
    assert "== profile: done" in proc.stdout and "gemm" in proc.stdout


def test_kernel_names_sort_into_kinds_and_shares():
    names = {
        "fused_recurrent_rwkv6_fwd_kernel": "wkv", "wkv_bi_forward_kernel": "wkv",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "gemm", "nvjet_tst_128x256_64x4": "gemm",
        "triton_tem_fused_mm_3": "gemm", "aten::addmm": "gemm", "aten::mm": "gemm",
        "triton_poi_fused_add_mul_0": "element-wise", "triton_red_fused_native_layer_norm_1": "element-wise",
        "Memcpy HtoD (Pageable -> Device)": "copy", "aten::commit": "element-wise",
    }
    assert {n: gpu_train.kernel_kind(n) for n in names} == names
    rows, shares = gpu_train.kernel_table([("aten::mm", 600.0, 2), ("triton_poi_fused_add_0", 300.0, 5),
                                           ("fused_recurrent_rwkv6_bwd_kernel", 100.0, 1)], top=2)
    assert [r["kernel"] for r in rows] == ["aten::mm", "triton_poi_fused_add_0"] and rows[0]["share"] == 0.6
    assert shares == {"gemm": 0.6, "element-wise": 0.3, "wkv": 0.1}


def test_table_layout():
    text = gpu_report.format_table([{"impl": "chunked", "ms": 12.3456789}, {"impl": "fla", "error": "OOM"}],
                                   ["impl", "ms", "error"])
    lines = text.splitlines()
    assert lines[0].split() == ["impl", "ms", "error"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["chunked", "12.35"] and lines[3].split() == ["fla", "OOM"]


def test_generated_photos_are_read_by_the_training_loader(tmp_path):
    prefix = gpu_extras.photo_records(tmp_path, records=12, unique=3)
    loader = build_loader(f"{prefix}.rec", 4, input_size=32, train=True, backend="dali", device="cpu",
                          num_threads=1, rank=0, world_size=1, seed=0, cache_dir=tmp_path)
    images, tokens = next(iter(loader))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32
    assert tokens.shape == (4, 77) and tokens[:, :3].tolist() == [[49406, 320, 49407]] * 4


def test_the_watchdog_saves_the_report_and_stops_a_run_that_overstays(tmp_path):
    path = tmp_path / "r.json"
    code = (
        "import time\n"
        "from pathlib import Path\n"
        "from benchmarks import gpu, gpu_report\n"
        f"r = gpu_report.Results(Path({str(path)!r}), {{}})\n"
        "r.add_case('train_eager', {'model': 'B32', 'samples_per_s': 1.0})\n"
        "gpu_report.start_watchdog(r, 0.5, gpu.COLUMNS)\n"
        "time.sleep(60)\n"
        "print('not stopped')\n"
    )
    proc = _run([], code=code)
    assert proc.returncode == 0, proc.stderr
    assert "time limit of 0.5 s reached" in proc.stdout and "not stopped" not in proc.stdout
    assert "B32" in proc.stdout  # the tables of what finished are printed
    saved = json.loads(path.read_text())
    assert saved["status"].startswith("stopped at the") and saved["sections"]["train_eager"]["cases"]


def test_the_default_run_fits_eight_minutes():
    # The sections' time plus the watchdog's grace leaves at least 40 s for start-up.
    assert gpu.DEFAULT_TIME_LIMIT + gpu.HARD_STOP_GRACE <= 8 * 60 - 40


def test_a_gpu_run_times_our_own_kernels_right_after_the_default_step():
    args = gpu.parse_args(["--output", "r.json"])
    names = [s.name for s in gpu.build_sections(args, torch.device("cpu"))]
    assert names[:3] == ["train_eager", "train_fused", "train_compiled"]
    cpu = gpu.build_sections(gpu.parse_args(["--cpu-test", "--output", "r.json"]), torch.device("cpu"))
    assert "train_fused" not in [s.name for s in cpu]  # our kernels run on a CPU only when interpreted
    cfg = gpu_train.train_config("tiny", 8, "bi_triton", False, torch.device("cpu"), mix_impl="triton")
    assert (cfg.wkv_impl, cfg.mix_impl) == ("bi_triton", "triton")
