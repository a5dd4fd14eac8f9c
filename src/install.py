"""Install the toolkit's packages into the running Python's environment around the torch found there.

    python -m src.install [-r requirements-dev.txt]     (`make` runs this with .venv/bin/python)

1. torch: one already installed is kept, whatever its version or CUDA build (install it first
   from the PyTorch index for your driver; see README "Training on GPUs"). Only when there is
   none does the set-up install torch itself, pinned together with the triton its CUDA wheels
   pin (TESTED_TORCH, TESTED_TRITON).
2. triton is left to torch: a CUDA wheel of torch requires its own triton, so pip installed it
   with torch and it is kept. Only a torch that requires none (a CPU build) is not given one here,
   except with the pinned torch of step 1 (the CPU checks run fla's kernels under Triton's
   interpreter).
3. DALI: exactly one variant, the one for torch's CUDA major version (`torch.version.cuda`:
   12 -> nvidia-dali-cuda120, 13 -> nvidia-dali-cuda130; a CPU torch gets nvidia-dali-cuda120,
   whose CPU pipelines the tests run). Every variant installs into the same nvidia/dali folder,
   so two installed variants are refused with the command that removes them; a single variant
   for the wrong CUDA major is replaced.
4. Everything else (the requirements files) under pip constraints that pin torch and triton to
   the installed versions: no requirement can replace them, a conflict stops pip instead.

This module imports nothing outside the standard library: it runs before anything is installed.
The launcher (src/training/launch.py) checks the installed DALI with the same functions.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from src.errors import UserError, report

REPO = Path(__file__).resolve().parents[1]
PROG = "python -m src.install"

# The torch that `make` installs where none is present, and the triton its CUDA wheels pin
# (torch 2.13.0's Requires-Dist: triton==3.7.1). On PyPI, torch 2.13.0 is a CUDA 13 build.
TESTED_TORCH = "2.13.0"
TESTED_TRITON = "3.7.1"
# DALI 2.x has wheels for these CUDA major versions only, all installing into nvidia/dali.
DALI_CUDA_MAJORS = (12, 13)
DALI_MIN_VERSION = "2.4.0"
CPU_DALI_MAJOR = 12  # a CPU torch: the variant whose CPU pipelines the tests and CI run
# Where a CUDA build of torch comes from: PyTorch's index for one CUDA version. CUDA 13 needs a
# driver of the R580 series or later; cu126 serves the older drivers.
TORCH_INDEX_CUDA13 = "https://download.pytorch.org/whl/cu130"
TORCH_INDEX_CUDA12 = "https://download.pytorch.org/whl/cu126"
_DALI_NAME = re.compile(r"nvidia[-_.]dali[-_.]cuda(\d+)0")


class InstallError(UserError):
    """An environment the set-up will not change by itself (the message has the exact fix)."""


# --- DALI: one variant, chosen from torch's CUDA version -------------------------------------


def dali_package(major: int) -> str:
    """The DALI distribution built for CUDA `major` (12 -> nvidia-dali-cuda120)."""
    return f"nvidia-dali-cuda{major}0"


def cuda_major(cuda: str | None) -> int | None:
    """The major version of a `torch.version.cuda` string ('13.0' -> 13); None for a CPU build."""
    return int(cuda.split(".")[0]) if cuda else None


def wanted_dali(cuda: str | None) -> str:
    """The DALI variant for a torch built for `cuda` (`torch.version.cuda`; None: a CPU build)."""
    major = cuda_major(cuda)
    if major is None:
        return dali_package(CPU_DALI_MAJOR)
    if major not in DALI_CUDA_MAJORS:
        raise InstallError(
            f"torch is built for CUDA {cuda}, and DALI has wheels for CUDA "
            f"{' and '.join(map(str, DALI_CUDA_MAJORS))} only: {cuda_torch_advice(sys.executable)}; "
            "or train with --data-backend torch"
        )
    return dali_package(major)


def installed_dali() -> list[str]:
    """The nvidia-dali-cuda1x0 distributions installed in this environment, sorted."""
    importlib.invalidate_caches()  # pip may have changed site-packages since the last look
    names = set()
    for dist in metadata.distributions():
        m = _DALI_NAME.fullmatch((dist.metadata.get("Name") or "").lower())
        if m:
            names.add(dali_package(int(m.group(1))))
    return sorted(names)


def pip_command(python: str, verb: str, *args: str) -> str:
    """A pip command line for `python`, ready to paste into a shell."""
    return " ".join(shlex.quote(part) for part in (python, "-m", "pip", verb, *args))


def cuda_torch_advice(python: str) -> str:
    """How to put a CUDA build of torch in place of the installed one, then complete the set-up."""
    return (
        f"replace torch with a CUDA build: `{pip_command(python, 'uninstall', '-y', 'torch')} && "
        f"{pip_command(python, 'install', 'torch', '--index-url', TORCH_INDEX_CUDA13)}` (CUDA 13, driver "
        f"R580 or later; {TORCH_INDEX_CUDA12} for older drivers), then run `make` in {REPO}, which keeps it "
        "and adds the DALI for its CUDA version"
    )


def dali_spec(package: str) -> str:
    return f"{package}>={DALI_MIN_VERSION}"


def dali_problem(cuda: str | None, installed: list[str], python: str = sys.executable) -> str | None:
    """Why the installed DALI cannot serve a torch built for `cuda` (None: a CPU build), with the
    exact commands that fix it; None when it can.

    Two variants share the nvidia/dali folder, so removing one deletes files the other
    owns: the fix removes all of them before installing the one that matches.
    """
    want = wanted_dali(cuda)
    install = pip_command(python, "install", dali_spec(want))
    if len(installed) > 1:
        return (
            f"{' and '.join(installed)} are installed together; they share the nvidia/dali folder, so their "
            f"files are mixed: remove them with `{pip_command(python, 'uninstall', '-y', *installed)}`, then "
            f"install {want} with `{install}` (or run `make` again)"
        )
    if not installed:
        return f"DALI is not installed; install {want} with `{install}`, or use --data-backend torch"
    if cuda is not None and installed != [want]:
        return (
            f"torch is built for CUDA {cuda} but the installed DALI is {installed[0]}; replace it with `"
            f"{pip_command(python, 'uninstall', '-y', installed[0])} && {install}`, or use --data-backend "
            "torch"
        )
    return None  # one variant; on a CPU torch either variant's CPU pipelines work


# --- the set-up ------------------------------------------------------------------------------


def _version(name: str) -> str | None:
    importlib.invalidate_caches()
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _triton_requirement() -> str | None:
    """torch's own triton requirement (markers included), as its metadata states it."""
    for line in metadata.requires("torch") or []:
        if re.match(r"triton\b", line.strip()) and "extra ==" not in line:
            return line
    return None


def _torch_cuda(python: str) -> str | None:
    """`torch.version.cuda` of the installed torch, read in a child so this process stays light."""
    proc = subprocess.run(
        [python, "-c", "import torch; print(torch.version.cuda or '')"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise InstallError(
            f"torch {_version('torch')} is installed in {sys.prefix} but does not import ({last}); reinstall "
            "it (README: Training on GPUs) or remove it with "
            f"`{pip_command(python, 'uninstall', '-y', 'torch')}` and run the set-up again"
        )
    return proc.stdout.strip() or None


def _pip(python: str, *args: str, hint: str = "") -> None:
    cmd = [python, "-m", "pip", *args, "--disable-pip-version-check"]
    if subprocess.run(cmd).returncode != 0:
        raise InstallError(f"pip failed (its message is above) running: {shlex.join(cmd)}{hint}")


def say(message: str) -> None:
    print(f"{PROG}: {message}", flush=True)


def run(requirements: list[Path]) -> None:
    """Steps 1-4 of the module docstring, in this interpreter's environment."""
    python = sys.executable
    torch_version = _version("torch")
    if torch_version is None:
        say(
            f"no torch in {sys.prefix}: installing torch=={TESTED_TORCH} with triton=={TESTED_TRITON} "
            "(for another build install it first: README, Training on GPUs)"
        )
        _pip(
            python,
            "install",
            "-q",
            f"torch=={TESTED_TORCH}",
            f"triton=={TESTED_TRITON}; sys_platform == 'linux'",
        )
        torch_version = _version("torch")
        origin = "installed"
    else:
        origin = "kept"
    cuda = _torch_cuda(python)
    triton_version = _version("triton")
    triton_req = _triton_requirement()
    installs: list[str] = []
    if triton_version is None and triton_req is not None:
        installs.append(triton_req)  # torch's own pin, with its markers: pip decides if it applies here
    build = f"CUDA {cuda}" if cuda else "CPU"
    say(
        f"torch {torch_version} ({build}) {origin}; triton "
        + (
            f"{triton_version} {origin}"
            if triton_version
            else "as torch requires"
            if triton_req
            else "none (torch needs none)"
        )
    )

    if sys.platform.startswith("linux"):
        present = installed_dali()
        want = wanted_dali(cuda)
        if len(present) > 1:
            raise InstallError(dali_problem(cuda, present, python) or "")
        if present and cuda is not None and present != [want]:
            say(f"replacing {present[0]} with {want}: torch is built for CUDA {cuda}")
            _pip(python, "uninstall", "-y", "-q", present[0])
            present = []
        if present:
            say(f"DALI {present[0]} kept")
        else:
            say(f"DALI: adding {want} (torch: {build})")
            installs.append(dali_spec(want))
    else:
        say(f"DALI has Linux wheels only; on {sys.platform} the loaders use --data-backend torch")

    with tempfile.TemporaryDirectory(prefix="rwkv-clip-install-") as tmp:
        constraints = Path(tmp, "constraints.txt")
        pins = [f"torch=={torch_version}"]
        if triton_version:
            pins.append(f"triton=={triton_version}")
        constraints.write_text("\n".join(pins) + "\n")
        req_args = [arg for path in requirements for arg in ("-r", str(path))]
        _pip(
            python,
            "install",
            "-q",
            "-c",
            str(constraints),
            *req_args,
            *installs,
            hint=(
                f"; torch and triton stay pinned to {' and '.join(pins)}, so a requirement that needs other "
                "versions of them shows there as a conflict"
            ),
        )

    # pip honours constraints; this says so out loud should anything ever slip past them.
    after = (_version("torch"), _version("triton") if triton_version else None)
    if after != (torch_version, triton_version):
        raise RuntimeError(
            f"torch/triton changed from {torch_version}/{triton_version} to {after[0]}/{after[1]}"
        )
    present = installed_dali() if sys.platform.startswith("linux") else []
    if sys.platform.startswith("linux") and (problem := dali_problem(cuda, present, python)):
        raise InstallError(problem)
    dali = f", {present[0]} {_version(present[0])}" if present else ""
    say(f"done in {sys.prefix}: torch {torch_version} ({build}), triton {_version('triton') or 'none'}{dali}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "Install the toolkit's packages into this Python's environment. A torch already installed is "
            "kept (with the triton it brought); without one, the tested torch and triton are installed. "
            "The DALI wheel is the one for torch's CUDA major version (nvidia-dali-cuda120 or -cuda130), "
            "never both. The requirements are installed with torch and triton pinned to what is installed."
        ),
    )
    parser.add_argument(
        "-r",
        "--requirements",
        action="append",
        type=Path,
        metavar="FILE",
        help="requirements file(s) to install (default: requirements.txt; make passes requirements-dev.txt)",
    )
    args = parser.parse_args(argv)
    requirements = args.requirements or [REPO / "requirements.txt"]
    for path in requirements:
        if not path.is_file():
            parser.error(f"-r {path}: no such file")
    try:
        run(requirements)
    except UserError as e:
        return report(PROG, e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
