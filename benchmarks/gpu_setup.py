"""What benchmarks/gpu.py needs beyond a bare torch + triton install, and how it travels.

The check machine has torch and triton of its own (and what they require), no internet and no
`make`. What the check imports beyond them travels as wheels: downloaded beforehand where pip
works (`--download-wheels DIR`), carried with the working tree and installed there into a
folder on PYTHONPATH, leaving that machine's torch and triton alone.

The list is what importing the check's modules in such an environment asks for, not what the
packages declare: fla-core imports `packaging` without requiring it, the training step imports
numpy, and the model library's entry point imports Pillow, regex and ftfy (with its wcwidth).
tests/benchmarks/test_gpu_bare.py builds an environment of only torch, triton and their
requirements, installs exactly these wheels as the README says, and runs the check there.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from src.errors import UserError

REPO = Path(__file__).resolve().parent.parent
DEFAULT_WHEEL_DIR = ".whl"  # ignored by git (.gitignore); the device tool carries it when named
INSTALL_TARGET = "/tmp/site"
# The machine's Python: the wheels with compiled parts (numpy, Pillow, regex) must match it.
TARGET_PYTHON = "3.12"
TARGET_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)


@dataclass(frozen=True)
class Carried:
    package: str  # the distribution, as pip names it
    version: str  # "" where requirements.txt pins it (that pin is used)
    module: str  # the top-level module it provides
    why: str


# In the order the check's imports meet them. Versions not pinned in requirements.txt are the
# ones the tests run with.
CARRIED = (
    Carried("numpy", "2.4.6", "numpy", "the training step (seeding) and the check's data"),
    Carried("pillow", "13.0.0", "PIL", "src.open_alip's create_model_and_transforms (the transforms)"),
    Carried("regex", "2026.12.2", "regex", "src.open_alip's tokenizer"),
    Carried("ftfy", "", "ftfy", "src.open_alip's tokenizer"),
    Carried("wcwidth", "0.9.5", "wcwidth", "ftfy's one requirement"),
    Carried("einops", "0.8.2", "einops", "fla-core's one declared requirement"),
    Carried(
        "packaging",
        "26.3",
        "packaging",
        "fla-core (fla/utils/env.py imports it; fla-core does not declare it)",
    ),
    Carried(
        "fla-core", "", "fla", "--wkv-impl fla (what auto takes on CUDA): flash-linear-attention's kernels"
    ),
)
FLA = "fla-core"
# The check's own import chain: every module a section imports, so that a missing package is
# found before anything is timed. fla's kernels are imported apart (FLA_MODULES): without them
# the sections that need no fla still run.
CHECK_MODULES = (
    "numpy",
    "triton",
    "benchmarks.gpu_report",
    "benchmarks.gpu_train",
    "benchmarks.gpu_kernels",
    "benchmarks.gpu_extras",
    "benchmarks.wkv",
    "src.training.main",
    "src.perf.cost_model",
    "src.perf.planner",
    "src.open_alip.factory",
    "src.open_alip.wkv_bi_triton",
    "src.open_alip.mix",
    "torch.profiler",
)
FLA_MODULES = ("fla.ops.rwkv6",)


def _pinned(package: str, requirements: Path = REPO / "requirements.txt") -> str:
    for line in requirements.read_text().splitlines():
        m = re.match(rf"\s*{re.escape(package)}==([^\s;#]+)", line)
        if m:
            return m.group(1)
    raise UserError(f"{requirements}: no {package}==VERSION line; the carried wheel follows that pin")


def carried_pins() -> list[str]:
    """`package==version` of every carried wheel."""
    return [f"{c.package}=={c.version or _pinned(c.package)}" for c in CARRIED]


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [""])[0]


def _carried_for(exc: BaseException) -> str:
    missing = getattr(exc, "name", None) or ""
    for c in CARRIED:
        if missing.split(".")[0] == c.module:
            return f"{c.package}, for {c.why}"
    return "not one of the carried wheels"


def import_problems(modules: tuple[str, ...]) -> list[str]:
    """One line for each module of `modules` that fails to import: which, why, what provides it."""
    problems = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a missing or broken install: say which error, keep checking the rest
            problems.append(f"{name}: {type(exc).__name__}: {_first_line(exc)} ({_carried_for(exc)})")
    return problems


def check_imports() -> str | None:
    """Import the check's whole chain. A failure outside fla stops the check (UserError, one
    line); a missing fla is returned (why), for the sections to run without it."""
    problems = import_problems(CHECK_MODULES)
    if problems:
        raise UserError(missing_message(problems))
    fla = import_problems(FLA_MODULES)
    return "; ".join(fla) if fla else None


def missing_message(problems: list[str], wheel_dir: str = DEFAULT_WHEEL_DIR) -> str:
    return (
        f"cannot import {'; '.join(problems)}. Download the wheels where pip works: python -m benchmarks.gpu "
        f"--download-wheels {wheel_dir}; carry {wheel_dir} and first run there: {install_line(wheel_dir)}"
    )


def install_line(wheel_dir: str = DEFAULT_WHEEL_DIR, target: str = INSTALL_TARGET) -> str:
    """The shell line that installs the carried wheels without touching the machine's torch."""
    return (
        f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
        f"--target {target} {wheel_dir}/*.whl && export PYTHONPATH={target}"
    )


def download_command(
    folder: Path, pins: list[str], python: str = sys.executable, python_version: str = TARGET_PYTHON
) -> list[str]:
    """pip download of exactly `pins`, without their requirements, as wheels for the machine."""
    cmd = [
        python,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "--disable-pip-version-check",
        "-d",
        str(folder),
    ]
    for platform in TARGET_PLATFORMS:
        cmd += ["--platform", platform]
    return cmd + pins


def _stem(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def download_wheels(
    folder: Path, pins: list[str] | None = None, python_version: str = TARGET_PYTHON
) -> list[Path]:
    """Download the carried wheels into `folder` (created); the wheels there afterwards.

    A wheel of another version of a pinned package already in `folder` would be installed
    beside the pinned one, so it is refused before anything is downloaded.
    """
    pins = pins or carried_pins()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"--download-wheels {folder}: is a file; pass a folder (e.g. {DEFAULT_WHEEL_DIR})")
    folder.mkdir(parents=True, exist_ok=True)
    for pin in pins:
        name, version = pin.split("==")
        for wheel in folder.glob("*.whl"):
            wheel_name, wheel_version = wheel.name.split("-")[:2]
            if _stem(wheel_name) == _stem(name) and wheel_version != version:
                raise UserError(
                    f"--download-wheels {folder}: holds {wheel.name}, another version than {pin}; "
                    f"remove it (two versions of one package stop the install there)"
                )
    proc = subprocess.run(
        download_command(folder, pins, python_version=python_version), capture_output=True, text=True
    )
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"--download-wheels {folder}: pip could not download {' '.join(pins)}: {tail}")
    return sorted(folder.glob("*.whl"))
