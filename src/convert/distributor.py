"""Spread chunks of items over worker processes and hand the results back in input order.

Ordered results make the output independent of timing and of the worker count. At
most `window` chunks are in flight, so memory stays flat however long the input is
(Pool.imap would read the whole input ahead).
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import islice

from .items import Item, Result
from .worker import WorkerConfig, init_worker, process_chunk


class WorkerCrashed(RuntimeError):
    """A worker process died (e.g. a decoder crashed on a hostile file or memory ran out)."""


def chunked(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def ordered_map(
    chunks: Iterable[list[Item]], config: WorkerConfig, workers: int, window_per_worker: int = 4
) -> Iterator[list[Result]]:
    """process_chunk over `chunks`, in order; in this process when workers <= 1."""
    if workers <= 1:
        init_worker(config)
        for chunk in chunks:
            yield process_chunk(chunk)
        return
    # forkserver: workers start from a clean process, not a fork of a parent that may
    # hold threads (pyarrow, DALI) in the middle of something.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["src.convert.worker"])
    window = workers * window_per_worker
    pending: deque[Future] = deque()
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker, initargs=(config,)) as pool:
        try:
            for chunk in chunks:
                pending.append(pool.submit(process_chunk, chunk))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool as exc:
            raise WorkerCrashed(f"a worker process died ({exc}); rerun the same command to resume") from None
        finally:
            for fut in pending:
                fut.cancel()
