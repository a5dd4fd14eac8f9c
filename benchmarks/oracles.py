"""Reference implementations: real MXNet (the RecordIO format oracle) and open_clip's tokenizer
in throw-away virtualenvs, and a spec-literal RecordIO encoder. Tests check against them;
benchmarks time against them.

The venvs live under `.cache/venvs/<name>` in the repo (git-ignored), are built once and
reused while their package list is unchanged. A file lock makes concurrent test
processes wait for one build instead of racing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

from src.install import TESTED_TORCH

REPO_ROOT = Path(__file__).resolve().parent.parent
VENV_ROOT = Path(os.environ.get("RWKV_CLIP_TEST_VENVS", REPO_ROOT / ".cache" / "venvs"))

RECORDIO_MAGIC = struct.pack("<I", 0xCED7230A)  # docs/formats.md section 1, written out again on purpose


def reference_encode(data: bytes) -> bytes:
    """docs/formats.md section 1, read literally and slowly: the bytes one record occupies."""
    parts, start = [], 0
    for i in range(0, len(data) - 3, 4):
        if data[i : i + 4] == RECORDIO_MAGIC:
            parts.append(data[start:i])
            start = i + 4
    parts.append(data[start:])
    out = b""
    for n, part in enumerate(parts):
        if len(parts) == 1:
            cflag = 0
        else:
            cflag = 1 if n == 0 else 3 if n == len(parts) - 1 else 2
        out += RECORDIO_MAGIC + struct.pack("<I", (cflag << 29) | len(part)) + part
    return out + b"\0" * (-len(data) % 4)


MXNET_PACKAGES = ("mxnet==1.9.1", "numpy<1.24", "opencv-python-headless==4.8.1.78")


def base_python() -> str:
    # A venv created from inside another venv must start from the real interpreter.
    return getattr(sys, "_base_executable", None) or sys.executable


def project_torch_site() -> tuple[Path, str]:
    """The site-packages folder holding the torch this process runs (the project's .venv when the
    tests run), and that torch's version."""
    import torch

    # Resolved: the same torch reached through a symlinked .venv (a second worktree) names one folder,
    # so the venv's recipe, and with it the built venv, stays the same.
    return Path(torch.__file__).resolve().parent.parent, torch.__version__


def oracle_python(
    name: str,
    packages: tuple[str, ...] | list[str],
    pip_args: tuple[str, ...] = (),
    share_torch: bool = False,
) -> Path:
    """Return the python of venv `name` holding `packages`, building it on first use.

    `share_torch`: the venv also sees the project's site-packages, after its own (a `.pth` line),
    so it imports the project's torch instead of installing a second one (a CUDA build from PyPI
    is gigabytes); its own packages still come first."""
    VENV_ROOT.mkdir(parents=True, exist_ok=True)
    venv = VENV_ROOT / name
    python = venv / "bin" / "python"
    shared = project_torch_site() if share_torch else None
    recipe = [*packages, "--", *pip_args, "--", *(map(str, shared) if shared else [])]
    wanted = hashlib.sha256("\n".join(recipe).encode()).hexdigest()
    stamp = venv / ".packages.sha256"
    with open(VENV_ROOT / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text().strip() == wanted:
            return python
        subprocess.run([base_python(), "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *pip_args, *packages],
            check=True,
        )
        if shared:
            site = subprocess.run(
                [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.strip()
            (Path(site) / "project_torch.pth").write_text(f"{shared[0]}\n")
        stamp.write_text(wanted + "\n")
    return python


def mxnet_python() -> Path:
    """Python of a venv with real MXNet 1.9.1, the RecordIO format oracle."""
    return oracle_python("mxnet", MXNET_PACKAGES)


def run_oracle(
    python: Path,
    code: str,
    *args: str,
    timeout: float = 600,
    cwd: Path | None = None,
    options: tuple[str, ...] = (),
) -> subprocess.CompletedProcess:
    """Run `code` in the oracle interpreter (from `cwd`, whose modules it can then import, as
    `python -c` puts the working folder first on its path), with interpreter `options` (e.g. "-O");
    raise with its stderr on failure."""
    proc = subprocess.run(
        [str(python), *options, "-c", code, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
    if proc.returncode != 0:
        raise AssertionError(f"oracle failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


# ---------------------------------------------------------------------------------------------
# open_clip's tokenizer
#
# The reference CLIP tokenizer (open_clip's), run in its own venv as a long-lived process.
#
# open_clip is never installed in the project venv: it pins torchvision and timm. The
# oracle venv gets open_clip_torch without dependencies and only what its tokenizer
# module imports; that module is loaded by file path so open_clip/__init__ (which
# wants torchvision) is never run. One process answers many requests over a pipe,
# so a hypothesis test can ask per example without paying interpreter start-up.
OPEN_CLIP_VERSION = "3.3.0"
# What open_clip's tokenizer imports; regex is pinned to the project venv's version: its Unicode
# tables decide what is a letter.
TOKENIZER_PACKAGES = ("ftfy==6.3.1", "wcwidth", "regex==2026.11.19")
# torch's own dependencies, for venvs installed with --no-deps.
TORCH_DEPENDENCIES = (
    "typing-extensions",
    "filelock",
    "sympy",
    "mpmath",
    "networkx",
    "jinja2",
    "MarkupSafe",
    "fsspec",
)
CLIP_REF_PACKAGES = (
    f"open_clip_torch=={OPEN_CLIP_VERSION}",
    *TOKENIZER_PACKAGES,
    "numpy",
    f"torch=={TESTED_TORCH}",
    *TORCH_DEPENDENCIES,
)

_SERVER = r"""
import importlib.util, json, pathlib, sys, sysconfig
path = pathlib.Path(sysconfig.get_paths()["purelib"]) / "open_clip" / "tokenizer.py"
spec = importlib.util.spec_from_file_location("ref_tokenizer", path)
ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
out = sys.stdout
out.write(json.dumps({"ready": str(path)}) + "\n"); out.flush()
for line in sys.stdin:
    req = json.loads(line)
    try:
        if req["op"] == "tokenize":
            result = ref.tokenize(req["texts"], context_length=req["ctx"]).tolist()
        elif req["op"] == "encode":
            result = [ref._tokenizer.encode(t) for t in req["texts"]]
        elif req["op"] == "decode":
            result = [ref._tokenizer.decode(ids) for ids in req["ids"]]
        else:
            raise ValueError(req["op"])
        reply = {"result": result}
    except Exception as e:
        reply = {"error": repr(e)}
    out.write(json.dumps(reply) + "\n"); out.flush()
"""


def reference_python() -> Path:
    return oracle_python("clip-ref", CLIP_REF_PACKAGES, pip_args=("--no-deps",))


class ReferenceTokenizer:
    """Client of the reference process. Strings travel as JSON (lone surrogates survive \\u escapes)."""

    def __init__(self, python: Path) -> None:
        self._proc = subprocess.Popen(
            [str(python), "-c", _SERVER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="ascii",
        )
        hello = json.loads(self._proc.stdout.readline() or "{}")
        if "ready" not in hello:
            raise RuntimeError("reference tokenizer process failed to start")

    def _ask(self, **request):
        self._proc.stdin.write(json.dumps(request) + "\n")
        self._proc.stdin.flush()
        reply = json.loads(self._proc.stdout.readline())
        if "error" in reply:
            raise RuntimeError(f"reference tokenizer raised {reply['error']}")
        return reply["result"]

    def tokenize(self, texts: list[str], context_length: int = 77) -> list[list[int]]:
        return self._ask(op="tokenize", texts=texts, ctx=context_length)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self._ask(op="encode", texts=texts)

    def decode(self, ids: list[list[int]]) -> list[str]:
        return self._ask(op="decode", ids=ids)

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=30)


# ---------------------------------------------------------------------------------------------
# CLIP_benchmark
#
# clip_benchmark 1.6.2 (the newest release) in its own venv, without its dependencies: its
# command line imports torchvision and open_clip at module level, and torchvision's wheels are
# CUDA builds, so neither is installed. What is installed is what its metric modules
# (clip_benchmark.metrics.zeroshot_classification / zeroshot_retrieval / linear_probe) import, and
# this repository's model code's own needs (numpy 2 as in the project); torch is the project's own
# (`share_torch`), not a second copy.
CLIP_BENCHMARK_VERSION = "1.6.2"
CLIP_BENCHMARK_PACKAGES = (
    f"clip_benchmark=={CLIP_BENCHMARK_VERSION}",
    "scikit-learn",
    "joblib",
    "cloudpickle",
    "narwhals",
    "threadpoolctl",
    "scipy",
    "numpy>=2",
    "tqdm",
    "pillow",
    *TORCH_DEPENDENCIES,
    *TOKENIZER_PACKAGES,
    "safetensors",
)
# Named apart from the venv of the list that installed its own torch: two checkouts with the two
# lists would otherwise rebuild one shared venv in turn (RWKV_CLIP_TEST_VENVS).
CLIP_BENCHMARK_VENV = "clip-benchmark-2"


def clip_benchmark_python() -> Path:
    """Python of a venv holding CLIP_benchmark's metric code (see above)."""
    return oracle_python(
        CLIP_BENCHMARK_VENV, CLIP_BENCHMARK_PACKAGES, pip_args=("--no-deps",), share_torch=True
    )
