"""The set-up (`make` -> python -m src.install) keeps the torch it finds and picks one DALI variant.

The packages are tiny stand-in wheels in a local folder index (pip --no-index --find-links): torch
with the Requires-Dist lines of PyPI's real torch 2.14.1 and 2.13.0 CUDA 13 wheels and a
`torch/version.py` that says its CUDA version, triton 3.7.1 and 3.8.0, both DALI variants (each
writing the same nvidia/dali file, as the real ones share that folder), fla-core with its real
metadata, and one empty wheel for every other name in the requirements files. They are installed
into a scratch venv by the real pip, and `make venv` runs the real set-up against it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from src import install
from tests._repo import REPO

# The Requires-Dist lines of PyPI's torch 2.14.1 and 2.13.0 wheels (cp311 manylinux x86_64, CUDA 13 builds).
_TORCH_COMMON_REQUIRES = [
    "filelock",
    "typing-extensions>=4.10.0",
    "setuptools>=77.0.3",
    "sympy>=1.13.3",
    "networkx>=2.5.1",
    "jinja2",
    "fsspec>=0.8.5",
]
_TORCH_EXTRAS_REQUIRES = [
    'optree>=0.13.0; extra == "optree"',
    'opt-einsum>=3.3; extra == "opt-einsum"',
    'pyyaml; extra == "pyyaml"',
]


def _cuda13_requires(cudnn: str, nccl: str, triton: str) -> list[str]:
    linux, before_315 = 'platform_system == "Linux"', 'platform_system == "Linux" and python_version < "3.15"'
    return [
        *_TORCH_COMMON_REQUIRES,
        "cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]"
        f"==13.0.3; {linux}",
        f"cuda-bindings<14,>=13.0.3; {before_315}",
        f"nvidia-cudnn-cu13=={cudnn}; {linux}",
        f"nvidia-cusparselt-cu13==0.8.1; {linux}",
        f"nvidia-nccl-cu13=={nccl}; {linux}",
        f"nvidia-nvshmem-cu13==3.4.5; {linux}",
        f"triton{triton}; {before_315}",
        *_TORCH_EXTRAS_REQUIRES,
    ]


_TORCH_2_14_REQUIRES = _cuda13_requires("9.24.0.43", "2.30.7", "~=3.8.0")
_TORCH_2_13_REQUIRES = _cuda13_requires("9.20.0.48", "2.29.7", "==3.7.1")
_CPU_TORCH_REQUIRES = _TORCH_COMMON_REQUIRES + _TORCH_EXTRAS_REQUIRES  # the CPU wheel: no CUDA, no triton
_CUDA_EXTRAS = "cublas cudart cufft cufile cupti curand cusolver cusparse nvjitlink nvrtc nvtx".split()
_FLA_REQUIRES = [  # fla-core 0.6.0's METADATA: only einops unless an extra is asked for
    "einops",
    'torch>=2.7.0; extra == "cuda"',
    'triton>=3.3; extra == "cuda"',
    'torch>=2.7.0; extra == "cpu"',
    'triton>=3.3; extra == "cpu"',
]


def _wheel(
    folder: Path,
    name: str,
    version: str,
    requires: Iterable[str] = (),
    files: Mapping[str, str] | None = None,
    extras: Iterable[str] = (),
) -> None:
    """A pure-Python wheel with the given metadata and files, its RECORD hashed as pip expects."""
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}"
    info = f"{stem}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Provides-Extra: {e}" for e in extras] + [f"Requires-Dist: {r}" for r in requires]
    contents = {
        **(files or {}),
        f"{info}/METADATA": "\n".join(meta) + "\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in contents.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    contents[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as z:
        for path, text in contents.items():
            z.writestr(path, text)


def _torch(folder: Path, version: str, cuda: str | None, requires: list[str]) -> None:
    local = version if "+" in version or cuda is None else f"{version}+cu{cuda.replace('.', '')}"
    _wheel(
        folder,
        "torch",
        version,
        requires,
        extras=["optree", "opt-einsum", "pyyaml"],
        files={
            "torch/__init__.py": "from . import version\n__version__ = version.__version__\n",
            "torch/version.py": f"__version__ = {local!r}\ncuda = {cuda!r}\n",
        },
    )


def _requirement_names(path: Path) -> dict[str, str]:
    """{name: a version that satisfies the line} for each requirement of a requirements file."""
    found = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line or line.startswith("-"):
            continue
        m = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:(?:==|>=|~=)\s*([0-9][^;,\s]*))?", line)
        assert m, line
        found[m.group(1)] = m.group(2) or "1.0"
    return found


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("wheels")
    _torch(folder, "2.14.1", "13.0", _TORCH_2_14_REQUIRES)  # newer than the tested torch
    _torch(folder, "2.13.0", "13.0", _TORCH_2_13_REQUIRES)  # PyPI's tested torch: the CUDA 13 build
    _torch(folder, "2.13.0+cpu", None, _CPU_TORCH_REQUIRES)  # the CPU wheel CI machines take
    for version in ("3.7.1", "3.8.0"):
        _wheel(folder, "triton", version, files={"triton/__init__.py": f"__version__ = {version!r}\n"})
    for major in (12, 13):
        _wheel(
            folder,
            install.dali_package(major),
            "2.4.0",
            files={"nvidia/dali/__init__.py": f"built_for_cuda = {major}\n"},
        )
    _wheel(folder, "fla-core", "0.6.0", _FLA_REQUIRES, extras=["cuda", "cpu"])
    _wheel(folder, "cuda-toolkit", "13.0.3", extras=_CUDA_EXTRAS)
    for name, version in (("nvidia-cudnn-cu13", "9.20.0.48"), ("nvidia-nccl-cu13", "2.29.7")):
        _wheel(folder, name, version)  # torch 2.13.0's; the dictionary below has 2.14.1's
    plain = {
        "cuda-bindings": "13.0.3",
        "nvidia-cudnn-cu13": "9.24.0.43",
        "nvidia-cusparselt-cu13": "0.8.1",
        "nvidia-nccl-cu13": "2.30.7",
        "nvidia-nvshmem-cu13": "3.4.5",
        "filelock": "3.0",
        "typing-extensions": "4.10.0",
        "setuptools": "77.0.3",
        "sympy": "1.13.3",
        "networkx": "2.5.1",
        "jinja2": "3.0",
        "fsspec": "0.8.5",
        "einops": "0.8.0",
    }
    for name in ("requirements.txt", "requirements-dev.txt"):
        for requirement, version in _requirement_names(REPO / name).items():
            plain.setdefault(requirement, version)  # torch's own pins above satisfy ours too (setuptools)
    for name, version in plain.items():
        if name != "fla-core":
            _wheel(folder, name, version)
    return folder


def _env(index: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    # Only the stand-ins: no configured index or find-links of this machine.
    env.update(
        PIP_CONFIG_FILE=os.devnull,
        PIP_NO_INDEX="1",
        PIP_FIND_LINKS=str(index),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_CACHE_DIR="1",
        LC_ALL="C",
    )  # make's messages in English
    return env


def _run(cmd: list[str] | str, env: dict[str, str], ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd, env=env, capture_output=True, text=True, timeout=300, shell=isinstance(cmd, str)
    )
    if ok:
        assert proc.returncode == 0, f"{cmd} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _make_venv(venv: Path, env: dict[str, str], ok: bool = True) -> subprocess.CompletedProcess:
    return _run(["make", "-C", str(REPO), "venv", f"VENV={venv}", f"PYTHON={sys.executable}"], env, ok)


def _installed(venv: Path) -> dict[str, str]:
    """{normalized name: version} of what is installed in `venv`."""
    code = (
        "import importlib.metadata as m, json; "
        "print(json.dumps({d.metadata['Name']: d.version for d in m.distributions()}))"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in json.loads(out).items()}


def _dali_file(venv: Path) -> str:
    return next(venv.glob("lib/python*/site-packages/nvidia/dali/__init__.py")).read_text()


def _command(message: str, before: str) -> str:
    """The backticked command that follows `before` in a message."""
    return re.search(re.escape(before) + r"`([^`]+)`", message).group(1)


@pytest.mark.slow
def test_the_set_up_keeps_the_torch_it_finds_and_installs_one_dali_for_its_cuda(index, tmp_path):
    env = _env(index)
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")

    # 1. A fresh clone on a CPU machine (CI): make creates the venv; with no torch there the set-up
    #    installs torch==2.13.0, which resolves to the CPU wheel here as on the CI machines, pinned
    #    with triton 3.7.1 (3.8.0 is in the index too), and the CPU torch gets nvidia-dali-cuda120.
    out = _make_venv(venv, env).stdout
    have = _installed(venv)
    assert (have["torch"], have["triton"]) == (f"{install.TESTED_TORCH}+cpu", install.TESTED_TRITON), out
    assert have["nvidia-dali-cuda120"] == "2.4.0" and "nvidia-dali-cuda130" not in have
    assert have["fla-core"] == "0.6.0" and "pytest" in have and "numpy" in have
    assert "torch 2.13.0+cpu (CPU) installed" in out and (venv / ".installed").exists()
    assert "Nothing to be done" in _make_venv(venv, env).stdout  # idempotent

    # 2. The user puts a CUDA build of torch in its place, as the launcher's advice says (that exact
    #    command; PIP_NO_INDEX keeps its --index-url offline): the newest stand-in, torch 2.14.1 for
    #    CUDA 13, which brings the triton it requires (3.8.0).
    _run(_command(install.cuda_torch_advice(python), "replace torch with a CUDA build: "), env)
    assert (_installed(venv)["torch"], _installed(venv)["triton"]) == ("2.14.1", "3.8.0")

    # 3. make notices the new torch and sets up again: torch and triton are kept (not put back to
    #    2.13.0 / 3.7.1), and the DALI for CPU is replaced by the one for CUDA 13, not joined by it.
    out = _make_venv(venv, env).stdout
    have = _installed(venv)
    assert (have["torch"], have["triton"]) == ("2.14.1", "3.8.0"), out
    assert "torch 2.14.1 (CUDA 13.0) kept; triton 3.8.0 kept" in out
    assert "replacing nvidia-dali-cuda120 with nvidia-dali-cuda130: torch is built for CUDA 13.0" in out
    assert have["nvidia-dali-cuda130"] == "2.4.0" and "nvidia-dali-cuda120" not in have
    assert _dali_file(venv) == "built_for_cuda = 13\n"

    # 4. A second variant installed by hand lands in the same folder (its file overwrites the other's);
    #    make notices the new DALI and refuses, with the exact command that removes both.
    _run([python, "-m", "pip", "install", "-q", "--no-deps", "nvidia-dali-cuda120"], env)
    assert _dali_file(venv) == "built_for_cuda = 12\n"
    refused = _make_venv(venv, env, ok=False)
    assert refused.returncode != 0
    line = next(ln for ln in refused.stderr.splitlines() if ln.startswith("python -m src.install: error: "))
    assert "nvidia-dali-cuda120 and nvidia-dali-cuda130 are installed together" in line
    remove = _command(line, "remove them with ")
    assert remove == f"{shlex.quote(python)} -m pip uninstall -y nvidia-dali-cuda120 nvidia-dali-cuda130"
    _run(remove, env)
    assert not any(name.startswith("nvidia-dali") for name in _installed(venv))

    # 5. The refused run left no stamp, so make sets up again: the one variant for torch's CUDA.
    out = _make_venv(venv, env).stdout
    have = _installed(venv)
    assert (have["torch"], have["triton"]) == ("2.14.1", "3.8.0"), out
    assert have["nvidia-dali-cuda130"] == "2.4.0" and "nvidia-dali-cuda120" not in have
    assert _dali_file(venv) == "built_for_cuda = 13\n"

    # 6. A requirement that wants another torch (the old requirements' pin) is a conflict, not a downgrade.
    wants_old = tmp_path / "wants-old-torch.txt"
    wants_old.write_text("torch==2.13.0\n")
    proc = subprocess.run(
        [python, "-m", "src.install", "-r", str(wants_old)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].startswith("python -m src.install: error: pip failed")
    assert "torch and triton stay pinned to torch==2.14.1 and triton==3.8.0" in proc.stderr
    assert (_installed(venv)["torch"], _installed(venv)["triton"]) == ("2.14.1", "3.8.0")


def test_the_dali_variant_follows_torchs_cuda_major():
    assert install.wanted_dali("13.0") == "nvidia-dali-cuda130"
    assert install.wanted_dali("12.6") == "nvidia-dali-cuda120"
    assert install.wanted_dali(None) == "nvidia-dali-cuda120"  # a CPU torch: the variant CI runs
    with pytest.raises(
        install.InstallError, match="built for CUDA 11.8, and DALI has wheels for CUDA 12 and 13 only"
    ):
        install.wanted_dali("11.8")
    py = "/v/bin/python"
    assert install.dali_problem("13.0", ["nvidia-dali-cuda130"], py) is None
    assert install.dali_problem(None, ["nvidia-dali-cuda130"], py) is None  # CPU pipelines run on either
    assert install.dali_problem("12.4", [], py) == (
        "DALI is not installed; install nvidia-dali-cuda120 with `/v/bin/python -m pip install "
        "'nvidia-dali-cuda120>=2.4.0'`, or use --data-backend torch"
    )
    both = install.dali_problem(None, ["nvidia-dali-cuda120", "nvidia-dali-cuda130"], py)
    assert (
        "remove them with `/v/bin/python -m pip uninstall -y nvidia-dali-cuda120 nvidia-dali-cuda130`" in both
    )
