"""What benchmarks/gpu.py needs beyond a bare torch + triton install, and how it travels.

The check machine has torch and triton of its own and no internet, so the small pure-Python
packages the GPU path imports are downloaded beforehand as wheels (`--download-wheels DIR`),
carried with the working tree and installed there into a folder on PYTHONPATH, leaving that
machine's torch and triton alone. The imports are checked before anything is timed: a missing
fla must stop the run with its name, not let `auto` time `chunked` under fla's label.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from src.errors import UserError

REPO = Path(__file__).resolve().parent.parent
DEFAULT_WHEEL_DIR = ".whl"  # ignored by git (.gitignore); the device tool carries it when named
# The machine's Python: wheels with compiled parts would have to match it (ours are pure Python).
TARGET_PYTHON = "3.12"
TARGET_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
# fla-core's only unconditional Requires-Dist (its torch/triton lines sit under extras). It is
# not pinned in requirements.txt (fla-core takes any); this is the version the tests run with.
EINOPS_PIN = "einops==0.8.2"


@dataclass(frozen=True)
class Need:
    module: str  # what is imported
    package: str  # the distribution that provides it
    why: str


def fla_pin(requirements: Path = REPO / "requirements.txt") -> str:
    """fla-core's exact pin in requirements.txt, so the carried wheel is the tested one."""
    for line in requirements.read_text().splitlines():
        m = re.match(r"\s*(fla-core==[^\s;#]+)", line)
        if m:
            return m.group(1)
    raise UserError(f"{requirements}: no fla-core==VERSION line; the carried wheel follows that pin")


def carried_pins() -> list[str]:
    return [fla_pin(), EINOPS_PIN]


def needs(wkv_impl: str) -> list[Need]:
    """The imports a run with `wkv_impl` for its training steps depends on."""
    found = [
        Need("torch", "torch", "everything"),
        Need("numpy", "numpy", "src.training (seeding)"),
        Need("triton", "triton", "the Triton WKV kernels and torch.compile's inductor"),
    ]
    if wkv_impl in ("auto", "fla", "fla_chunk"):
        found += [Need("einops", "einops", "fla-core's one requirement"),
                  Need("fla", "fla-core", f"--wkv-impl {wkv_impl}: flash-linear-attention's RWKV-6 kernels")]
    return found


def missing(required: list[Need]) -> list[tuple[Need, str]]:
    """(need, why it fails) for each required module that does not import."""
    problems = []
    for need in required:
        try:
            if importlib.util.find_spec(need.module) is None:
                problems.append((need, "not installed"))
                continue
            importlib.import_module(need.module)
        except Exception as exc:  # a broken install: say which error, keep checking the rest
            problems.append((need, f"fails to import ({type(exc).__name__}: {(str(exc).splitlines() or [''])[0]})"))
    return problems


def missing_message(problems: list[tuple[Need, str]], wheel_dir: str = DEFAULT_WHEEL_DIR) -> str:
    names = ", ".join(f"{need.module} ({need.package}, for {need.why}): {why}" for need, why in problems)
    return (f"missing: {names}. Download the wheels where pip works: python -m benchmarks.gpu "
            f"--download-wheels {wheel_dir}; carry {wheel_dir} and first run there: {install_line(wheel_dir)}")


def install_line(wheel_dir: str = DEFAULT_WHEEL_DIR) -> str:
    """The shell line that installs the carried wheels without touching the machine's torch."""
    return (f"python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
            f"--target /tmp/site {wheel_dir}/*.whl && export PYTHONPATH=/tmp/site")


def download_command(folder: Path, pins: list[str], python: str = sys.executable) -> list[str]:
    """pip download of exactly `pins`, without their requirements, as wheels for the machine."""
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", TARGET_PYTHON,
           "--implementation", "cp", "--disable-pip-version-check", "-d", str(folder)]
    for platform in TARGET_PLATFORMS:
        cmd += ["--platform", platform]
    return cmd + pins


def download_wheels(folder: Path, pins: list[str] | None = None) -> list[Path]:
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
        stem = re.sub(r"[-_.]+", "_", name).lower()
        for wheel in folder.glob("*.whl"):
            wheel_name, wheel_version = wheel.name.split("-")[:2]
            if re.sub(r"[-_.]+", "_", wheel_name).lower() == stem and wheel_version != version:
                raise UserError(f"--download-wheels {folder}: holds {wheel.name}, another version than {pin}; "
                                f"remove it (two versions of one package stop the install there)")
    proc = subprocess.run(download_command(folder, pins), capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"--download-wheels {folder}: pip could not download {' '.join(pins)}: {tail}")
    return sorted(folder.glob("*.whl"))
