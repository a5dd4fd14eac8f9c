"""Fault injection for the hub server (src/open_alip/hub_server): dropped connections, 503s, throttling,
corrupt bodies and a server without range support, changed by tests while it runs.

    faults = Faults(target="/cdn/", fail_503=2)
    with serve_with_faults(root, "org/name", faults) as server:
        faults.throttle_bps = 150_000     # read per request and per chunk
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.download import ThrottledHandler, throttled_chunk
from src.open_alip.hub_server import HubServer, RepoFile, RequestRecord, serve_in_background
from src.open_alip.hub_server.handler import CHUNK


@dataclass
class Faults:
    """What goes wrong, per request (reads are per request or chunk).

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


class FaultyHandler(ThrottledHandler):
    """The hub's handler with `faults` applied (bound per server by `serve_with_faults`)."""

    faults: Faults

    def bps(self) -> float | None:
        return self.faults.throttle_bps

    def intercept(self, rec: RequestRecord) -> bool:
        if self.faults.take_503(self.path):
            self._send(rec, 503, b"Service temporarily unavailable\n", {"Retry-After": "1"})
            return True
        return False

    @property
    def supports_ranges(self) -> bool:
        return not self.faults.ignore_range

    def send_body(self, rec: RequestRecord, f: RepoFile, start: int, end: int) -> None:
        faults = self.faults
        cut = faults.take_drop(self.path, end - start)
        corrupt = start == 0 and f.rfilename in faults.corrupt
        if cut is None and not corrupt:
            super().send_body(rec, f, start, end)
            return
        bps = self.bps()
        chunks = self.body_chunks(f, start, end, throttled_chunk(bps) if bps else CHUNK)
        if corrupt:
            chunks = _flip_first_byte(chunks)
        if cut is not None:
            chunks = _first_bytes(chunks, cut)
        self.write_chunks(rec, self.paced(chunks))
        if cut is not None:
            self.close_connection = True
            self.connection.shutdown(2)  # the client sees a short body


def _flip_first_byte(chunks: Iterator[bytes]) -> Iterator[bytes]:
    first = next(chunks, b"")
    if first:
        yield bytes([first[0] ^ 0xFF]) + first[1:]
    yield from chunks


def _first_bytes(chunks: Iterator[bytes], n: int) -> Iterator[bytes]:
    for chunk in chunks:
        if len(chunk) >= n:
            yield chunk[:n]
            return
        n -= len(chunk)
        yield chunk


def serve_with_faults(
    root: str | Path, repo_id: str, faults: Faults, repo_type: str = "dataset", **kwargs
) -> HubServer:
    """`serve_in_background` whose requests go through `faults`."""
    handler = type("BoundFaultyHandler", (FaultyHandler,), {"faults": faults})
    return serve_in_background(root, repo_id, repo_type, handler=handler, **kwargs)
