"""Download throughput from the local hub server: data/hfd.sh with aria2c and with wget
versus huggingface_hub.snapshot_download (the baseline), on the same LFS files.

    .venv/bin/python -m benchmarks.download [--files 4] [--size-mb 32] [--repeat 2]

Prints MB/s of each method (best of --repeat runs) and its ratio to snapshot_download, in
two settings: plain loopback (client CPU overhead; no network limits at all) and with each
TCP connection capped at --cap-mbps by the server, as a distant CDN or a per-flow-limited
link behaves; there parallel connections are what aria2c is for.
hfd.sh times include its sha256 verification of every file; snapshot_download checks sizes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from src.open_alip.hub_server import HubHandler, RepoFile, RequestRecord, serve_in_background
from src.open_alip.hub_server.handler import CHUNK

REPO_ROOT = Path(__file__).resolve().parent.parent
REPO = "bench/shards"
HF_SNAPSHOT = (
    "import sys; from huggingface_hub import snapshot_download; "
    "snapshot_download(sys.argv[1], repo_type='dataset', local_dir=sys.argv[2], cache_dir=sys.argv[3])"
)


class ThrottledHandler(HubHandler):
    """Caps each body transfer at `bps()` bytes per second, as a distant CDN or a per-flow-limited
    link does (tests/_hub_faults.py uses it for transfers slow enough to interrupt)."""

    rate: float | None = None  # bytes per second; None: no cap

    def bps(self) -> float | None:
        return self.rate

    def send_body(self, rec: RequestRecord, f: RepoFile, start: int, end: int) -> None:
        bps = self.bps()
        if not bps:
            super().send_body(rec, f, start, end)
            return
        self.write_chunks(rec, self.paced(self.body_chunks(f, start, end, throttled_chunk(bps))))

    def paced(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """`chunks`, held back so that they leave no faster than `bps()` (read per chunk, so a
        test may lift the cap during a transfer)."""
        sent, began = 0, time.monotonic()
        for chunk in chunks:
            yield chunk
            sent += len(chunk)
            bps = self.bps()
            if bps:
                ahead = sent / bps - (time.monotonic() - began)
                if ahead > 0:
                    time.sleep(ahead)


def throttled_chunk(bps: float) -> int:
    """About 20 chunks a second, so a throttled transfer moves steadily."""
    return min(CHUNK, max(16 * 1024, int(bps / 20)))


def make_repo(root: Path, files: int, size_mb: int) -> int:
    (root / "data").mkdir(parents=True)
    block = os.urandom(1 << 20)
    for i in range(files):
        with open(root / "data" / f"train-{i:05d}-of-{files:05d}.parquet", "wb") as f:
            for j in range(size_mb):
                # vary each MiB so no layer can deduplicate
                f.write(j.to_bytes(8, "little") + i.to_bytes(8, "little") + block[16:])
    return files * size_mb * (1 << 20)


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"benchmark command failed ({' '.join(cmd[:3])} ...): {r.stderr.strip()[-500:]}")
    return dt


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    p.add_argument("--files", type=int, default=4, help="number of files (default 4)")
    p.add_argument("--size-mb", type=int, default=32, help="MiB per file (default 32)")
    p.add_argument("--repeat", type=int, default=2, help="runs per method; the best counts (default 2)")
    p.add_argument("-x", type=int, default=4, help="aria2c connections per file (default 4)")
    p.add_argument("-j", type=int, default=4, help="aria2c files at once (default 4)")
    p.add_argument(
        "--cap-mbps",
        type=float,
        default=5.0,
        help="per-connection cap of the second setting, MB/s (default 5; 0: skip it)",
    )
    a = p.parse_args()
    if a.files < 1 or a.size_mb < 1 or a.repeat < 1:
        p.error("--files, --size-mb and --repeat must be at least 1")
    for tool in ("aria2c", "wget", "curl", "jq"):
        if shutil.which(tool) is None:
            p.exit(
                1,
                f"download.py: error: {tool} is not installed; apt-get install "
                f"{'aria2' if tool == 'aria2c' else tool}\n",
            )

    work = Path(tempfile.mkdtemp(prefix="bench-download-"))
    try:
        total = make_repo(work / "repo", a.files, a.size_mb)
        settings = [("loopback, no cap", None)]
        if a.cap_mbps > 0:
            settings.append((f"{a.cap_mbps:g} MB/s per connection", a.cap_mbps * 1e6))
        for label, cap in settings:
            run_setting(work, total, label, cap, a)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def run_setting(work: Path, total: int, label: str, cap: float | None, a: argparse.Namespace) -> None:
    handler = type("Capped", (ThrottledHandler,), {"rate": cap})
    with serve_in_background(work / "repo", REPO, handler=handler) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(
            HF_ENDPOINT=server.endpoint,
            HOME=str(work),
            HF_HOME=str(work / "hf"),
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
        )
        hfd = ["bash", str(REPO_ROOT / "data" / "hfd.sh"), REPO, "--dataset"]
        methods = {
            "snapshot_download": lambda out: [
                sys.executable,
                "-c",
                HF_SNAPSHOT,
                REPO,
                str(out),
                str(work / "cache"),
            ],
            f"hfd.sh aria2c -x {a.x} -j {a.j}": lambda out: [
                *hfd,
                "--tool",
                "aria2c",
                "-x",
                str(a.x),
                "-j",
                str(a.j),
                "--local-dir",
                str(out),
            ],
            "hfd.sh wget": lambda out: [*hfd, "--tool", "wget", "--local-dir", str(out)],
        }
        best: dict[str, float] = {}
        for _ in range(a.repeat):
            for name, cmd in methods.items():  # interleaved, so drifts in machine load hit all alike
                out = work / "out"
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(work / "cache", ignore_errors=True)
                dt = timed(cmd(out), env)
                best[name] = min(best.get(name, float("inf")), dt)
        shutil.rmtree(work / "out", ignore_errors=True)
    base = total / best["snapshot_download"]
    print(
        f"{label}: {a.files} files x {a.size_mb} MiB = {total / 1e6:.0f} MB (best of {a.repeat})", flush=True
    )
    for name, dt in best.items():
        mbps = total / dt / 1e6
        print(
            f"  {name:28s} {dt:7.2f} s  {mbps:8.1f} MB/s  ratio vs snapshot_download "
            f"{total / dt / base:5.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
