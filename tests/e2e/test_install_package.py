"""`pip install .` and `pip install -e .` give a working `open_alip` from any folder, with the console
scripts `rwkv-clip-export` and `rwkv-clip-hub-server` (a weights folder exported, served and loaded back
through `hf-hub:`), and the guide's `from src.open_alip import tokenize` keeps working from the repository
root.

Each install goes into a scratch virtualenv made from a fresh copy of the repository. The venv
sees the project venv's packages through a .pth file, so torch is not downloaded again; pip runs
with --no-deps --no-build-isolation --no-index (nothing is fetched), and a separate dry run with
dependencies shows that the declared requirements are met by the torch already installed.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sysconfig
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from benchmarks.oracles import base_python
from src.install import TESTED_TORCH
from tests._repo import REPO, fresh_copy

# Run from a folder holding the user's own `src` package: the library must not clash with it.
USE = r"""
import json, sys
import src
import open_alip
from open_alip import create_model_and_transforms, get_tokenizer, list_models, list_pretrained, tokenize
from open_alip.zero_shot import list_metadata
from pathlib import Path
import torch

model, _, preprocess_val = create_model_and_transforms("RWKV_CLIP_tiny")
tokens = tokenize(["a photo of a cat", "a dog"])
with torch.no_grad():
    image, text, scale = model(torch.zeros(1, 3, 32, 32), get_tokenizer("RWKV_CLIP_tiny")(["a cat"]))
package = Path(open_alip.__file__).parent
print(json.dumps({
    "library": str(package),
    "users_src": src.__file__,
    "tokens": tokens[:, :4].tolist(),
    "image": list(image.shape), "text": list(text.shape), "norm": float(image.norm()),
    "models": list_models(),
    "released": len(list_pretrained()),
    "zero_shot": len(list_metadata()),
    "license": (package / "LICENSE-bpe-vocab.txt").is_file(),
    "model_module": type(model).__module__,
}))
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"{args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


@pytest.fixture
def scratch(tmp_path):
    """(python of an empty venv that sees the project venv's packages, its site-packages, a fresh
    repository copy, a user's folder with its own `src` package)."""
    root = tmp_path
    venv = root / "venv"
    _run([base_python(), "-m", "venv", "--without-pip", str(venv)], root)
    python = venv / "bin" / "python"
    purelib = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root
        ).stdout.strip()
    )
    (purelib / "project_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    repo = fresh_copy(root / "RWKV-CLIP")
    user = root / "user"
    (user / "src").mkdir(parents=True)
    (user / "src" / "__init__.py").write_text("USERS_OWN = True\n")
    return python, purelib, repo, user


def _pip(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return _run([str(python), "-m", "pip", *args], cwd)


def _use(python: Path, user: Path) -> dict:
    return json.loads(_run([str(python), "-c", USE], user).stdout.strip().splitlines()[-1])


def _check_use(got: dict, user: Path) -> None:
    assert got["users_src"] == str(user / "src" / "__init__.py")
    assert got["tokens"] == [[49406, 320, 1125, 539], [49406, 320, 1929, 49407]]
    assert got["image"] == got["text"] == [1, 64] and abs(got["norm"] - 1.0) < 1e-5
    assert got["models"] == ["RWKV_CLIP_B16", "RWKV_CLIP_B32", "RWKV_CLIP_demo", "RWKV_CLIP_tiny"]
    assert got["released"] == 4  # released.py travels with the package
    assert got["zero_shot"] == 11 and got["license"]
    assert got["model_module"] == "open_alip.model"


SCRIPTS = ("rwkv-clip-export", "rwkv-clip-hub-server")

# A train.py-like checkpoint of the tiny model (its config recorded), and the embeddings it gives.
SAVE = r"""
import sys, torch
from open_alip import create_model_and_transforms, get_model_config
model, _, _ = create_model_and_transforms("RWKV_CLIP_tiny")
torch.save({"state_dict": model.state_dict(), "config": get_model_config("RWKV_CLIP_tiny")}, sys.argv[1])
with torch.no_grad():
    torch.save(model.encode_image(torch.ones(1, 3, 32, 32)), sys.argv[2])
"""
LOAD = r"""
import sys, torch
from open_alip import create_model_and_transforms
model, _, _ = create_model_and_transforms("hf-hub:me/tiny-rwkv-clip")
with torch.no_grad():
    assert torch.equal(model.encode_image(torch.ones(1, 3, 32, 32)), torch.load(sys.argv[1])), "other weights"
print("loaded through the hub")
"""


def _check_console_scripts(venv_bin: Path, user: Path) -> None:
    """Each script's --help, then export -> serve -> load through hf-hub:, all from the user's folder."""
    for script in SCRIPTS:
        help_text = _run([str(venv_bin / script), "--help"], user).stdout
        assert help_text.startswith(f"usage: {script} "), help_text
    python = str(venv_bin / "python")
    _run([python, "-c", SAVE, "tiny.pt", "features.pt"], user)
    _run([str(venv_bin / "rwkv-clip-export"), "tiny.pt", "--output", "tiny-hub"], user)
    assert sorted(p.name for p in (user / "tiny-hub").iterdir()) == [
        "README.md",
        "model.safetensors",
        "open_clip_config.json",
    ]
    port_file = user / "endpoint.txt"
    server = subprocess.Popen(
        [
            str(venv_bin / "rwkv-clip-hub-server"),
            "--root",
            "tiny-hub",
            "--repo-id",
            "me/tiny-rwkv-clip",
            "--repo-type",
            "model",
            "--port-file",
            str(port_file),
        ],
        cwd=user,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert port_file.exists(), (
            server.stderr.read() if server.poll() is not None else "no endpoint in 60 s"
        )
        env = {**_env(), "HF_ENDPOINT": port_file.read_text().strip(), "HF_HOME": str(user / "hf_home")}
        proc = subprocess.run(
            [python, "-c", LOAD, "features.pt"],
            cwd=user,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0 and "loaded through the hub" in proc.stdout, proc.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_pip_install_then_editable_install_import_from_any_folder(scratch):
    python, purelib, repo, user = scratch

    # The declared requirements are met by what is installed: pip would add the library alone and
    # leave torch (a CPU or CUDA build, whatever the user has) as it is.
    dry = _pip(python, "install", "--dry-run", "--no-index", "--no-build-isolation", str(repo), cwd=user)
    assert "Would install rwkv-clip-0.1.0" in dry.stdout, dry.stdout

    _pip(python, "install", "--no-deps", "--no-index", "--no-build-isolation", str(repo), cwd=user)
    installed = {p.name for p in purelib.iterdir()} - {"project_venv.pth", "__pycache__"}
    assert installed == {"open_alip", "rwkv_clip-0.1.0.dist-info"}  # the library only: no stray modules
    got = _use(python, user)
    assert got["library"] == str(purelib / "open_alip")
    _check_use(got, user)
    package = purelib / "open_alip"
    assert not list(package.glob("test*")) and not (purelib / "src").exists()
    _check_console_scripts(python.parent, user)

    _pip(python, "uninstall", "-y", "rwkv-clip", cwd=user)
    _pip(python, "install", "--no-deps", "--no-index", "--no-build-isolation", "-e", str(repo), cwd=user)
    got = _use(python, user)
    assert got["library"] == str(repo / "src" / "open_alip")  # edits in the checkout take effect
    _check_use(got, user)
    # Only open_alip is mapped: the toolkit's other modules under src/ stay out of sys.path.
    probe = (
        "import importlib.util as u; print([n for n in ('devices', 'training', 'recordio') if "
        "u.find_spec(n)])"
    )
    assert _run([str(python), "-c", probe], user).stdout.strip() == "[]"

    # From the repository root the guide's spelling still works; using both names in one process
    # warns (each would have its own classes).
    code = (
        "import warnings; from src.open_alip import tokenize; print(tokenize(['a cat'])[0, :3].tolist()); "
        "warnings.simplefilter('error'); import open_alip"
    )
    proc = subprocess.run(
        [str(python), "-c", code], cwd=repo, env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.stdout.strip() == "[49406, 320, 2368]", proc.stderr
    assert proc.returncode != 0 and "imported as both 'src.open_alip' and 'open_alip'" in proc.stderr, (
        proc.stderr
    )


def test_the_declared_torch_is_the_tested_one():
    # pyproject.toml cannot import src/install.py, which owns the tested version: the two must agree,
    # and the range must not reach a torch the tests never ran (PyPI's newest, a CUDA build).
    # tomllib is Python 3.11's; the toolkit runs on 3.10: the requirement read as written.
    torch = Requirement(re.search(r'"(torch[<>=!~ ][^"]*)"', (REPO / "pyproject.toml").read_text()).group(1))
    major, minor, _ = TESTED_TORCH.split(".")
    assert torch.specifier.contains(TESTED_TORCH) and torch.specifier.contains(f"{TESTED_TORCH}+cpu")
    assert not torch.specifier.contains(f"{major}.{int(minor) + 1}.0")
    assert not torch.specifier.contains(f"{major}.{int(minor) - 1}.0")
