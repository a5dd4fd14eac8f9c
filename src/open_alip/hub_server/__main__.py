"""Serve a folder as a hub repo until Ctrl-C: `rwkv-clip-hub-server` once the package is installed,
`python -m src.open_alip.hub_server` in the repository."""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
import time
from pathlib import Path

from .server import HubServer, check_repo_id, listen, load_repo

# The name --help and the errors show: the console script's, or the module's in the repository.
SCRIPT = "rwkv-clip-hub-server"
_ALL_ADDRESSES = ("0.0.0.0", "", "::")


def build_parser(prog: str = SCRIPT) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve a local folder as a Hugging Face hub repo, e.g. a dataset mirrored once "
        "and fed to many cluster nodes: run this on one machine, then on each node "
        "`export HF_ENDPOINT=<printed URL>` and use data/hfd.sh or huggingface_hub as usual. "
        "Files of 10 MiB or more and binary types such as *.parquet are served as LFS files "
        "(sha256 checked by clients); hashes already verified by data/hfd.sh are reused.",
        allow_abbrev=False,
    )
    p.add_argument(
        "--root", required=True, type=Path, help="folder to serve (its files become the repo's files)"
    )
    p.add_argument(
        "--repo-id", required=True, help="repo id to answer to, ORG/NAME (e.g. Kaichengalex/YFCC15M)"
    )
    p.add_argument(
        "--repo-type",
        default="dataset",
        choices=["dataset", "model"],
        help="default: dataset; 'model' serves weights for hf-hub:ORG/REPO in embed.py and "
        "open_alip.create_model_and_transforms",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all; default 127.0.0.1)"
    )
    p.add_argument("--port", type=int, default=0, help="port (default 0: any free port, printed at start)")
    p.add_argument(
        "--redirect-host",
        default=None,
        help="host name clients use for LFS downloads (default: this machine's name when "
        "--host is 0.0.0.0, else the other name of the loopback address)",
    )
    p.add_argument(
        "--token",
        default=None,
        help="make the repo gated: clients must send this token (HUB_SERVER_TOKEN in the "
        "environment is preferred: a command-line token is visible in `ps`)",
    )
    p.add_argument(
        "--port-file",
        type=Path,
        default=None,
        help="write the endpoint URL to this file once serving (scripts can wait for it)",
    )
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    return p


def _input_problem(a: argparse.Namespace) -> str | None:
    if not a.root.is_dir():
        return f"--root {a.root} is not a folder; give the folder to serve"
    if not check_repo_id(a.repo_id.strip()):
        return f"--repo-id {a.repo_id!r} must look like ORG/NAME"
    if not 0 <= a.port <= 65535:
        return f"--port {a.port} is out of range 0-65535"
    if a.port_file is not None and not a.port_file.parent.is_dir():
        return (
            f"--port-file {a.port_file}: folder {a.port_file.parent} does not exist; create it or give "
            "another path"
        )
    return None


def _listen_problem(exc: OSError, host: str, port: int) -> str:
    """What to change when the server cannot listen on host:port."""
    if isinstance(exc, socket.gaierror):
        return (
            f"cannot resolve --host {host!r} ({exc.strerror}); give a name or address of this machine "
            "(0.0.0.0 for all of them, 127.0.0.1 for this machine only)"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"--host {host} is not an address of this machine; give one of its addresses, or 0.0.0.0 for all"
        )
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} on {host} is in use; pick another --port (0: any free port)"
    if exc.errno == errno.EACCES:
        return f"no permission to listen on port {port}; pick a --port of 1024 or more (0: any free port)"
    return f"cannot listen on {host}:{port}: {exc.strerror or exc}"


def _start(a: argparse.Namespace, repo_id: str, token: str | None) -> tuple[HubServer | None, str]:
    """The running server and its endpoint, or None and the one-line problem."""
    redirect_host = a.redirect_host
    if redirect_host is None and a.host in _ALL_ADDRESSES:
        redirect_host = socket.getfqdn()
    try:
        httpd = listen(a.host, a.port, redirect_host=redirect_host, verbose=a.verbose)
    except OSError as exc:
        return None, _listen_problem(exc, a.host, a.port)
    try:
        repo = load_repo(a.root, repo_id, a.repo_type, token=token, progress=True)
    except OSError as exc:
        httpd.server_close()
        return None, f"cannot read {exc.filename or a.root}: {exc.strerror or exc}"
    server = HubServer(httpd, repo)
    endpoint = f"http://{redirect_host}:{server.port}" if a.host in _ALL_ADDRESSES else server.endpoint
    return server, endpoint


def _write_port_file(path: Path, endpoint: str) -> None:
    """Whole or not at all: a script waiting for the file never reads half a URL."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(endpoint + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: list[str] | None = None, prog: str = SCRIPT) -> int:
    p = build_parser(prog)
    a = p.parse_args(argv)
    problem = _input_problem(a)
    if problem:
        p.exit(2, f"{prog}: error: {problem}\n")
    repo_id = a.repo_id.strip()
    token = a.token or os.environ.get("HUB_SERVER_TOKEN") or None
    server, endpoint = _start(a, repo_id, token)
    if server is None:
        p.exit(1, f"{prog}: error: {endpoint}\n")
    try:
        n = len(server.repo.files)
        total = sum(f.size for f in server.repo.files.values())
        print(
            f"Serving {a.repo_type} {repo_id} ({n} files, {total / 1e9:.2f} GB{', gated' if token else ''}) "
            f"from {a.root.resolve()}",
            flush=True,
        )
        print(f"Endpoint: {endpoint}\n  export HF_ENDPOINT={endpoint}", flush=True)
        if a.port_file:
            try:
                _write_port_file(a.port_file, endpoint)
            except OSError as exc:
                p.exit(1, f"{prog}: error: cannot write --port-file {a.port_file}: {exc.strerror or exc}\n")
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(prog=f"python -m {__spec__.parent}"))
