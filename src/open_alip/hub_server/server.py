"""The HTTP server around one :class:`~src.open_alip.hub_server.repo.HubRepo`, run from a thread."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import threading
from collections import deque
from http.server import ThreadingHTTPServer
from pathlib import Path

from .handler import HubHandler, RequestRecord
from .repo import LFS_THRESHOLD, HubRepo, RepoFile, scan_folder

TREE_PAGE_SIZE = 1000
# Requests remembered for `HubServer.requests`: enough to inspect a test's or a download's
# traffic, bounded so that a mirror serving for weeks does not grow without end.
REQUEST_LOG_SIZE = 10_000


class HubHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    repo: HubRepo  # set by HubServer before the first request is answered

    def __init__(
        self,
        addr: tuple[str, int],
        redirect_host: str,
        verbose: bool,
        handler: type[HubHandler] = HubHandler,
        log_size: int = REQUEST_LOG_SIZE,
    ):
        # IPv6 literals (::, ::1) need an IPv6 socket; names and IPv4 addresses an IPv4 one
        self.address_family = socket.AF_INET6 if ":" in addr[0] else socket.AF_INET
        super().__init__(addr, handler)
        self.verbose = verbose
        self.redirect_host = redirect_host
        self.requests: deque[RequestRecord] = deque(maxlen=log_size)
        self.log_lock = threading.Lock()
        self.tree_page_size = TREE_PAGE_SIZE
        self.tree_api = True
        self._secret = secrets.token_bytes(32)
        self.host, self.port = self.server_address[:2]

    def log_request_record(self, rec: RequestRecord) -> None:
        with self.log_lock:
            self.requests.append(rec)

    def sign(self, sha: str) -> str:
        return hmac.new(self._secret, sha.encode(), hashlib.sha256).hexdigest()[:32]

    def cdn_url(self, f: RepoFile) -> str:
        assert f.sha256 is not None
        return f"http://{_url_host(self.redirect_host)}:{self.port}/cdn/{f.sha256}?sig={self.sign(f.sha256)}"


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


SHUTDOWN_POLL_S = 0.05


class HubServer:
    """A running hub server. Use :func:`serve_in_background` to make one."""

    def __init__(self, httpd: HubHTTPServer, repo: HubRepo):
        httpd.repo = repo
        self._httpd = httpd
        # shutdown() waits for the serving loop's next poll: 0.5 s by default, paid by every stop.
        self._thread = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": SHUTDOWN_POLL_S},
            name="hub-server",
            daemon=True,
        )
        self._thread.start()
        self.port: int = httpd.port
        self.endpoint = f"http://{_url_host(httpd.host)}:{httpd.port}"

    @property
    def repo(self) -> HubRepo:
        return self._httpd.repo

    @property
    def requests(self) -> list[RequestRecord]:
        """The latest requests (at most the server's log size), oldest first."""
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


def check_repo_id(repo_id: str) -> bool:
    return (
        repo_id.count("/") == 1
        and not repo_id.startswith("/")
        and not repo_id.endswith("/")
        and ".." not in repo_id
    )


def load_repo(
    root: str | Path,
    repo_id: str,
    repo_type: str = "dataset",
    *,
    token: str | None = None,
    lfs_threshold: int = LFS_THRESHOLD,
    extra_files: dict[str, bytes] | None = None,
    progress: bool = False,
) -> HubRepo:
    """The repo ``repo_id`` made of the files under ``root`` (hashed here) and ``extra_files``."""
    if not check_repo_id(repo_id):
        raise ValueError(f"repo id must look like ORG/NAME, not {repo_id!r}")
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"not a folder: {root}")
    files = scan_folder(root, lfs_threshold, progress=progress)
    files += [RepoFile.in_memory(name, data) for name, data in (extra_files or {}).items()]
    return HubRepo(repo_id, repo_type, files, token=token)


def listen(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    redirect_host: str | None = None,
    handler: type[HubHandler] = HubHandler,
    verbose: bool = False,
    log_size: int = REQUEST_LOG_SIZE,
) -> HubHTTPServer:
    """A server listening on ``host``:``port`` (OSError if it cannot), to be given its repo by
    :class:`HubServer`; connections wait until then. Listening first lets a mirror fail on a
    bad address before it hashes a large folder.

    ``redirect_host`` is the host name in LFS redirects (the "CDN"); by default the other
    name of the loopback address ("localhost" for 127.0.0.1), else ``host`` itself.
    ``handler`` answers each request (a HubHandler subclass may change how, see handler.py).
    """
    if redirect_host is None:
        redirect_host = {"127.0.0.1": "localhost", "localhost": "127.0.0.1"}.get(host, host)
    return HubHTTPServer((host, port), redirect_host, verbose, handler, log_size)


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
    handler: type[HubHandler] = HubHandler,
    verbose: bool = False,
    progress: bool = False,
    log_size: int = REQUEST_LOG_SIZE,
) -> HubServer:
    """Serve ``root`` as hub repo ``repo_id`` from a background thread; returns the server.

    ``extra_files`` adds in-memory files to the listing, names unchecked (tests use it
    for hostile names such as ``../x``). The other arguments are those of
    :func:`load_repo` and :func:`listen`.
    """
    repo = load_repo(
        root,
        repo_id,
        repo_type,
        token=token,
        lfs_threshold=lfs_threshold,
        extra_files=extra_files,
        progress=progress,
    )
    httpd = listen(
        host, port, redirect_host=redirect_host, handler=handler, verbose=verbose, log_size=log_size
    )
    return HubServer(httpd, repo)
