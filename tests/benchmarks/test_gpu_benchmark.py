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


def _run(
    args: list[str], env: dict[str, str] | None = None, code: str | None = None
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code, *args] if code else [sys.executable, "-m", "benchmarks.gpu", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without a GPU")
def test_without_a_gpu_it_prints_one_line_and_exits_0(tmp_path):
    out = tmp_path / "report.json"
    proc = _run(["--output", str(out)])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and "no CUDA GPU" in proc.stdout
    assert not out.exists()


def test_a_missing_package_outside_fla_stops_the_run_with_one_line_naming_the_wheel(tmp_path):
    # sys.modules[name] = None is Python's own way to make an import fail: Pillow is installed here.
    code = (
        "import sys; sys.modules['PIL'] = None\nfrom benchmarks import gpu; sys.exit(gpu.main(sys.argv[1:]))"
    )
    out = tmp_path / "r.json"
    proc = _run(["--cpu-test", "--output", str(out)], code=code)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("benchmarks.gpu: error: cannot import "), lines
    assert "(pillow, for src.open_alip's create_model_and_transforms" in lines[0]
    assert "--download-wheels .whl" in lines[0] and gpu_setup.install_line() in lines[0]
    assert not out.exists()  # nothing was timed


def test_the_import_check_names_each_failing_module_why_and_its_wheel(monkeypatch):
    monkeypatch.setitem(sys.modules, "regex", None)
    problems = gpu_setup.import_problems(("json", "no_such_module_3f9a", "regex"))
    assert len(problems) == 2
    assert (
        problems[0].startswith("no_such_module_3f9a: ModuleNotFoundError: ")
        and "not one of the carried" in problems[0]
    )
    assert problems[1].startswith("regex: ") and problems[1].endswith(
        "(regex, for src.open_alip's tokenizer)"
    )
    monkeypatch.setitem(sys.modules, "fla", None)
    assert gpu_setup.check_imports().startswith("fla.ops.rwkv6: ")  # fla alone missing: returned, not raised
    assert {c.module for c in gpu_setup.CARRIED} >= {"fla", "packaging", "einops", "numpy"}


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A pure-Python stand-in wheel, its RECORD hashed as pip expects."""
    stem = f"{name.replace('-', '_')}-{version}"
    contents = {
        f"{name.replace('-', '_')}/__init__.py": f"__version__ = {version!r}\n",
        f"{stem}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{stem}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
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
    assert {"fla-core==0.6.0", "ftfy==6.3.1"} <= set(pins)  # requirements.txt's pins
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
    assert got == sorted(
        f"{p.split('==')[0].replace('-', '_')}-{p.split('==')[1]}-py3-none-any.whl" for p in pins
    )
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
    pins = gpu_setup.carried_pins()
    assert words[2:4] == ["pip", "download"] and "--no-deps" in words and words[-len(pins) :] == pins
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


def test_sections_run_in_order_within_their_bounds_and_the_report_is_written_as_they_finish(tmp_path):
    clock, path = FakeClock(), tmp_path / "r.json"
    results = gpu_report.Results(path, {"device": "test"})
    check = gpu_report.Check(args=None, device=None, fla_missing="fla.ops.rwkv6: not installed")
    seen = {}

    def first(c, r, b):
        seen["first_budget"] = b.seconds
        r.add_case("first", {"samples_per_s": 1.0})
        clock.now += 50

    def broken(c, r, b):
        clock.now += 10
        raise RuntimeError("kernel exploded\nsecond line")

    def third(c, r, b):
        seen["on_disk"] = json.loads(path.read_text())["sections"]  # what a kill now would leave
        seen["third_budget"] = b.seconds
        clock.now += 37

    sections = [
        gpu_report.Section("first", first, bound_s=60),
        gpu_report.Section("broken", broken, bound_s=100),
        gpu_report.Section("absent", first, bound_s=10, unavailable=lambda c: "no such device here"),
        gpu_report.Section("third", third, bound_s=20),
        gpu_report.Section("late", first, bound_s=20),
    ]
    gpu_report.run_sections(sections, check, results, gpu_report.Budget(100, clock=clock), child_command=None)
    assert seen["first_budget"] == 60  # its bound, not all 100 s
    on_disk = seen["on_disk"]
    assert on_disk["first"]["status"] == "done" and on_disk["first"]["cases"] == [{"samples_per_s": 1.0}]
    assert (
        on_disk["broken"]["status"] == "error"
        and on_disk["broken"]["error"] == "RuntimeError: kernel exploded"
    )
    assert on_disk["absent"] == {"status": "skipped", "cases": [], "note": "no such device here"}
    assert (
        on_disk["first"]["fla"] == "missing: fla.ops.rwkv6: not installed"
    )  # the sections say fla is missing
    assert seen["third_budget"] == 20  # 40 s were left, its bound is less
    sections_now = json.loads(path.read_text())["sections"]
    assert sections_now["third"]["status"] == "done"
    assert (
        sections_now["late"]["status"] == "skipped"
        and "3 s of the time limit left" in sections_now["late"]["note"]
    )
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary file left


def test_a_child_section_past_its_bound_is_killed_with_what_it_started_and_says_where_it_was(tmp_path):
    from tests._processes import wait_for

    path, pid_file = tmp_path / "r.json", tmp_path / "sleeper.pid"
    results = gpu_report.Results(path, {"device": "test"})
    results.set("compiled", status="running")
    # The child notes its phase in the report, starts a worker of its own (as inductor does) and
    # then never finishes: a compile that overruns.
    code = (
        "import subprocess, sys, time\n"
        "from pathlib import Path\n"
        "from benchmarks.gpu_report import Results\n"
        f"r = Results.open(Path({str(path)!r}))\n"
        "r.add_case('compiled', {'build_s': 1.5})\n"
        "r.set('compiled', phase='first step (compile, autotune)')\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
        f"Path({str(pid_file)!r}).write_text(str(worker.pid))\n"
        "time.sleep(120)\n"
    )
    command = [sys.executable, "-c", code]
    status = gpu_report.run_child("compiled", command, 6.0, results)
    assert status == "killed"
    record = json.loads(path.read_text())["sections"]["compiled"]
    assert record["status"] == "killed" and record["cases"] == [{"build_s": 1.5}]  # what it had written stays
    assert record["note"] == "killed at its bound of 6 s, during: first step (compile, autotune)"
    assert 6.0 <= record["seconds"] < 60
    worker = int(pid_file.read_text())
    assert wait_for(lambda: _gone(worker), limit=10)  # the child's own worker was killed with it


def _gone(pid: int) -> bool:
    """The process ended (a zombie waiting for its reaper counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_missing_fla_leaves_the_sections_running_in_child_processes_and_each_says_so(tmp_path):
    # A stand-in fla package whose import fails, first on the path of the check and of its child
    # processes: as on a machine where fla-core was not carried.
    (tmp_path / "site" / "fla").mkdir(parents=True)
    (tmp_path / "site" / "fla" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'packaging'\", name='packaging')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(REPO)])}
    out = tmp_path / "r.json"
    proc = _run(
        ["--cpu-test", "--output", str(out), "--only", "train_eager", "--only", "wkv", "--only", "dali"],
        env=env,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fla missing (fla.ops.rwkv6: ModuleNotFoundError: No module named 'packaging'" in proc.stdout
    report = json.loads(out.read_text())
    assert report["status"] == "done" and report["args"]["wkv_impl"] == "auto"
    sections = report["sections"]
    assert list(sections) == ["wkv", "train_eager", "dali"]  # the order they run in
    assert sections["dali"]["status"] == "skipped"
    for name in ("wkv", "train_eager"):
        assert sections[name]["status"] == "done" and sections[name]["fla"].startswith(
            "missing: fla.ops.rwkv6: "
        )
    (train,) = sections["train_eager"]["cases"]
    assert train["loss_finite"] and train["steps_timed"] == 2 and train["wkv"] == "chunked"
    assert train["note"] == "fla missing: auto ran chunked"
    assert {"build_s", "first_step_s", "second_step_s", "step_ms", "samples_per_s"} <= set(train)
    wkv = sections["wkv"]["cases"]
    assert {(c["shape"], c["inputs"]) for c in wkv} == {
        (s, d) for s in ("image", "text") for d in ("fp32", "bf16")
    }
    assert all("ms" in c for c in wkv if c["impl"] == "chunked")
    assert "== summary" in proc.stdout and "fla missing: fla.ops.rwkv6" in proc.stdout
    # The bound, printed: the H200's 45 s, scaled for a CPU shared with the rest of the suite.
    assert f"child process, up to {45 * gpu.CPU_TEST_BOUND_SCALE} s" in proc.stdout


def test_kernel_names_sort_into_kinds_and_shares():
    names = {
        "fused_recurrent_rwkv6_fwd_kernel": "wkv",
        "wkv_bi_forward_kernel": "wkv",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "gemm",
        "nvjet_tst_128x256_64x4": "gemm",
        "triton_tem_fused_mm_3": "gemm",
        "aten::addmm": "gemm",
        "aten::mm": "gemm",
        "triton_poi_fused_add_mul_0": "element-wise",
        "triton_red_fused_native_layer_norm_1": "element-wise",
        "Memcpy HtoD (Pageable -> Device)": "copy",
        "aten::commit": "element-wise",
    }
    assert {n: gpu_train.kernel_kind(n) for n in names} == names
    rows, shares = gpu_train.kernel_table(
        [
            ("aten::mm", 600.0, 2),
            ("triton_poi_fused_add_0", 300.0, 5),
            ("fused_recurrent_rwkv6_bwd_kernel", 100.0, 1),
        ],
        top=2,
    )
    assert [r["kernel"] for r in rows] == ["aten::mm", "triton_poi_fused_add_0"] and rows[0]["share"] == 0.6
    assert shares == {"gemm": 0.6, "element-wise": 0.3, "wkv": 0.1}


def test_table_layout():
    text = gpu_report.format_table(
        [{"impl": "chunked", "ms": 12.3456789}, {"impl": "fla", "error": "OOM"}], ["impl", "ms", "error"]
    )
    lines = text.splitlines()
    assert lines[0].split() == ["impl", "ms", "error"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[2].split() == ["chunked", "12.35"] and lines[3].split() == ["fla", "OOM"]


def test_generated_photos_are_read_by_the_training_loader(tmp_path):
    prefix = gpu_extras.photo_records(tmp_path, records=12, unique=3)
    loader = build_loader(
        f"{prefix}.rec",
        4,
        input_size=32,
        train=True,
        backend="dali",
        device="cpu",
        num_threads=1,
        rank=0,
        world_size=1,
        seed=0,
        cache_dir=tmp_path,
    )
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


def test_the_default_run_fits_eight_minutes_on_one_h200():
    # Each section's bound includes its start-up and compiles; the sections run one after the
    # other, the check's own start-up before them and the watchdog's grace past the limit.
    sections = gpu.build_sections(gpu.parse_args(["--output", "r.json"]))
    assert sum(s.bound_s for s in sections) <= gpu.DEFAULT_TIME_LIMIT
    assert gpu.STARTUP_S + gpu.DEFAULT_TIME_LIMIT + gpu.HARD_STOP_GRACE <= 8 * 60
    table = gpu_report.bounds_table(sections, gpu.STARTUP_S)
    assert all(f"{s.name} " in table for s in sections) and table.endswith("(10 s start-up + the bounds)")


def test_the_sections_run_in_order_of_value():
    sections = gpu.build_sections(gpu.parse_args(["--output", "r.json"]))
    assert [s.name for s in sections[:5]] == [
        "wkv",
        "train_compiled",
        "train_eager",
        "train_fused",
        "train_fused_compiled",
    ]
    assert all(s.child for s in sections[:5])  # each compiles: a child process, killed at its bound
    cpu = gpu.parse_args(["--cpu-test", "--output", "r.json"])
    # On a CPU the bounds are the H200's times a scale: no test waits on a CPU's speed.
    assert [s.bound_s for s in gpu.build_sections(cpu)] == [
        s.bound_s * gpu.CPU_TEST_BOUND_SCALE for s in sections
    ]
    assert cpu.time_limit == gpu.DEFAULT_TIME_LIMIT * gpu.CPU_TEST_BOUND_SCALE
    check = gpu_report.Check(cpu, torch.device("cpu"))
    skipped = {s.name for s in gpu.build_sections(cpu) if s.unavailable and s.unavailable(check)}
    assert {
        "train_fused",
        "train_fused_compiled",
    } <= skipped  # our kernels run on a CPU only when interpreted
    cfg = gpu_train.train_config("tiny", 8, "bi_triton", False, torch.device("cpu"), mix_impl="triton")
    assert (cfg.wkv_impl, cfg.mix_impl) == ("bi_triton", "triton")
