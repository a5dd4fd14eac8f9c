"""The GPU check on a machine that has only torch, triton and what they require (the check
machine before anything is carried there: docs/gpu.md "The GPU check"), on the CPU.

An environment of exactly those packages is built (tests/_bare_env.py: this venv's own copies,
nothing of requirements.txt), the carried wheels are downloaded from PyPI as `--download-wheels`
does (for this Python; cached under .cache/) and installed with the README's line, then the
check's whole import chain and its `--cpu-test` run there. The imports the chain makes from
the installed folder must be exactly the carried wheels: none missing, none carried in vain.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from benchmarks import gpu_setup
from tests import _bare_env
from tests._repo import REPO

README = REPO / "README.md"


def _readme_install_line() -> str:
    lines = [line for line in README.read_text().splitlines() if line.startswith("python3 -m pip install ")]
    assert len(lines) == 1, lines
    return lines[0]


def _bare_run(python, args: list[str], site, cwd=REPO, **kwargs) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env.update(
        PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(site),
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONWARNINGS="ignore",
        **kwargs,
    )
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_check_runs_on_a_bare_machine_with_exactly_the_carried_wheels(tmp_path):
    python, held = _bare_env.build(tmp_path / "bare")
    assert not {"numpy", "einops", "packaging", "fla-core", "pillow"} & set(held)
    wheels = _bare_env.carried_wheels(REPO / ".cache" / "gpu_wheels")
    assert len(wheels) == len(gpu_setup.CARRIED)
    work, site = tmp_path / "machine", tmp_path / "site"
    shutil.copytree(wheels[0].parent, work / ".whl", ignore=shutil.ignore_patterns(".complete"))

    # The README's line, as it is, but for the folder it installs into (/tmp/site is shared here).
    line = _readme_install_line()
    assert line == gpu_setup.install_line()
    proc = _bare_run(
        python, ["bash", "-c", line.replace(gpu_setup.INSTALL_TARGET, str(site))], site, cwd=work
    )
    assert proc.returncode == 0, proc.stderr

    before = _bare_run(python, [str(python), "-c", "import numpy"], tmp_path / "nothing")
    assert "No module named 'numpy'" in before.stderr  # the bare environment really lacks it

    # The import chain: what it takes from the installed folder is exactly what is carried.
    code = (
        "import json, sys\n"
        "from benchmarks import gpu_setup\n"
        "assert gpu_setup.check_imports() is None\n"
        f"site = {str(site)!r} + '/'\n"
        "print(json.dumps(sorted({m.__file__[len(site):].split('/')[0] for m in list(sys.modules.values())\n"
        "                         if (getattr(m, '__file__', None) or '').startswith(site)})))\n"
    )
    proc = _bare_run(python, [str(python), "-c", code], site)
    assert proc.returncode == 0, proc.stderr
    imported = {re.sub(r"\.py$", "", name) for name in json.loads(proc.stdout)}
    assert imported == {c.module for c in gpu_setup.CARRIED}

    # The check itself, every section's code, the children included.
    out = tmp_path / "report.json"
    proc = _bare_run(python, [str(python), "-m", "benchmarks.gpu", "--cpu-test", "--output", str(out)], site)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["status"] == "done" and report["fla"] == "0.6.0" and report["fla_missing"] is None
    sections = report["sections"]
    assert [n for n, s in sections.items() if s["status"] == "done"] == [
        "wkv",
        "train_compiled",
        "train_eager",
        "predict",
    ], sections
    assert all("fla" not in s and "error" not in s for s in sections.values())
    for name in ("train_compiled", "train_eager"):
        (case,) = sections[name]["cases"]
        assert case["loss_finite"] and "error" not in case, case
    assert sections["train_compiled"]["tables"]["profile"]
    assert sections["dali"]["note"].startswith("nvidia-dali is not installed")
    assert "== summary" in proc.stdout
