"""Serve a local folder as a Hugging Face hub repository.

Two uses: (1) a mirror for a cluster (download a dataset once, then point every node's
``HF_ENDPOINT`` at this server), and (2) a faithful stand-in for the hub in tests, with
fault injection (dropped connections, 503s, throttling, hostile file names) driven from
Python through :class:`Faults`.

The server implements the part of the hub API that downloaders use (docs/formats.md §4):
repo info (``?blobs=true``), the paginated tree listing, and ``resolve`` URLs. LFS files
answer ``resolve`` with a 302 to a signed "CDN" URL on a second host name, like the real
hub, so clients must handle cross-host redirects and must not forward their token.

Python API::

    with serve_in_background(root, "org/name", repo_type="dataset") as server:
        os.environ["HF_ENDPOINT"] = server.endpoint
        server.faults.fail_503 = 2        # the next two requests get 503
        ...
        server.requests                   # what clients asked for (method, host, path, ...)
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from src.fsutil import atomic_write_text

# Extensions the hub's default .gitattributes sends to LFS; any file at or above
# LFS_THRESHOLD is LFS too (the hub rejects larger regular files).
LFS_SUFFIXES = frozenset(
    {".parquet", ".arrow", ".bin", ".safetensors", ".pt", ".pth", ".ckpt", ".tar", ".gz", ".zip",
     ".zst", ".rec", ".idx", ".npy", ".npz", ".h5", ".onnx", ".msgpack", ".pkl", ".tfrecord"}
)
LFS_THRESHOLD = 10 * 1024 * 1024
SKIP_DIRS = frozenset({".git", ".hfd", ".cache", ".huggingface"})
TREE_PAGE_SIZE = 1000
_CHUNK = 1 << 20


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
        return f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {self.size}\n".encode()


@dataclass
class RequestRecord:
    method: str
    host: str
    path: str
    range: str | None
    authorization: bool
    status: int = 0
    sent: int = 0  # body bytes written (tests use it to see that a resume did not start over)


@dataclass
class Faults:
    """Fault injection, changed by tests while the server runs (reads are per request/chunk).

    fail_503: the next N requests (any kind) get ``503 Service Unavailable``.
    drop_count / drop_after: the next ``drop_count`` file bodies longer than ``drop_after``
        bytes are cut after ``drop_after`` bytes by closing the connection.
    throttle_bps: cap each body transfer at this many bytes per second.
    corrupt: names whose content is served with its first byte flipped.
    target: 503s and drops only hit requests whose path contains this ("/cdn/": file
        bodies only, not the API); empty: every request.
    ignore_range: answer ranged requests with the whole body (200), as servers without
        range support do; a resuming client must then start the file over.
    """

    fail_503: int = 0
    drop_count: int = 0
    drop_after: int = 64 * 1024
    throttle_bps: float | None = None
    corrupt: set[str] = field(default_factory=set)
    target: str = ""
    ignore_range: bool = False
    dropped: int = 0  # connections cut so far
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take_503(self, path: str) -> bool:
        with self.lock:
            if self.fail_503 > 0 and self.target in path:
                self.fail_503 -= 1
                return True
            return False

    def take_drop(self, path: str, length: int) -> int | None:
        with self.lock:
            if self.drop_count > 0 and length > self.drop_after and self.target in path:
                self.drop_count -= 1
                self.dropped += 1
                return self.drop_after
            return None


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


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


def scan_folder(root: Path, lfs_threshold: int = LFS_THRESHOLD, progress: bool = False) -> list[RepoFile]:
    """List the files under ``root`` as repo files, hashing what the hub would hash."""
    root = root.resolve()
    known = _known_hashes(root)
    found: list[tuple[str, Path, int]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            p = Path(dirpath) / name
            # a symlink may point anywhere; serve only what really lies under root
            if p.is_file() and p.resolve().is_relative_to(root):
                found.append((p.relative_to(root).as_posix(), p, p.stat().st_size))
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=sum(s for _, _, s in found), unit="B", unit_scale=True, desc="hashing", file=sys.stderr)
    files = []
    for rel, p, size in found:
        ns = p.stat().st_mtime_ns
        mtime = f"{ns // 10**9}.{ns % 10**9:09d}"
        if _is_lfs(rel, size, lfs_threshold):
            k = known.get(rel)
            if k and k[0] == size and k[1] == mtime and k[2] == "sha256":
                sha = k[3]
            else:
                sha = file_sha256(p)
            f = RepoFile(rel, size, path=p, sha256=sha)
            f.git_sha1 = git_blob_sha1(f.pointer())
        else:
            f = RepoFile(rel, size, path=p, git_sha1=git_blob_sha1(p.read_bytes()))
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
            rest = name[len(base):]
            parts = rest.split("/")
            # directories on the way to the file (all of them when recursive)
            for i in range(1, len(parts) if recursive else min(2, len(parts))):
                d = base + "/".join(parts[:i])
                entries.setdefault(d, {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d})
            if recursive or len(parts) == 1:
                f = self.files[name]
                e: dict = {"type": "file", "oid": f.git_sha1, "size": f.size, "path": name}
                if f.is_lfs:
                    e["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": len(f.pointer())}
                entries[name] = e
        return list(entries.values())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HubHTTPServer

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        if self.server.verbose:
            super().log_message(format, *args)

    # -- plumbing -------------------------------------------------------------------------
    def _record(self) -> RequestRecord:
        rec = RequestRecord(
            self.command,
            (self.headers.get("Host") or "").lower(),
            self.path,
            self.headers.get("Range"),
            "Authorization" in self.headers,
        )
        with self.server.log_lock:
            self.server.requests.append(rec)
        return rec

    def _send(self, rec: RequestRecord, status: int, body: bytes = b"", headers: dict | None = None,
              error_code: str | None = None) -> None:
        rec.status = status
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        if error_code:
            self.send_header("X-Error-Code", error_code)
            self.send_header("X-Error-Message", body.decode(errors="replace").strip())
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            rec.sent = len(body)

    def _json(self, rec: RequestRecord, obj, headers: dict | None = None) -> None:
        self._send(rec, 200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        rec = self._record()
        try:
            if self.server.faults.take_503(self.path):
                self._send(rec, 503, b"Service temporarily unavailable\n", {"Retry-After": "1"})
                return
            url = urlsplit(self.path)
            path, query = url.path, parse_qs(url.query)
            if path.startswith("/cdn/"):
                self._cdn(rec, path, query)
            elif path.startswith("/api/"):
                self._api(rec, path, query)
            else:
                self._resolve(rec, path)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _authorized(self, rec: RequestRecord) -> bool:
        token = self.server.repo.token
        if token is None:
            return True
        given = self.headers.get("Authorization", "")
        if not given:
            self._send(rec, 401, b"Access to this repo is restricted; you must be authenticated.\n",
                       error_code="GatedRepo")
            return False
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            self._send(rec, 403, b"Access to this repo is restricted; your token has no access.\n",
                       error_code="GatedRepo")
            return False
        return True

    def _split_repo(self, rec: RequestRecord, rest: str) -> str | None:
        """Strip the repo id from ``rest`` ("org/name/..."); answer 404 if it is another repo."""
        repo_id = self.server.repo.repo_id
        if rest == repo_id or rest.startswith(repo_id + "/"):
            return rest[len(repo_id):]
        self._send(rec, 404, b"Repository not found\n", error_code="RepoNotFound")
        return None

    def _revision_ok(self, rec: RequestRecord, rev: str) -> bool:
        if unquote(rev) in ("main", self.server.repo.sha):
            return True
        self._send(rec, 404, f"Invalid rev id: {unquote(rev)}\n".encode(), error_code="RevisionNotFound")
        return False

    # -- API -----------------------------------------------------------------------------
    def _api(self, rec: RequestRecord, path: str, query: dict) -> None:
        repo = self.server.repo
        kind = f"/api/{repo.repo_type}s/"
        if not path.startswith(kind):
            self._send(rec, 404, b"Repository not found\n", error_code="RepoNotFound")
            return
        rest = self._split_repo(rec, path[len(kind):])
        if rest is None or not self._authorized(rec):
            return
        blobs = query.get("blobs", ["false"])[0].lower() in ("1", "true")
        if rest in ("", "/") or rest.startswith("/revision/"):
            if rest.startswith("/revision/") and not self._revision_ok(rec, rest[len("/revision/"):]):
                return
            self._json(rec, {
                "_id": repo.sha[:24], "id": repo.repo_id, "sha": repo.sha, "private": False,
                "gated": "auto" if repo.token else False, "disabled": False, "tags": [],
                "downloads": 0, "likes": 0, "lastModified": "2026-01-01T00:00:00.000Z",
                "siblings": [repo.sibling(f, blobs) for _, f in sorted(repo.files.items())],
            })
        elif rest.startswith("/tree/") and not self.server.tree_api:
            self._send(rec, 404, b"Not found\n")
        elif rest.startswith("/tree/"):
            rev, _, sub = rest[len("/tree/"):].partition("/")
            if not self._revision_ok(rec, rev):
                return
            recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
            entries = repo.tree_entries(unquote(sub), recursive)
            start = int(query.get("cursor", ["0"])[0] or 0)
            page = self.server.tree_page_size
            headers = {}
            if start + page < len(entries):
                host = self.headers.get("Host") or f"{self.server.host}:{self.server.port}"
                base = f"http://{host}{urlsplit(self.path).path}"
                headers["Link"] = f'<{base}?recursive={str(recursive).lower()}&cursor={start + page}>; rel="next"'
            self._json(rec, entries[start:start + page], headers)
        else:
            self._send(rec, 404, b"Not found\n")

    # -- resolve and CDN -----------------------------------------------------------------
    def _resolve(self, rec: RequestRecord, path: str) -> None:
        repo = self.server.repo
        prefix = "/datasets/" if repo.repo_type == "dataset" else "/"
        if not path.startswith(prefix):
            self._send(rec, 404, b"Repository not found\n", error_code="RepoNotFound")
            return
        rest = self._split_repo(rec, path[len(prefix):])
        if rest is None:
            return
        if not rest.startswith("/resolve/"):
            self._send(rec, 404, b"Not found\n")
            return
        rev, _, name = rest[len("/resolve/"):].partition("/")
        if not self._authorized(rec) or not self._revision_ok(rec, rev):
            return
        f = repo.files.get(unquote(name))
        if f is None:
            self._send(rec, 404, b"Entry not found\n", error_code="EntryNotFound")
            return
        common = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if f.is_lfs:
            target = self.server.cdn_url(f)
            self._send(rec, 302, f"Found. Redirecting to {target}".encode(), {
                **common, "Location": target, "ETag": f'"{f.git_sha1}"',
                "X-Linked-Etag": f'"{f.sha256}"', "X-Linked-Size": f.size,
            })
        else:
            self._body(rec, f, {**common, "ETag": f'"{f.git_sha1}"'})

    def _cdn(self, rec: RequestRecord, path: str, query: dict) -> None:
        sha = path[len("/cdn/"):]
        f = self.server.repo.by_sha256.get(sha)
        sig = query.get("sig", [""])[0]
        if f is None or not hmac.compare_digest(sig, self.server.sign(sha)):
            self._send(rec, 403, b"Request has expired or signature is invalid\n")
            return
        self._body(rec, f, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"})

    def _body(self, rec: RequestRecord, f: RepoFile, headers: dict) -> None:
        start, end = 0, f.size  # [start, end)
        status = 200
        rng = self.headers.get("Range")
        if self.server.faults.ignore_range:
            rng = None
            headers = {k: v for k, v in headers.items() if k != "Accept-Ranges"}
        if rng and rng.startswith("bytes=") and "," not in rng:
            a, _, b = rng[len("bytes="):].partition("-")
            try:
                if a == "":  # suffix range: the last b bytes
                    start, end = max(f.size - int(b), 0), f.size
                else:
                    start, end = int(a), (min(int(b) + 1, f.size) if b else f.size)
            except ValueError:
                start, end = 0, f.size
            else:
                if start >= f.size or start >= end:
                    self._send(rec, 416, b"Range not satisfiable\n", {"Content-Range": f"bytes */{f.size}"})
                    return
                status = 206
                headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{f.size}"}
        rec.status = status
        length = end - start
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command == "HEAD":
            return
        faults = self.server.faults
        cut = faults.take_drop(self.path, length)
        plain = cut is None and faults.throttle_bps is None and f.rfilename not in faults.corrupt
        if plain and f.path is not None:
            with open(f.path, "rb") as fh:
                rec.sent = self.connection.sendfile(fh, start, length)
            return
        sent = 0
        began = time.monotonic()
        for chunk in self._chunks(f, start, end):
            if start + sent == 0 and f.rfilename in faults.corrupt:
                chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
            if cut is not None and sent + len(chunk) >= cut:
                self.wfile.write(chunk[: cut - sent])
                rec.sent = cut
                self.close_connection = True
                self.connection.shutdown(2)  # the client sees a short body
                return
            self.wfile.write(chunk)
            sent += len(chunk)
            rec.sent = sent
            bps = faults.throttle_bps
            if bps:
                ahead = sent / bps - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)

    def _chunks(self, f: RepoFile, start: int, end: int) -> Iterator[bytes]:
        # about 20 chunks a second when throttled, so a throttled transfer moves steadily
        bps = self.server.faults.throttle_bps
        size = min(_CHUNK, max(16 * 1024, int(bps / 20))) if bps else _CHUNK
        if f.data is not None:
            for i in range(start, end, size):
                yield f.data[i:min(i + size, end)]
            return
        assert f.path is not None
        with open(f.path, "rb") as fh:
            fh.seek(start)
            pos = start
            while pos < end:
                chunk = fh.read(min(size, end - pos))
                if not chunk:
                    return
                pos += len(chunk)
                yield chunk


class _HubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(self, addr, repo: HubRepo, redirect_host: str, faults: Faults, verbose: bool):
        super().__init__(addr, _Handler)
        self.repo = repo
        self.faults = faults
        self.verbose = verbose
        self.redirect_host = redirect_host
        self.requests: list[RequestRecord] = []
        self.log_lock = threading.Lock()
        self.tree_page_size = TREE_PAGE_SIZE
        self.tree_api = True
        self._secret = secrets.token_bytes(32)
        self.host, self.port = self.server_address[:2]

    def sign(self, sha: str) -> str:
        return hmac.new(self._secret, sha.encode(), hashlib.sha256).hexdigest()[:32]

    def cdn_url(self, f: RepoFile) -> str:
        assert f.sha256 is not None
        return f"http://{self.redirect_host}:{self.port}/cdn/{f.sha256}?sig={self.sign(f.sha256)}"


class HubServer:
    """A running hub server. Use :func:`serve_in_background` to make one."""

    def __init__(self, httpd: _HubHTTPServer):
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        self.port: int = httpd.port
        self.endpoint = f"http://{httpd.host}:{httpd.port}"

    @property
    def repo(self) -> HubRepo:
        return self._httpd.repo

    @property
    def faults(self) -> Faults:
        return self._httpd.faults

    @property
    def requests(self) -> list[RequestRecord]:
        with self._httpd.log_lock:
            return list(self._httpd.requests)

    def set_tree_page_size(self, n: int) -> None:
        self._httpd.tree_page_size = n

    def set_tree_api(self, enabled: bool) -> None:
        """Answer the tree listing with 404, as mirrors that only serve repo info do."""
        self._httpd.tree_api = enabled

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> HubServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_in_background(
    root: str | Path,
    repo_id: str,
    repo_type: str = "dataset",
    *,
    token: str | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    redirect_host: str | None = None,
    lfs_threshold: int = LFS_THRESHOLD,
    extra_files: dict[str, bytes] | None = None,
    faults: Faults | None = None,
    verbose: bool = False,
    progress: bool = False,
) -> HubServer:
    """Serve ``root`` as hub repo ``repo_id`` from a background thread; returns the server.

    ``redirect_host`` is the host name in LFS redirects (the "CDN"); by default the other
    name of the loopback address ("localhost" for 127.0.0.1), else ``host`` itself.
    ``extra_files`` adds in-memory files to the listing, names unchecked (tests use it
    for hostile names such as ``../x``).
    """
    if "/" not in repo_id or repo_id.startswith("/") or repo_id.endswith("/") or ".." in repo_id:
        raise ValueError(f"repo id must look like ORG/NAME, not {repo_id!r}")
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"not a folder: {root}")
    files = scan_folder(root, lfs_threshold, progress=progress)
    for name, data in (extra_files or {}).items():
        files.append(RepoFile(name, len(data), data=data, git_sha1=git_blob_sha1(data)))
    repo = HubRepo(repo_id, repo_type, files, token=token)
    if redirect_host is None:
        redirect_host = {"127.0.0.1": "localhost", "localhost": "127.0.0.1"}.get(host, host)
    httpd = _HubHTTPServer((host, port), repo, redirect_host, faults or Faults(), verbose)
    return HubServer(httpd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m src.hub_server",
        description="Serve a local folder as a Hugging Face hub repo, e.g. a dataset mirrored once "
        "and fed to many cluster nodes: run this on one machine, then on each node "
        "`export HF_ENDPOINT=<printed URL>` and use data/hfd.sh or huggingface_hub as usual. "
        "Files of 10 MiB or more and binary types such as *.parquet are served as LFS files "
        "(sha256 checked by clients); hashes already verified by data/hfd.sh are reused.",
        allow_abbrev=False,
    )
    p.add_argument("--root", required=True, type=Path, help="folder to serve (its files become the repo's files)")
    p.add_argument("--repo-id", required=True, help="repo id to answer to, ORG/NAME (e.g. Kaichengalex/YFCC15M)")
    p.add_argument("--repo-type", default="dataset", choices=["dataset", "model"],
                   help="default: dataset; 'model' serves weights for hf-hub:ORG/REPO in embed.py and "
                   "src.open_alip.create_model_and_transforms")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all; default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port (default 0: any free port, printed at start)")
    p.add_argument("--redirect-host", default=None,
                   help="host name clients use for LFS downloads (default: this machine's name when "
                   "--host is 0.0.0.0, else the other name of the loopback address)")
    p.add_argument("--token", default=None,
                   help="make the repo gated: clients must send this token (HUB_SERVER_TOKEN in the "
                   "environment is preferred: a command-line token is visible in `ps`)")
    p.add_argument("--port-file", type=Path, default=None,
                   help="write the endpoint URL to this file once serving (scripts can wait for it)")
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    a = p.parse_args(argv)

    if not a.root.is_dir():
        p.exit(2, f"hub_server: error: --root {a.root} is not a folder; give the folder to serve\n")
    repo_id = a.repo_id.strip()
    if repo_id.count("/") != 1 or repo_id.startswith("/") or repo_id.endswith("/") or ".." in repo_id:
        p.exit(2, f"hub_server: error: --repo-id {a.repo_id!r} must look like ORG/NAME\n")
    if not 0 <= a.port <= 65535:
        p.exit(2, f"hub_server: error: --port {a.port} is out of range 0-65535\n")
    token = a.token or os.environ.get("HUB_SERVER_TOKEN") or None
    redirect_host = a.redirect_host
    if redirect_host is None and a.host in ("0.0.0.0", "", "::"):
        import socket

        redirect_host = socket.getfqdn()
    try:
        server = serve_in_background(a.root, repo_id, a.repo_type, token=token, host=a.host, port=a.port,
                                     redirect_host=redirect_host, verbose=a.verbose, progress=True)
    except OSError as e:
        p.exit(1, f"hub_server: error: cannot listen on {a.host}:{a.port}: {e.strerror}; pick another --port\n")
    endpoint = server.endpoint
    if a.host in ("0.0.0.0", "", "::"):
        endpoint = f"http://{redirect_host}:{server.port}"
    n = len(server.repo.files)
    total = sum(f.size for f in server.repo.files.values())
    print(f"Serving {a.repo_type} {repo_id} ({n} files, {total / 1e9:.2f} GB{', gated' if token else ''}) "
          f"from {a.root.resolve()}", flush=True)
    print(f"Endpoint: {endpoint}\n  export HF_ENDPOINT={endpoint}", flush=True)
    if a.port_file:
        atomic_write_text(a.port_file, endpoint + "\n")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
