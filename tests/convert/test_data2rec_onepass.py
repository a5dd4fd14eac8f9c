"""data2rec.py --from-hub against the project's hub server (src/open_alip/hub_server) on 127.0.0.1, with the
real data/hfd.sh and aria2c: the records equal the two-step path's, no parquet is left, peak disk
stays within records + --max-inflight shards, a kill -9 mid-run resumes with nothing lost or
duplicated, and a shard that cannot be downloaded stops the run with status 3, naming it."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from src.open_alip.hub_server import serve_in_background
from tests._data2rec_helpers import jpeg, read_records, tokens_for, write_hub_parquet
from tests._hub_faults import Faults, serve_with_faults
from tests._processes import alive, command_name, descendants, wait_for
from tests._repo import REPO as REPO_ROOT

REPO = "testorg/yfcc"
SHARDS = 6
ROWS = 6

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("aria2c", "curl", "jq")),
    reason="needs aria2c, curl and jq (apt-get install aria2 curl jq)",
)


def shard_name(i: int) -> str:
    return f"data/train-{i:05d}-of-{SHARDS:05d}.parquet"


@pytest.fixture(scope="module")
def hub_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hub")
    (root / "data").mkdir()
    for i in range(SHARDS):
        rows = [(jpeg(160, 120, seed=100 * i + r), tokens_for(1, 100 * i + r)) for r in range(ROWS)]
        if i == 1:
            rows[3] = (b"not a jpeg", tokens_for(1, 0))  # a skipped row: ids must still match
        write_hub_parquet(root / shard_name(i), rows)
    (root / "README.md").write_text("# yfcc-like\n")
    return root


@pytest.fixture(scope="module")
def two_step(hub_dir: Path, tmp_path_factory) -> list:
    """The records of the two-step path. hfd.sh leaves byte-identical, sha256-checked copies of the
    hub's files (tests/download), so converting the hub's folder is converting the download."""
    out = tmp_path_factory.mktemp("two_step") / "rec"
    r = subprocess.run(
        [
            sys.executable,
            "data2rec.py",
            str(hub_dir),
            "--output",
            str(out),
            "--workers",
            "1",
            "--no-progress",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return comparable([out.with_suffix(".rec")])


def comparable(recs: list[Path]) -> list[tuple]:
    return [(i, j, label.tobytes(), payload) for i, j, label, payload in read_records(recs)]


def onepass_cmd(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "data2rec.py",
        "--from-hub",
        REPO,
        "--output",
        str(out),
        "--workers",
        "1",
        "--no-progress",
        *extra,
    ]


def make_env(tmp_path: Path, endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env.update(HOME=str(home), HF_ENDPOINT=endpoint, OMP_NUM_THREADS="1", HFD_RETRY_WAIT="1")
    return env


def disk_use(folder: Path) -> int:
    total = 0
    for dirpath, _, names in os.walk(folder):
        for n in names:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_size
            except FileNotFoundError:
                pass
    return total


def outputs(out: Path) -> list[Path]:
    return sorted(out.parent.glob(out.name + "-*.rec"))


def assert_clean(out: Path) -> None:
    assert not list(out.parent.rglob("*.parquet"))
    assert not (out.parent / f".{out.name}.onepass").exists()


def test_one_pass_equals_two_step_with_bounded_disk(hub_dir: Path, two_step: list, tmp_path: Path):
    out = tmp_path / "out" / "rec"
    out.parent.mkdir()
    peak, done = [0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], disk_use(out.parent))
            done.wait(0.005)

    sampler = threading.Thread(target=sample)
    with serve_in_background(hub_dir, REPO) as server:
        sampler.start()
        try:
            r = subprocess.run(
                onepass_cmd(out, "--max-inflight", "2"),
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                env=make_env(tmp_path, server.endpoint),
                timeout=300,
            )
        finally:
            done.set()
            sampler.join()
    assert r.returncode == 0, r.stderr
    assert "at most 2 shards" in r.stdout and "peak disk" in r.stdout
    assert "download" in r.stdout and "conversion" in r.stdout and "rows/s" in r.stdout
    assert comparable(outputs(out)) == two_step
    assert [p.name for p in outputs(out)] == [f"rec-{i:05d}.rec" for i in range(SHARDS)]
    assert_clean(out)
    report = json.loads(out.with_name("rec.report.json").read_text())
    assert report["complete"] and report["written"] == len(two_step) and report["rates"]["shards"] == SHARDS
    records = sum(p.stat().st_size for p in out.parent.glob("rec-*.*"))
    largest = max(p.stat().st_size for p in (hub_dir / "data").iterdir())
    parquet = sum(p.stat().st_size for p in (hub_dir / "data").iterdir())
    small_files = 64 * 1024  # state, report, logs, hfd.sh's listing
    print(
        f"peak {peak[0]} B; records {records} B; bound {records + 2 * largest + small_files} B; "
        f"two-step {records + parquet} B"
    )
    assert peak[0] > records  # the sampler saw the run
    assert peak[0] <= records + 2 * largest + small_files < records + parquet


def test_kill_9_mid_run_then_rerun_loses_and_duplicates_nothing(
    hub_dir: Path, two_step: list, tmp_path: Path
):
    out = tmp_path / "out" / "rec"
    state = out.with_name("rec.onepass.json")

    def converted() -> int:
        try:
            return len(json.loads(state.read_text())["shards"])
        except (OSError, ValueError):
            return 0

    faults = Faults(throttle_bps=30_000)  # a shard takes a few tenths of a second: the kill lands mid-run
    with serve_with_faults(hub_dir, REPO, faults) as server:
        env = make_env(tmp_path, server.endpoint)
        proc = subprocess.Popen(
            onepass_cmd(out), cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            # killed with a shard converted and the next one downloading
            children: dict[int, int] = {}

            def mid_download() -> bool:
                now = descendants(proc.pid)
                children.update(now)
                return converted() >= 1 and "aria2c" in map(command_name, now)

            assert wait_for(lambda: mid_download() or proc.poll() is not None, limit=120)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.wait(30)
        assert proc.returncode == -signal.SIGKILL
        # hfd.sh and its aria2c stop with the killed run (a rerun must not race them for the same file)
        assert wait_for(lambda: not alive(children), limit=60), subprocess.run(
            ["ps", "-o", "pid,ppid,stat,args", "-p", ",".join(map(str, alive(children)))],
            capture_output=True,
            text=True,
        ).stdout
        assert 1 <= converted() < SHARDS, "the kill came too late to test a resume"
        assert (out.parent / ".rec.onepass").is_dir()  # the run was cut with shards in flight
        faults.throttle_bps = None
        r = subprocess.run(
            onepass_cmd(out), cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300
        )
    assert r.returncode == 0, r.stderr
    assert "already converted" in r.stdout
    records = comparable(outputs(out))
    assert len({rec[0] for rec in records}) == len(records)
    assert records == two_step
    assert_clean(out)


def test_a_shard_that_cannot_be_downloaded_stops_the_run_naming_it(
    hub_dir: Path, two_step: list, tmp_path: Path
):
    out = tmp_path / "out" / "rec"
    faults = Faults(corrupt={shard_name(2)})  # every copy fails the sha256 check
    with serve_with_faults(hub_dir, REPO, faults) as server:
        env = {**make_env(tmp_path, server.endpoint), "HFD_MAX_ROUNDS": "1"}
        r = subprocess.run(
            onepass_cmd(out, "--download-tries", "2"),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert r.returncode == 3, r.stdout + r.stderr
        assert f"{shard_name(2)}: download failed 2 times" in r.stderr
        assert "rerun the same command" in r.stderr
        assert [p.name for p in outputs(out)] == ["rec-00000.rec", "rec-00001.rec"]
        faults.corrupt.clear()
        r = subprocess.run(
            onepass_cmd(out), cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300
        )
    assert r.returncode == 0, r.stderr
    assert comparable(outputs(out)) == two_step
    assert_clean(out)


def test_a_rerun_after_a_kill_at_the_very_end_leaves_nothing_behind(hub_dir: Path, tmp_path: Path):
    # Killed after the run was recorded complete, while its report was written: the rerun once left an
    # empty .OUT.onepass/ folder and the report's temporary file.
    out = tmp_path / "out" / "rec"
    dead = int(
        subprocess.run(
            [sys.executable, "-c", "import os; print(os.getpid())"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    with serve_in_background(hub_dir, REPO) as server:
        env = make_env(tmp_path, server.endpoint)
        cmd = onepass_cmd(out, "--hub-include", shard_name(0))
        assert subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, env=env, timeout=300).returncode == 0
        stale = out.with_name(f".rec.report.json.{dead}.tmp")
        stale.write_text('{"output": ')
        (out.parent / ".rec.onepass").mkdir()  # the kill came before the folder was removed
        r = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and "already complete" in r.stdout, r.stderr
    assert_clean(out)
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "rec-00000.idx",
        "rec-00000.rec",
        "rec.onepass.json",
        "rec.report.json",
    ]


def test_a_hub_shard_that_cannot_be_read_stops_the_run_and_is_kept(tmp_path: Path):
    # The hub serves a shard cut in half (its sha256 is the cut file's): no parquet footer, rows unknown.
    hub = tmp_path / "hub"
    (hub / "data").mkdir(parents=True)
    for i in range(3):
        write_hub_parquet(
            hub / shard_name(i),
            [(jpeg(32, 24, seed=10 * i + r), tokens_for(1, 10 * i + r)) for r in range(ROWS)],
        )
    cut = hub / shard_name(1)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    out = tmp_path / "out" / "rec"
    with serve_in_background(hub, REPO) as server:
        env = make_env(tmp_path, server.endpoint)
        for _attempt in range(2):  # the rerun neither reports the run complete nor loses the shard
            r = subprocess.run(
                onepass_cmd(out), cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300
            )
            assert r.returncode == 3, r.stdout + r.stderr
            assert (
                f"{shard_name(1)} cannot be read (cannot open parquet" in r.stderr
                and "Traceback" not in r.stderr
            )
            assert "the 1 shard(s) before it are converted" in r.stderr
            assert [p.name for p in outputs(out)] == ["rec-00000.rec"]
            kept = out.parent / ".rec.onepass" / "00001" / shard_name(1)
            assert kept.read_bytes() == cut.read_bytes()
    assert not json.loads(out.with_name("rec.onepass.json").read_text())["complete"]


def test_credentials_in_hf_endpoint_are_never_stored_or_shown(hub_dir: Path, tmp_path: Path):
    # HF_ENDPOINT=http://user:pw@host once appeared verbatim in OUT.report.json (from_hub.endpoint).
    secret = "pw-9f3kq7"
    out = tmp_path / "out" / "rec"
    with serve_in_background(hub_dir, REPO) as server:
        endpoint = server.endpoint.replace("http://", f"http://someone:{secret}@")
        env = make_env(tmp_path, endpoint)
        r = subprocess.run(
            onepass_cmd(out, "--hub-include", shard_name(0)),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        assert (
            json.loads(out.with_name("rec.report.json").read_text())["from_hub"]["endpoint"]
            == server.endpoint
        )
        missing = [a.replace(REPO, "testorg/missing") for a in onepass_cmd(tmp_path / "other" / "rec")]
        failed = subprocess.run(missing, cwd=REPO_ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert failed.returncode == 3 and server.endpoint in failed.stderr, failed.stderr
    shown = r.stdout + r.stderr + failed.stdout + failed.stderr
    stored = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert secret not in shown and stored == [], (shown, stored)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["some/folder"], "--from-hub downloads its own input"),
        (["--shard-size", "10"], "leave out --shard-size"),
        (["--max-inflight", "0"], "--max-inflight 0 must be >= 1"),
    ],
)
def test_options_that_do_not_apply_are_refused_in_one_line(tmp_path: Path, extra: list[str], message: str):
    env = make_env(tmp_path, "http://127.0.0.1:9")  # never reached
    r = subprocess.run(
        onepass_cmd(tmp_path / "rec", *extra),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
