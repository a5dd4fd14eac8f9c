"""A Python environment holding only torch, triton and what they declare they need, as the GPU
check machine is before anything is carried there (docs/gpu.md "The GPU check").

It is a venv without the system's site-packages whose site-packages links to this venv's own
copies of those distributions, file by file as each distribution's RECORD lists them, so it
builds in a second and holds nothing of requirements.txt. pip is linked too: the machine has
it, and the carried wheels are installed with it (`python3 -m pip install ... --target`).
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOTS = ("torch", "triton")
INSTALLER = ("pip",)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_closure(roots: tuple[str, ...] = ROOTS) -> list[str]:
    """`roots` and every distribution they require, recursively, as this interpreter resolves the
    markers (extras left out: nobody asked for them)."""
    seen: dict[str, None] = {}
    todo = list(roots)
    while todo:
        name = _normal(todo.pop())
        if name in seen:
            continue
        seen[name] = None
        for line in metadata.requires(name) or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return sorted(seen)


def _top_level(dist: metadata.Distribution) -> set[str]:
    """The names a distribution puts directly into site-packages (packages, modules, .pth, its
    dist-info), from its RECORD; files it puts elsewhere (bin/ scripts) are left out."""
    names = set()
    for file in dist.files or []:
        parts = Path(file).parts
        if parts and parts[0] != ".." and parts[0] != "__pycache__":
            names.add(parts[0])
    return names


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def build(folder: Path, roots: tuple[str, ...] = ROOTS) -> tuple[Path, list[str]]:
    """A venv in `folder` with only `roots`, their declared requirements and pip; returns its
    python and the distributions it holds."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    subprocess.run([base, "-m", "venv", "--without-pip", "--clear", str(folder)], check=True)
    python = folder / "bin" / "python"
    target = site_packages(python)
    held = declared_closure(roots) + list(INSTALLER)
    for name in held:
        dist = metadata.distribution(name)
        source = Path(dist.locate_file(""))
        for entry in _top_level(dist):
            link = target / entry
            if not link.exists():
                os.symlink(source / entry, link)
    return python, held


def carried_wheels(cache: Path) -> list[Path]:
    """benchmarks/gpu_setup.py's carried wheels, as `--download-wheels` fetches them but for this
    interpreter's Python (the machine's 3.12 wheels of numpy, Pillow and regex would not load
    here), downloaded from PyPI once into `cache` and reused while the pins are unchanged."""
    import fcntl
    import hashlib

    from benchmarks import gpu_setup

    pins = gpu_setup.carried_pins()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    folder = cache / f"py{version}-{hashlib.sha256(' '.join(pins).encode()).hexdigest()[:12]}"
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "download.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".complete").exists():
            gpu_setup.download_wheels(folder, pins, python_version=version)
            (folder / ".complete").write_text("\n".join(pins) + "\n")
    return sorted(folder.glob("*.whl"))
