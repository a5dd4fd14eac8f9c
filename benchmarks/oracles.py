"""Throw-away virtualenvs for test oracles (real MXNet, the reference tokenizer, ...).

They live under `.cache/venvs/<name>` in the repo (git-ignored), are built once and
reused while their package list is unchanged. A file lock makes concurrent test
processes wait for one build instead of racing.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV_ROOT = Path(os.environ.get("RWKV_CLIP_TEST_VENVS", REPO_ROOT / ".cache" / "venvs"))

MXNET_PACKAGES = ("mxnet==1.9.1", "numpy<1.24", "opencv-python-headless==4.8.1.78")


def _base_python() -> str:
    # A venv created from inside another venv must start from the real interpreter.
    return getattr(sys, "_base_executable", None) or sys.executable


def oracle_python(name: str, packages: tuple[str, ...] | list[str], pip_args: tuple[str, ...] = ()) -> Path:
    """Return the python of venv `name` holding `packages`, building it on first use."""
    VENV_ROOT.mkdir(parents=True, exist_ok=True)
    venv = VENV_ROOT / name
    python = venv / "bin" / "python"
    wanted = hashlib.sha256("\n".join([*packages, "--", *pip_args]).encode()).hexdigest()
    stamp = venv / ".packages.sha256"
    with open(VENV_ROOT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text().strip() == wanted:
            return python
        subprocess.run([_base_python(), "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pip_args, *packages],
            check=True,
        )
        stamp.write_text(wanted + "\n")
    return python


def mxnet_python() -> Path:
    """Python of a venv with real MXNet 1.9.1, the RecordIO format oracle."""
    return oracle_python("mxnet", MXNET_PACKAGES)


def run_oracle(python: Path, code: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `code` in the oracle interpreter; raise with its stderr on failure."""
    proc = subprocess.run(
        [str(python), "-c", code, *args], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        raise AssertionError(f"oracle failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc
