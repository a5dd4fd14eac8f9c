"""The served repository: which files a folder holds, and the ids the hub gives them.

Files with an LFS-typed suffix or at least LFS_THRESHOLD bytes are LFS files (announced by
sha256, downloaded through the "CDN"); the others are regular git files (announced by their
git blob id). docs/formats.md §4 describes what clients expect of both.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..hashes import file_sha256, git_blob_sha1, git_blob_sha1_of

# Extensions the hub's default .gitattributes sends to LFS; any file at or above
# LFS_THRESHOLD is LFS too (the hub rejects larger regular files).
LFS_SUFFIXES = frozenset(
    {
        ".parquet",
        ".arrow",
        ".bin",
        ".safetensors",
        ".pt",
        ".pth",
        ".ckpt",
        ".tar",
        ".gz",
        ".zip",
        ".zst",
        ".rec",
        ".idx",
        ".npy",
        ".npz",
        ".h5",
        ".onnx",
        ".msgpack",
        ".pkl",
        ".tfrecord",
    }
)
LFS_THRESHOLD = 10 * 1024 * 1024
# Tool state that lies in a mirrored folder but was never part of the repo.
SKIP_DIRS = frozenset({".git", ".hfd", ".cache", ".huggingface"})


@dataclass
class RepoFile:
    """One file of the served repo; ``path`` is None for in-memory files (``data``)."""

    rfilename: str
    size: int
    path: Path | None = None
    data: bytes | None = None
    sha256: str | None = None  # set for LFS files
    git_sha1: str = ""  # git blob id of the content (regular) or of the LFS pointer

    @property
    def is_lfs(self) -> bool:
        return self.sha256 is not None

    def pointer(self) -> bytes:
        return (
            f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n"
        ).encode()

    @classmethod
    def in_memory(cls, rfilename: str, data: bytes) -> RepoFile:
        return cls(rfilename, len(data), data=data, git_sha1=git_blob_sha1_of(data))


def _is_lfs(rel: str, size: int, threshold: int) -> bool:
    return size >= threshold or Path(rel).suffix.lower() in LFS_SUFFIXES


def _known_hashes(root: Path) -> dict[str, tuple[int, str, str, str]]:
    """Hashes the downloader (data/hfd.sh) already verified: name -> (size, mtime, kind, hash).

    mtime is kept as hfd.sh writes it (seconds with 9 decimals), compared as text.

    Re-serving a 1 TB mirror would otherwise re-hash every shard at start-up.
    """
    state = root / ".hfd" / "verified.tsv"
    known: dict[str, tuple[int, str, str, str]] = {}
    if state.is_file():
        for line in state.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) == 5 and parts[1].isdigit():
                known[parts[0]] = (int(parts[1]), parts[2], parts[3], parts[4])
    return known


def _walk(root: Path) -> list[tuple[str, Path, int]]:
    found: list[tuple[str, Path, int]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            p = Path(dirpath) / name
            # a symlink may point anywhere; serve only what really lies under root
            if p.is_file() and p.resolve().is_relative_to(root):
                found.append((p.relative_to(root).as_posix(), p, p.stat().st_size))
    return found


def scan_folder(root: Path, lfs_threshold: int = LFS_THRESHOLD, progress: bool = False) -> list[RepoFile]:
    """List the files under ``root`` as repo files, hashing what the hub would hash."""
    root = root.resolve()
    known = _known_hashes(root)
    found = _walk(root)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(
            total=sum(s for _, _, s in found), unit="B", unit_scale=True, desc="hashing", file=sys.stderr
        )
    files = []
    for rel, p, size in found:
        ns = p.stat().st_mtime_ns
        mtime = f"{ns // 10**9}.{ns % 10**9:09d}"
        if _is_lfs(rel, size, lfs_threshold):
            k = known.get(rel)
            sha = k[3] if k and k[0] == size and k[1] == mtime and k[2] == "sha256" else file_sha256(p)
            f = RepoFile(rel, size, path=p, sha256=sha)
            f.git_sha1 = git_blob_sha1_of(f.pointer())
        else:
            f = RepoFile(rel, size, path=p, git_sha1=git_blob_sha1(p))
        files.append(f)
        if bar is not None:
            bar.update(size)
    if bar is not None:
        bar.close()
    return files


class HubRepo:
    """The served repository: files by name, its commit id, and optional gating token."""

    def __init__(self, repo_id: str, repo_type: str, files: list[RepoFile], token: str | None = None):
        if repo_type not in ("dataset", "model"):
            raise ValueError(f"repo_type must be 'dataset' or 'model', not {repo_type!r}")
        self.repo_id = repo_id
        self.repo_type = repo_type
        self.token = token
        self.files = {f.rfilename: f for f in files}
        digest = hashlib.sha1()
        for f in sorted(files, key=lambda f: f.rfilename):
            digest.update(f"{f.rfilename}\0{f.git_sha1}\n".encode())
        self.sha = digest.hexdigest()
        self.by_sha256 = {f.sha256: f for f in files if f.sha256}

    def info(self, blobs: bool) -> dict:
        """The repo-info answer (``/api/datasets/ORG/NAME``), siblings with sizes when ``blobs``."""
        return {
            "_id": self.sha[:24],
            "id": self.repo_id,
            "sha": self.sha,
            "private": False,
            "gated": "auto" if self.token else False,
            "disabled": False,
            "tags": [],
            "downloads": 0,
            "likes": 0,
            "lastModified": "2026-01-01T00:00:00.000Z",
            "siblings": [self.sibling(f, blobs) for _, f in sorted(self.files.items())],
        }

    def sibling(self, f: RepoFile, blobs: bool) -> dict:
        d: dict = {"rfilename": f.rfilename}
        if blobs:
            d["size"] = f.size
            d["blobId"] = f.git_sha1
            if f.is_lfs:
                d["lfs"] = {"sha256": f.sha256, "size": f.size, "pointerSize": len(f.pointer())}
        return d

    def tree_entries(self, prefix: str, recursive: bool) -> list[dict]:
        prefix = prefix.strip("/")
        base = prefix + "/" if prefix else ""
        entries: dict[str, dict] = {}
        for name in sorted(self.files):
            if not name.startswith(base):
                continue
            parts = name[len(base) :].split("/")
            # directories on the way to the file (all of them when recursive)
            for i in range(1, len(parts) if recursive else min(2, len(parts))):
                d = base + "/".join(parts[:i])
                entries.setdefault(
                    d,
                    {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d},
                )
            if recursive or len(parts) == 1:
                f = self.files[name]
                e: dict = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": name}
                if f.is_lfs:
                    e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(f.pointer())}
                entries[name] = e
        return list(entries.values())
