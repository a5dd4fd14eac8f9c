"""Answering one HTTP request the way the hub does: repo info, the paginated tree, ``resolve``
(a 302 to the "CDN" for LFS files) and the CDN's ranged file bodies.

:class:`HubHandler` is what a server runs per request. Subclasses may change how requests
are met through three methods (tests/_hub_faults.py injects failures this way, and
benchmarks/download.py caps the transfer rate): :meth:`HubHandler.intercept` answers a
request before it is routed, :attr:`HubHandler.supports_ranges` turns range support off,
and :meth:`HubHandler.send_body` writes a file's body.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, unquote, urlsplit

from .repo import RepoFile

if TYPE_CHECKING:
    from .server import HubHTTPServer

CHUNK = 1 << 20
_BYTE_RANGE = re.compile(r"([0-9]*)-([0-9]*)", re.ASCII)


class RangeNotSatisfiable(ValueError):
    """A valid byte range that lies wholly past the end of the file (answered with 416)."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The ``[start, end)`` of a file of ``size`` bytes that a Range header asks for.

    None means: send the whole file (200). That is the answer to no header, to a unit
    other than bytes, to a header that is not valid syntax (``bytes=5-3``, ``bytes=x-``)
    and to several ranges (multipart answers are not implemented; RFC 9110 §14.2 lets a
    server ignore Range). A single valid range that starts at or past the end, or a suffix
    range of zero bytes, raises RangeNotSatisfiable (416, RFC 9110 §14.1.1).
    """
    if header is None:
        return None
    unit, eq, ranges = header.strip().partition("=")
    if not eq or unit.strip().lower() != "bytes":
        return None
    specs = [s.strip() for s in ranges.split(",") if s.strip()]  # empty list elements are allowed
    if len(specs) != 1:
        return None
    m = _BYTE_RANGE.fullmatch(specs[0])
    if m is None or m.group(1) == m.group(2) == "":
        return None
    first, last = m.group(1), m.group(2)
    if first == "":  # suffix range: the last N bytes
        n = int(last)
        if n == 0:
            raise RangeNotSatisfiable(header)
        # an empty file has no byte to name in a Content-Range: send it whole
        return (max(size - n, 0), size) if size else None
    start = int(first)
    if last and int(last) < start:
        return None  # invalid, so ignored (not unsatisfiable)
    if start >= size:
        raise RangeNotSatisfiable(header)
    return start, (min(int(last) + 1, size) if last else size)


def parse_cursor(value: str) -> int | None:
    """A tree page's cursor (the offset our Link headers carry); None if it is not one (not a
    number, or one of more digits than any listing has entries: int() refuses 4300 of them)."""
    return int(value) if value.isascii() and value.isdigit() and len(value) <= 18 else None


class BadRequest(ValueError):
    """A request no hub could answer (a name that is not UTF-8, a control character): 400."""


def path_part(text: str, what: str) -> str:
    """A percent-decoded part of a request path; BadRequest if it is not UTF-8 text without
    control characters (a line break would also end up in the error header)."""
    try:
        value = unquote(text, errors="strict")
    except UnicodeDecodeError:
        raise BadRequest(f"{what} is not UTF-8 text") from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        raise BadRequest(f"{what} holds a control character")
    return value


def header_text(text: str) -> str:
    """`text` as one header line: whitespace runs as one space, what latin-1 lacks as escapes."""
    return " ".join(text.split()).encode("ascii", "backslashreplace").decode("ascii")


@dataclass
class RequestRecord:
    method: str
    host: str
    path: str
    range: str | None
    authorization: bool
    status: int = 0
    sent: int = 0  # body bytes written (tests use it to see that a resume did not start over)


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HubHTTPServer

    # -- hooks for subclasses ----------------------------------------------------------------
    def intercept(self, rec: RequestRecord) -> bool:
        """Answer the request before routing; True when answered. The hub answers none here."""
        return False

    @property
    def supports_ranges(self) -> bool:
        """False: ignore Range and leave out Accept-Ranges, as servers without range support do."""
        return True

    def send_body(self, rec: RequestRecord, f: RepoFile, start: int, end: int) -> None:
        """Write bytes [start, end) of ``f`` after the headers."""
        if f.path is not None:
            with open(f.path, "rb") as fh:
                rec.sent = self.connection.sendfile(fh, start, end - start)
        else:
            self.write_chunks(rec, self.body_chunks(f, start, end))

    # -- helpers for send_body ---------------------------------------------------------------
    def body_chunks(self, f: RepoFile, start: int, end: int, size: int = CHUNK) -> Iterator[bytes]:
        if f.data is not None:
            for i in range(start, end, size):
                yield f.data[i : min(i + size, end)]
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

    def write_chunks(self, rec: RequestRecord, chunks: Iterable[bytes]) -> None:
        for chunk in chunks:
            self.wfile.write(chunk)
            rec.sent += len(chunk)

    # -- plumbing ----------------------------------------------------------------------------
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - stdlib signature
        if self.server.verbose:
            super().log_message(format, *args)

    def _send(
        self,
        rec: RequestRecord,
        status: int,
        body: bytes = b"",
        headers: dict | None = None,
        error_code: str | None = None,
    ) -> None:
        rec.status = status
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, str(v))
        if error_code:
            self.send_header("X-Error-Code", error_code)
            self.send_header("X-Error-Message", header_text(body.decode(errors="replace")))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
            rec.sent = len(body)

    def _json(self, rec: RequestRecord, obj, headers: dict | None = None) -> None:
        self._send(
            rec, 200, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})}
        )

    def do_HEAD(self) -> None:
        self._dispatch()

    def do_GET(self) -> None:
        self._dispatch()

    def _dispatch(self) -> None:
        rec = RequestRecord(
            self.command,
            (self.headers.get("Host") or "").lower(),
            self.path,
            self.headers.get("Range"),
            "Authorization" in self.headers,
        )
        self.server.log_request_record(rec)
        try:
            if self.intercept(rec):
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
        except BadRequest as exc:
            self._refuse(rec, 400, f"Bad request: {exc}", "BadRequest")
        except Exception as exc:  # a fault of ours: one line in the log and the answer, no traceback
            BaseHTTPRequestHandler.log_message(
                self,
                "error answering %s %s: %s: %s",
                self.command,
                header_text(self.path)[:200],
                type(exc).__name__,
                header_text(str(exc))[:200],
            )
            self._refuse(rec, 500, f"Internal error ({type(exc).__name__})", "InternalError")

    def _refuse(self, rec: RequestRecord, status: int, message: str, code: str) -> None:
        """Answer with one line, or, where an answer has begun, end the connection: a client must
        never wait for bytes that will not come."""
        if rec.status:
            self.close_connection = True
            return
        try:
            self._send(rec, status, f"{message}\n".encode(), error_code=code)
        except OSError:
            self.close_connection = True

    def _authorized(self, rec: RequestRecord) -> bool:
        token = self.server.repo.token
        if token is None:
            return True
        given = self.headers.get("Authorization", "")
        if not given:
            self._send(
                rec,
                401,
                b"Access to this repo is restricted; you must be authenticated.\n",
                error_code="GatedRepo",
            )
            return False
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            self._send(
                rec,
                403,
                b"Access to this repo is restricted; your token has no access.\n",
                error_code="GatedRepo",
            )
            return False
        return True

    def _split_repo(self, rec: RequestRecord, rest: str) -> str | None:
        """Strip the repo id from ``rest`` ("org/name/..."); answer 404 if it is another repo."""
        repo_id = self.server.repo.repo_id
        if rest == repo_id or rest.startswith(repo_id + "/"):
            return rest[len(repo_id) :]
        self._send(rec, 404, b"Repository not found\n", error_code="RepoNotFound")
        return None

    def _revision_ok(self, rec: RequestRecord, rev: str) -> bool:
        rev = path_part(rev, "the revision")
        if rev in ("main", self.server.repo.sha):
            return True
        self._send(rec, 404, f"Invalid rev id: {rev}\n".encode(), error_code="RevisionNotFound")
        return False

    # -- API ---------------------------------------------------------------------------------
    def _api(self, rec: RequestRecord, path: str, query: dict) -> None:
        repo = self.server.repo
        kind = f"/api/{repo.repo_type}s/"
        if not path.startswith(kind):
            self._send(rec, 404, b"Repository not found\n", error_code="RepoNotFound")
            return
        rest = self._split_repo(rec, path[len(kind) :])
        if rest is None or not self._authorized(rec):
            return
        if rest in ("", "/") or rest.startswith("/revision/"):
            if rest.startswith("/revision/") and not self._revision_ok(rec, rest[len("/revision/") :]):
                return
            self._json(rec, repo.info(blobs=_flag(query, "blobs")))
        elif rest.startswith("/tree/") and self.server.tree_api:
            self._tree(rec, rest[len("/tree/") :], query)
        else:
            self._send(rec, 404, b"Not found\n")

    def _tree(self, rec: RequestRecord, rest: str, query: dict) -> None:
        rev, _, sub = rest.partition("/")
        if not self._revision_ok(rec, rev):
            return
        given = query.get("cursor", [""])[0]
        start = parse_cursor(given or "0")
        if start is None:
            self._send(
                rec,
                400,
                f"Invalid cursor {given!r}: give the cursor of the previous page's Link header\n".encode(),
                error_code="BadRequest",
            )
            return
        recursive = _flag(query, "recursive")
        entries = self.server.repo.tree_entries(path_part(sub, "the folder"), recursive)
        page = self.server.tree_page_size
        headers = {}
        if start + page < len(entries):
            host = self.headers.get("Host") or f"{self.server.host}:{self.server.port}"
            base = f"http://{host}{urlsplit(self.path).path}"
            headers["Link"] = f'<{base}?recursive={str(recursive).lower()}&cursor={start + page}>; rel="next"'
        self._json(rec, entries[start : start + page], headers)

    # -- resolve and CDN ---------------------------------------------------------------------
    def _resolve(self, rec: RequestRecord, path: str) -> None:
        repo = self.server.repo
        prefix = "/datasets/" if repo.repo_type == "dataset" else "/"
        if not path.startswith(prefix):
            self._send(rec, 404, b"Repository not found\n", error_code="RepoNotFound")
            return
        rest = self._split_repo(rec, path[len(prefix) :])
        if rest is None:
            return
        if not rest.startswith("/resolve/"):
            self._send(rec, 404, b"Not found\n")
            return
        rev, _, name = rest[len("/resolve/") :].partition("/")
        if not self._authorized(rec) or not self._revision_ok(rec, rev):
            return
        f = repo.files.get(path_part(name, "the file name"))
        if f is None:
            self._send(rec, 404, b"Entry not found\n", error_code="EntryNotFound")
            return
        common = {"X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        if f.is_lfs:
            target = self.server.cdn_url(f)
            self._send(
                rec,
                302,
                f"Found. Redirecting to {target}".encode(),
                {
                    **common,
                    "Location": target,
                    "ETag": f'"{f.git_sha1}"',
                    "X-Linked-Etag": f'"{f.sha256}"',
                    "X-Linked-Size": f.size,
                },
            )
        else:
            self._body(rec, f, {**common, "ETag": f'"{f.git_sha1}"'})

    def _cdn(self, rec: RequestRecord, path: str, query: dict) -> None:
        sha = path[len("/cdn/") :]
        f = self.server.repo.by_sha256.get(sha)
        sig = query.get("sig", [""])[0]
        if f is None or not hmac.compare_digest(sig, self.server.sign(sha)):
            self._send(rec, 403, b"Request has expired or signature is invalid\n")
            return
        self._body(
            rec, f, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        )

    def _body(self, rec: RequestRecord, f: RepoFile, headers: dict) -> None:
        # The size on disk now, not at start: a file changed since must never be promised at its old
        # length (the client would wait for bytes that never come), a deleted one not at all.
        size = f.size
        if f.path is not None:
            try:
                st = os.stat(f.path)
            except OSError:
                st = None
            if st is None or not stat.S_ISREG(st.st_mode):
                self._send(
                    rec,
                    404,
                    f"Entry not found: {f.rfilename} is no longer on the server's disk\n".encode(),
                    error_code="EntryNotFound",
                )
                return
            size = st.st_size
        span = None
        if not self.supports_ranges:
            headers = {k: v for k, v in headers.items() if k != "Accept-Ranges"}
        else:
            try:
                span = parse_range(self.headers.get("Range"), size)
            except RangeNotSatisfiable:
                self._send(rec, 416, b"Range not satisfiable\n", {"Content-Range": f"bytes */{size}"})
                return
        start, end = span or (0, size)
        status = 206 if span else 200
        if span:
            headers = {**headers, "Content-Range": f"bytes {start}-{end - 1}/{size}"}
        rec.status = status
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, str(v))
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if self.command != "HEAD":
            self.send_body(rec, f, start, end)
            if rec.sent < end - start:  # the file shrank while sent: end it, so the client sees it short
                self.close_connection = True


def _flag(query: dict, name: str) -> bool:
    return query.get(name, ["false"])[0].lower() in ("1", "true")
