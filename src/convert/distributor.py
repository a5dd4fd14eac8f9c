"""Spread chunks of items over worker processes and hand the results back in input order.

Ordered results make the output independent of timing and of the worker count. At
most `window` chunks are in flight, so memory stays flat however long the input is
(Pool.imap would read the whole input ahead).
"""

from __future__ import annotations

import multiprocessing
import queue
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from itertools import islice

from src.errors import UserError

from .items import Item, Result
from .worker import WorkerConfig, init_worker, is_light, process_chunk


class WorkerCrashed(UserError):
    """A worker process died (e.g. a decoder crashed on a hostile file or memory ran out)."""


def chunked(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


def prefetch(chunks: Iterable[list[Item]], depth: int = 8) -> Iterator[list[Item]]:
    """Read ahead in a thread: parquet decoding and file reads release the GIL, so reading
    the input overlaps with packing and writing in this process."""
    q: queue.Queue = queue.Queue(depth)
    stop = threading.Event()
    done = object()

    def feed() -> None:
        try:
            for chunk in chunks:
                while not stop.is_set():
                    try:
                        q.put(chunk, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(done)
        except BaseException as exc:  # handed to the consumer, raised there
            q.put(exc)

    thread = threading.Thread(target=feed, name="data2rec-reader", daemon=True)
    thread.start()
    try:
        while (chunk := q.get()) is not done:
            if isinstance(chunk, BaseException):
                raise chunk
            yield chunk
    finally:
        stop.set()
        thread.join(timeout=5)


def ordered_map(
    chunks: Iterable[list[Item]], config: WorkerConfig, workers: int, window_per_worker: int = 4
) -> Iterator[tuple[list[Item], list[Result]]]:
    """process_chunk over `chunks`, in order; in this process when workers <= 1.

    Light chunks (see `is_light`) are done here too, queued in order among the others.
    """
    if workers <= 1:
        init_worker(config)
        for chunk in chunks:
            yield chunk, process_chunk(chunk)
        return
    window = workers * window_per_worker
    pending: deque[tuple[list[Item], Future]] = deque()
    pool: ProcessPoolExecutor | None = None  # started at the first chunk that is not light
    try:
        init_worker(config)
        for chunk in chunks:
            if is_light(chunk, config):
                done: Future = Future()
                done.set_result(process_chunk(chunk))
                pending.append((chunk, done))
            else:
                pool = pool or _start_pool(config, workers)
                for item in chunk:  # a view cannot be pickled
                    if isinstance(item.image, memoryview):
                        item.image = bytes(item.image)
                pending.append((chunk, pool.submit(process_chunk, chunk)))
            if len(pending) >= window:
                chunk, fut = pending.popleft()
                yield chunk, fut.result()
        while pending:
            chunk, fut = pending.popleft()
            yield chunk, fut.result()
    except BrokenProcessPool as exc:
        _stop(pool)
        raise WorkerCrashed(f"a worker process died ({exc}); rerun the same command to resume") from None
    except BaseException:  # Ctrl-C, SIGTERM, an error downstream: workers may be mid-chunk or blocked
        _stop(pool)
        raise
    if pool is not None:
        pool.shutdown(wait=True)


def _start_pool(config: WorkerConfig, workers: int) -> ProcessPoolExecutor:
    """The worker pool. forkserver: workers start from a clean process, not a fork of a parent
    that may hold threads (pyarrow, DALI) in the middle of something. Started from the thread that
    consumes ordered_map, the main thread, because the forkserver dies when the thread that
    started it ends (see processes.py)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["src.convert.forkserver_guard", "src.convert.worker"])
    from multiprocessing import forkserver

    forkserver.ensure_running()
    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker, initargs=(config, True))


def _stop(pool: ProcessPoolExecutor | None) -> None:
    """End the pool now: waiting for running chunks could take forever (a worker blocked
    reading a hung network file), and their results are not wanted."""
    if pool is None:
        return
    processes = list((getattr(pool, "_processes", None) or {}).values())  # where CPython keeps them
    for proc in processes:
        if proc.is_alive():
            proc.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
