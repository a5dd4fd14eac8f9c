"""Serve a local folder as a Hugging Face hub repository.

Used as a mirror for a cluster (download a dataset once, then point every node's
``HF_ENDPOINT`` at this server: ``python -m src.open_alip.hub_server --help``), and by the tests and
benchmarks as a local stand-in for the hub.

The server implements the part of the hub API that downloaders use (docs/formats.md §4):
repo info (``?blobs=true``), the paginated tree listing, and ``resolve`` URLs. LFS files
answer ``resolve`` with a 302 to a signed "CDN" URL on a second host name, like the real
hub, so clients must handle cross-host redirects and must not forward their token.

    repo.py     which files a folder holds and the ids the hub gives them
    handler.py  one request: routing, the API answers, byte ranges (`parse_range`)
    server.py   the threaded HTTP server and `serve_in_background`
    __main__.py the command line

Python API::

    with serve_in_background(root, "org/name", repo_type="dataset") as server:
        os.environ["HF_ENDPOINT"] = server.endpoint
        ...
        server.requests                   # what clients asked for (method, host, path, ...)
"""

from .handler import HubHandler, RangeNotSatisfiable, RequestRecord, parse_range
from .repo import LFS_SUFFIXES, LFS_THRESHOLD, HubRepo, RepoFile, scan_folder
from .server import REQUEST_LOG_SIZE, HubServer, listen, load_repo, serve_in_background

__all__ = [
    "LFS_SUFFIXES",
    "LFS_THRESHOLD",
    "REQUEST_LOG_SIZE",
    "HubHandler",
    "HubRepo",
    "HubServer",
    "RangeNotSatisfiable",
    "RepoFile",
    "RequestRecord",
    "listen",
    "load_repo",
    "parse_range",
    "scan_folder",
    "serve_in_background",
]
