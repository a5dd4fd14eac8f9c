"""`python -m src.open_alip.hub_server` as a user starts it, for tests that need the real command."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests._repo import REPO


@contextmanager
def hub_server_cli(
    root: Path, repo_id: str, port_file: Path, *extra: str, env: dict | None = None
) -> Iterator[str]:
    """Serve `root` as `repo_id` with the CLI until the block ends; yields its endpoint URL."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "src.open_alip.hub_server",
            "--root",
            str(root),
            "--repo-id",
            repo_id,
            "--port-file",
            str(port_file),
            *extra,
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(600):
            if port_file.exists() or server.poll() is not None:
                break
            time.sleep(0.05)
        assert port_file.exists(), (
            server.stderr.read() if server.poll() is not None else "server did not start"
        )
        yield port_file.read_text().strip()
    finally:
        server.terminate()
        server.wait(timeout=30)
