"""Throughput of src/recordio.py against baselines measured in the same run.

Baselines: a plain write/read of the same payload bytes (the ceiling any
writer can reach), a straightforward pure-Python writer that checks every
4-byte word for the magic (what the fast path avoids), and optionally real
MXNet 1.9.1 (`--mxnet-python .cache/venvs/mxnet/bin/python`).

    .venv/bin/python -m benchmarks.recordio_throughput [--records 1000] [--size 45000]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.oracles import reference_encode
from src import recordio
from src.recordio import MAGIC_BYTES as MAGIC

_MXNET_WRITER = r"""
import sys, time
from mxnet import recordio as R
blob, sizes, out = sys.argv[1], sys.argv[2], sys.argv[3]
data = open(blob, "rb").read()
sizes = [int(s) for s in open(sizes).read().split()]
best = float("inf")
for _ in range(int(sys.argv[4])):
    t = time.perf_counter()
    w = R.MXIndexedRecordIO(out + ".idx", out, "w")
    pos = 0
    for i, n in enumerate(sizes):
        w.write_idx(i, data[pos:pos + n])
        pos += n
    w.close()
    best = min(best, time.perf_counter() - t)
print(best)
"""


def make_payloads(count: int, size: int, seed: int = 0) -> list[bytes]:
    """JPEG-sized random payloads; every tenth holds an aligned magic word, as real data does."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        buf = bytearray(rng.integers(0, 256, size + int(rng.integers(-size // 4, size // 4)), dtype=np.uint8))
        if i % 10 == 0:
            at = int(rng.integers(0, len(buf) // 4 - 1)) * 4
            buf[at : at + 4] = MAGIC
        out.append(bytes(buf))
    return out


def naive_write(path: str, records: list[bytes]) -> None:
    """The simple way: look at every aligned word in Python (the spec read literally)."""
    with open(path, "wb") as f:
        for data in records:
            f.write(reference_encode(data))  # with its padding


def best_of(repeats: int, fn) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    ap.add_argument("--records", type=int, default=1000, help="records to write (default 1000)")
    ap.add_argument("--size", type=int, default=45000, help="mean payload bytes (default 45000, a YFCC JPEG)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per measurement; the best is kept")
    ap.add_argument("--index-lines", type=int, default=1_000_000, help="lines in the read_index test")
    ap.add_argument("--mxnet-python", help="python of a venv with mxnet==1.9.1, to compare against")
    args = ap.parse_args()
    if args.records < 1 or args.size < 8 or args.repeats < 1:
        ap.error("--records, --repeats must be >= 1 and --size >= 8")

    records = make_payloads(args.records, args.size)
    total = sum(len(r) for r in records)
    mb = total / 1e6
    tmp = tempfile.mkdtemp(prefix="bench_recordio_")
    try:
        rec, idx, raw = (os.path.join(tmp, n) for n in ("a.rec", "a.idx", "raw.bin"))

        def raw_write() -> None:
            with open(raw, "wb", buffering=1 << 20) as f:
                for r in records:
                    f.write(r)

        def ours_write() -> None:
            with recordio.MXIndexedRecordIO(idx, rec, "w") as w:
                for i, r in enumerate(records):
                    w.write_idx(i, r)

        def raw_read() -> None:
            with open(raw, "rb") as f:
                for r in records:
                    f.read(len(r))

        def ours_read() -> None:
            with recordio.MXRecordIO(rec, "r") as r:
                while r.read() is not None:
                    pass

        t_raw_w = best_of(args.repeats, raw_write)
        t_ours_w = best_of(args.repeats, ours_write)
        t_naive_w = best_of(1, lambda: naive_write(os.path.join(tmp, "naive.rec"), records))
        t_raw_r = best_of(args.repeats, raw_read)
        t_ours_r = best_of(args.repeats, ours_read)

        print(f"{args.records} records, {mb:.1f} MB")
        print(f"write  plain file   {mb / t_raw_w:8.0f} MB/s")
        print(
            f"write  ours         {mb / t_ours_w:8.0f} MB/s  {args.records / t_ours_w:9.0f} rec/s  "
            f"= {t_raw_w / t_ours_w:.2f}x plain write"
        )
        print(f"write  naive Python {mb / t_naive_w:8.1f} MB/s  ours is {t_naive_w / t_ours_w:.0f}x faster")
        if args.mxnet_python:
            blob, sizes = os.path.join(tmp, "blob"), os.path.join(tmp, "sizes")
            Path(blob).write_bytes(b"".join(records))
            Path(sizes).write_text("\n".join(str(len(r)) for r in records))
            out = subprocess.run(
                [
                    args.mxnet_python,
                    "-c",
                    _MXNET_WRITER,
                    blob,
                    sizes,
                    os.path.join(tmp, "mx.rec"),
                    str(args.repeats),
                ],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            t_mx = float(out.strip().splitlines()[-1])
            same = Path(rec).read_bytes() == Path(tmp, "mx.rec").read_bytes()
            print(
                f"write  MXNet 1.9.1  {mb / t_mx:8.0f} MB/s  ours = {t_mx / t_ours_w:.2f}x MXNet "
                f"(files identical: {same})"
            )
        print(f"read   plain file   {mb / t_raw_r:8.0f} MB/s")
        print(
            f"read   ours         {mb / t_ours_r:8.0f} MB/s  {args.records / t_ours_r:9.0f} rec/s  "
            f"= {t_raw_r / t_ours_r:.2f}x plain read"
        )

        # Index parsing at combined-index scale, against a plain line-by-line parse.
        n = args.index_lines
        big = os.path.join(tmp, "big.idx")
        recordio.write_index(big, ((k, k * 45_000) for k in range(n)))

        def line_by_line() -> None:
            with open(big) as f:
                [(int(k), int(o)) for k, o in (line.split("\t") for line in f)]

        t_lines = best_of(args.repeats, line_by_line)
        t_index = best_of(args.repeats, lambda: recordio.read_index(big))
        t_arrays = best_of(args.repeats, lambda: recordio.read_index_arrays(big))
        print(f"index  {n} lines: line-by-line {n / t_lines:10,.0f} lines/s")
        print(
            f"index  read_index        {n / t_index:10,.0f} lines/s = {t_lines / t_index:.1f}x line-by-line"
        )
        print(
            f"index  read_index_arrays {n / t_arrays:10,.0f} lines/s = {t_lines / t_arrays:.1f}x line-by-line"
        )
    finally:
        shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
