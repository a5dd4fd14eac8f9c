"""The repository root, for tests that run its scripts or read its files."""

import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def fresh_copy(target: Path) -> Path:
    """What `git clone` of the working tree gives: every tracked file, nothing ignored or built."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target
