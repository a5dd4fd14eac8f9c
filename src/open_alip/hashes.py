"""How the Hugging Face hub names file content: the sha256 of an LFS file, the git blob id of
any other. The weights loader (pretrained.py) checks downloads with these, and the project's
hub server (src/open_alip/hub_server) announces them; neither pulls in torch through this module."""

from __future__ import annotations

import hashlib
from pathlib import Path

_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _git_blob(size: int):
    """A sha1 fed with git's blob header: what follows is `size` bytes of content."""
    h = hashlib.sha1()
    h.update(b"blob %d\0" % size)
    return h


def git_blob_sha1(path: Path) -> str:
    """The git blob id of a file: what the hub gives as the id of a small (non-LFS) file."""
    h = _git_blob(path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def git_blob_sha1_of(data: bytes) -> str:
    """The git blob id of `data` held in memory (an LFS pointer, a generated file)."""
    h = _git_blob(len(data))
    h.update(data)
    return h.hexdigest()
