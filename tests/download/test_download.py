"""data/hfd.sh against the local hub server (src/open_alip/hub_server) on 127.0.0.1, with real
aria2c, wget and curl: complete and verified downloads, retries, resume after a kill,
re-fetch of corrupt files, hostile names, token hygiene and argument errors."""

import hashlib
import os
import random
import re
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from src.open_alip.hub_server import serve_in_background
from tests._hub_faults import Faults, serve_with_faults
from tests._processes import alive, command_name, descendants, wait_for
from tests._repo import REPO as REPO_ROOT

HFD = REPO_ROOT / "data" / "hfd.sh"
YFCC = REPO_ROOT / "data" / "download_YFCC15M.sh"
REPO = "testorg/shards"
SHARD0 = "data/train-00000-of-00003.parquet"
TOOLS = ["aria2c", "wget"]

pytestmark = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("aria2c", "wget", "curl", "jq")),
    reason="needs aria2c, wget, curl and jq (apt-get install aria2 wget curl jq)",
)


@pytest.fixture(scope="module")
def shard_repo_dir(tmp_path_factory) -> Path:
    rnd = random.Random(3)
    root = tmp_path_factory.mktemp("repo")
    (root / "data").mkdir()
    for i, size in enumerate((700_000, 500_000, 300_000)):
        (root / "data" / f"train-{i:05d}-of-00003.parquet").write_bytes(rnd.randbytes(size))
    (root / "README.md").write_text("# shards\n")
    (root / "meta").mkdir()
    (root / "meta" / "info.json").write_text('{"rows": 3}\n')
    return root


def repo_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".hfd" not in p.parts
    }


def make_env(tmp_path: Path, endpoint: str, path: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    home, tmpdir = tmp_path / "home", tmp_path / "tmpdir"
    home.mkdir(exist_ok=True)
    tmpdir.mkdir(exist_ok=True)
    # HOME isolated: no token of the machine's user is picked up; TMPDIR checked for leftovers.
    # Retries after a second, not the default two: the injected faults are retried all the same.
    env.update(HOME=str(home), TMPDIR=str(tmpdir), HF_ENDPOINT=endpoint, HFD_RETRY_WAIT="1")
    if path is not None:
        env["PATH"] = path
    env.update(extra)
    return env


def run_hfd(args: list[str], env: dict[str, str], script: Path = HFD) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=180)


def served(server, since: int, part: str) -> list:
    return [r for r in server.requests[since:] if part in r.path]


@pytest.mark.parametrize("tool", TOOLS)
def test_complete_verified_download_with_transient_failures(shard_repo_dir: Path, tmp_path: Path, tool: str):
    faults = Faults(target="/cdn/", fail_503=2, drop_count=2, drop_after=100_000)
    out_dir = tmp_path / "out"
    with serve_with_faults(shard_repo_dir, REPO, faults) as server:
        env = make_env(tmp_path, server.endpoint)
        r = run_hfd([REPO, "--dataset", "--tool", tool, "--local-dir", str(out_dir)], env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "5 files: 0 already ok, 5 fetched, 0 failed, 0 refused" in r.stdout
        assert f"Files are in {out_dir}" in r.stdout
        assert repo_files(out_dir) == repo_files(shard_repo_dir)
        # the injected 503s and dropped connections happened and were retried
        assert sum(r.status == 503 for r in server.requests) == 2
        assert faults.dropped == 2
        assert not list((out_dir / ".hfd" / "incomplete").rglob("*.*"))

        # a second run fetches nothing
        n = len(server.requests)
        r = run_hfd([REPO, "--dataset", "--tool", tool, "--local-dir", str(out_dir)], env)
        assert r.returncode == 0, r.stderr
        assert "5 already ok, 0 fetched" in r.stdout
        assert not served(server, n, "/resolve/") and not served(server, n, "/cdn/")

    # verification needs no network: the server is gone
    r = run_hfd(
        [REPO, "--local-dir", str(out_dir), "--verify-only"], make_env(tmp_path, "http://127.0.0.1:9")
    )
    assert r.returncode == 0, r.stderr
    assert "5 files checked: 5 ok, 0 missing, 0 corrupt" in r.stdout
    assert not any((tmp_path / "tmpdir").iterdir())


def wait_until(pred, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.05)


def partial_args(tool: str, out_dir: Path) -> list[str]:
    return [
        REPO,
        "--dataset",
        "--tool",
        tool,
        "-x",
        "1",
        "--local-dir",
        str(out_dir),
        "--include",
        "data/train-00000*",
    ]


def kill_mid_file(server, args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Start hfd.sh, SIGTERM its process group once 150 kB of a body went out; (rc, stderr)."""
    proc = subprocess.Popen(
        ["bash", str(HFD), *args],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until(lambda: any(r.sent >= 150_000 for r in served(server, 0, "/cdn/")))
    os.killpg(proc.pid, signal.SIGTERM)  # like Ctrl-C or a job scheduler's kill
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


@pytest.mark.parametrize("tool", TOOLS)
def test_resume_after_kill_mid_file(shard_repo_dir: Path, tmp_path: Path, tool: str):
    # throttled so that the kill lands mid-file; a partial download also shows --include
    faults = Faults(throttle_bps=150_000)
    out_dir = tmp_path / "out"
    args = partial_args(tool, out_dir)
    with serve_with_faults(shard_repo_dir, REPO, faults) as server:
        env = make_env(tmp_path, server.endpoint)
        rc, err = kill_mid_file(server, args, env)
        assert rc != 0
        assert "run the same command again to resume" in err
        assert not (out_dir / SHARD0).exists()  # an incomplete file never appears under its name
        assert (out_dir / ".hfd" / "incomplete" / SHARD0).exists()

        faults.throttle_bps = None
        n = len(server.requests)
        r = run_hfd(args, env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert (out_dir / SHARD0).read_bytes() == (shard_repo_dir / SHARD0).read_bytes()
        resumed = served(server, n, "/cdn/")
        # continued from where it stopped (aria2c also probes with a plain GET it abandons)
        assert any(x.status == 206 and re.match(r"bytes=[1-9]", x.range or "") for x in resumed)
        assert not any((x.range or "").startswith("bytes=0-") for x in resumed)
    assert sorted(
        p.relative_to(out_dir).as_posix() for p in out_dir.rglob("*") if p.is_file() and ".hfd" not in p.parts
    ) == [SHARD0]
    assert not any((tmp_path / "tmpdir").iterdir())


@pytest.mark.parametrize("tool", TOOLS)
def test_kill_9_leaves_no_downloader_and_no_token_behind(shard_repo_dir: Path, tmp_path: Path, tool: str):
    """SIGKILL of the script alone (the OOM killer's way): no trap runs, the watchdog cleans up."""
    token = "hf_" + secrets.token_hex(16)
    faults = Faults(throttle_bps=150_000)
    out_dir = tmp_path / "out"
    args = partial_args(tool, out_dir)
    with serve_with_faults(shard_repo_dir, REPO, faults, token=token) as server:
        env = {**make_env(tmp_path, server.endpoint), "HF_TOKEN": token}
        # What a killed process group leaves (the watchdog died too): the next run removes it.
        gone = subprocess.Popen(["true"])
        gone.wait()
        stale = tmp_path / "tmpdir" / "hfd.stale000"
        stale.mkdir(mode=0o700)
        (stale / "owner").write_text(f"{gone.pid}\n")
        (stale / "curl_auth").write_text(f"Authorization: Bearer {token}\n")
        proc = subprocess.Popen(
            ["bash", str(HFD), *args],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_until(lambda: any(r.sent >= 150_000 for r in served(server, 0, "/cdn/")))
            assert not stale.exists()
            downloader = {
                pid: start for pid, start in descendants(proc.pid).items() if command_name(pid) == tool
            }
            assert downloader, descendants(proc.pid)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            assert wait_for(lambda: not alive(downloader), limit=30), f"{tool} still running"
            assert wait_for(lambda: not any((tmp_path / "tmpdir").iterdir()), limit=30)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        faults.throttle_bps = None
        r = run_hfd(args, env)  # and the download resumes
        assert r.returncode == 0, r.stdout + r.stderr
    assert (out_dir / SHARD0).read_bytes() == (shard_repo_dir / SHARD0).read_bytes()
    assert not any((tmp_path / "tmpdir").iterdir())


@pytest.mark.parametrize("tool", TOOLS)
def test_resume_against_a_server_without_ranges_starts_the_file_over(
    shard_repo_dir: Path, tmp_path: Path, tool: str
):
    # docs/formats.md §4: a client resuming with Range that gets 200 must start the file over
    faults = Faults(throttle_bps=150_000)
    out_dir = tmp_path / "out"
    args = partial_args(tool, out_dir)
    with serve_with_faults(shard_repo_dir, REPO, faults) as server:
        env = make_env(tmp_path, server.endpoint)
        kill_mid_file(server, args, env)
        assert (out_dir / ".hfd" / "incomplete" / SHARD0).stat().st_size > 0

        faults.throttle_bps = None
        faults.ignore_range = True
        n = len(server.requests)
        r = run_hfd(args, env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "1 fetched, 0 failed" in r.stdout
        resumed = served(server, n, "/cdn/")
        assert resumed and all(x.status == 200 for x in resumed)
    assert (out_dir / SHARD0).read_bytes() == (shard_repo_dir / SHARD0).read_bytes()


def test_corrupt_or_missing_files_are_fetched_again(shard_repo_dir: Path, tmp_path: Path):
    out_dir = tmp_path / "out"
    with serve_in_background(shard_repo_dir, REPO) as server:
        env = make_env(tmp_path, server.endpoint)
        args = [REPO, "--dataset", "--local-dir", str(out_dir)]
        assert run_hfd(args, env).returncode == 0

        # changed in place (mtime moves): the next run notices and fetches it again
        shard = out_dir / "data" / "train-00001-of-00003.parquet"
        shard.write_bytes(b"\0" * shard.stat().st_size)
        r = run_hfd(args, env)
        assert r.returncode == 0, r.stderr
        assert "does not match the hub's hash; fetching it again" in r.stderr
        assert "4 already ok, 1 fetched" in r.stdout
        assert shard.read_bytes() == (shard_repo_dir / "data" / "train-00001-of-00003.parquet").read_bytes()

        # silent corruption (mtime kept) and a deleted file: --verify-only finds both
        st = shard.stat()
        with open(shard, "r+b") as f:
            f.seek(1000)
            f.write(b"\xff\xfe")
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
        (out_dir / "meta" / "info.json").unlink()
        r = run_hfd([*args, "--verify-only"], env)
        assert r.returncode == 1
        assert "3 ok, 1 missing, 1 corrupt" in r.stdout
        assert "checksum mismatch: data/train-00001-of-00003.parquet" in r.stderr
        r = run_hfd(args, env)
        assert r.returncode == 0, r.stderr
        assert "3 already ok, 2 fetched" in r.stdout
    assert repo_files(out_dir) == repo_files(shard_repo_dir)


def test_hub_without_tree_api_is_listed_from_repo_info(shard_repo_dir: Path, tmp_path: Path):
    out_dir = tmp_path / "out"
    with serve_in_background(shard_repo_dir, REPO) as server:
        server.set_tree_api(False)
        env = make_env(tmp_path, server.endpoint)
        r = run_hfd([REPO, "--dataset", "--include", "data/*", "--local-dir", str(out_dir)], env)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "no tree listing (404); using the repo info's file list" in r.stderr
        assert "3 files: 0 already ok, 3 fetched, 0 failed, 0 refused" in r.stdout
        assert any("/tree/" in q.path and q.status == 404 for q in server.requests)
    expected = {k: v for k, v in repo_files(shard_repo_dir).items() if k.startswith("data/")}
    assert repo_files(out_dir) == expected
    # the sha256 of every LFS shard came from the siblings and was checked
    r = run_hfd(
        [REPO, "--include", "data/*", "--local-dir", str(out_dir), "--verify-only"],
        make_env(tmp_path, "http://127.0.0.1:9"),
    )
    assert r.returncode == 0, r.stderr
    assert "3 files checked: 3 ok, 0 missing, 0 corrupt" in r.stdout


def test_server_sending_wrong_bytes_ends_in_failure(shard_repo_dir: Path, tmp_path: Path):
    faults = Faults(corrupt={SHARD0})
    out_dir = tmp_path / "out"
    with serve_with_faults(shard_repo_dir, REPO, faults) as server:
        env = make_env(tmp_path, server.endpoint, HFD_MAX_ROUNDS="2")
        r = run_hfd([REPO, "--dataset", "--local-dir", str(out_dir)], env)
        assert (
            len(
                served(
                    server, 0, "/cdn/" + hashlib.sha256((shard_repo_dir / SHARD0).read_bytes()).hexdigest()
                )
            )
            == 2
        )
    assert r.returncode == 1
    assert "4 fetched, 1 failed" in r.stdout
    assert f"failed: {SHARD0}" in r.stderr
    assert not (out_dir / SHARD0).exists()
    assert not list((out_dir / ".hfd" / "incomplete").rglob("*.parquet*"))


HOSTILE = {
    "../evil-parent.txt": b"x",
    "/tmp/evil-absolute.txt": b"x",
    "sub\\..\\..\\evil-backslash.txt": b"x",
    "data/../../evil-dots.txt": b"x",
    "evil\nnewline.txt": b"x",
    ".hfd/verified.tsv": b"x",
}


def test_hostile_names_are_refused(shard_repo_dir: Path, tmp_path: Path):
    out_dir = tmp_path / "a" / "b" / "out"
    with serve_in_background(shard_repo_dir, REPO, extra_files=HOSTILE) as server:
        env = make_env(tmp_path, server.endpoint)
        r = run_hfd([REPO, "--dataset", "--local-dir", str(out_dir)], env)
        assert r.returncode == 1
        assert r.stderr.count("refusing unsafe file name") == len(HOSTILE)
        assert "5 fetched, 0 failed, 6 refused" in r.stdout
        assert repo_files(out_dir) == repo_files(shard_repo_dir)
        assert not [p for p in tmp_path.rglob("*evil*")] and not Path("/tmp/evil-absolute.txt").exists()
        assert not served(server, 0, "evil")

        # the user can leave them out and get a clean run
        r = run_hfd([REPO, "--dataset", "--local-dir", str(out_dir), "--exclude", "*evil*", ".hfd/*"], env)
        assert r.returncode == 0, r.stderr
        assert "5 already ok, 0 fetched, 0 failed, 0 refused" in r.stdout


def test_symlinked_subfolder_is_not_written_through(shard_repo_dir: Path, tmp_path: Path):
    out_dir, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out_dir.mkdir()
    elsewhere.mkdir()
    (out_dir / "meta").symlink_to(elsewhere)
    with serve_in_background(shard_repo_dir, REPO) as server:
        r = run_hfd(
            [REPO, "--dataset", "--local-dir", str(out_dir), "--include", "meta/*"],
            make_env(tmp_path, server.endpoint, HFD_MAX_ROUNDS="1"),
        )
    assert r.returncode == 1
    assert "refusing to write meta/info.json: its folder leads outside" in r.stderr
    assert not any(elsewhere.iterdir())


def processes_mentioning(secret: bytes) -> list[str]:
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if secret in cmd:
                found.append(cmd.replace(b"\0", b" ").decode(errors="replace"))
    return found


@pytest.mark.parametrize("tool", TOOLS)
def test_gated_repo_and_token_hygiene(shard_repo_dir: Path, tmp_path: Path, tool: str):
    token = "hf_" + secrets.token_hex(16)
    faults = Faults(throttle_bps=1_000_000)  # slow enough to look at the processes while they run
    with serve_with_faults(shard_repo_dir, REPO, faults, token=token) as server:
        base = [REPO, "--dataset", "--tool", tool]
        env = make_env(tmp_path, server.endpoint)
        r = run_hfd([*base, "--local-dir", str(tmp_path / "none")], env)
        assert r.returncode == 1
        assert "gated or private" in r.stderr and "export HF_TOKEN=" in r.stderr
        assert not (tmp_path / "none").exists()
        r = run_hfd([*base, "--local-dir", str(tmp_path / "none")], {**env, "HF_TOKEN": "hf_wrong"})
        assert r.returncode == 1 and "refused the token (403)" in r.stderr

        out_dir = tmp_path / "out"
        proc = subprocess.Popen(
            ["bash", str(HFD), *base, "--local-dir", str(out_dir)],
            env={**env, "HF_TOKEN": token},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        in_ps: list[str] = []
        while proc.poll() is None:
            in_ps += processes_mentioning(token.encode())
            time.sleep(0.02)
        out, err = proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert in_ps == []
        assert repo_files(out_dir) == repo_files(shard_repo_dir)

        # the token file of `hf auth login` also works, and a --hf_token warns about ps
        token_file = tmp_path / "home" / ".cache" / "huggingface" / "token"
        token_file.parent.mkdir(parents=True)
        token_file.write_text(token + "\n")
        r2 = run_hfd([*base, "--local-dir", str(tmp_path / "out2")], env)
        token_file.unlink()
        r3 = run_hfd([*base, "--local-dir", str(tmp_path / "out3"), "--hf_token", token], env)
        assert r2.returncode == 0 and r3.returncode == 0, r2.stderr + r3.stderr
        assert "visible to other users" in r3.stderr

        records = server.requests
    for text in (
        out,
        err,
        r.stdout.encode(),
        r.stderr.encode(),
        r2.stdout.encode(),
        r2.stderr.encode(),
        r3.stdout.encode(),
        r3.stderr.encode(),
    ):
        assert token.encode() not in text
    for d in (out_dir, tmp_path / "out2", tmp_path / "out3"):
        for p in d.rglob("*"):
            assert not p.is_file() or token.encode() not in p.read_bytes(), p
    assert not any((tmp_path / "tmpdir").iterdir())  # the private scratch folder is gone
    # the token goes to the hub, never to the host that LFS downloads are redirected to
    cdn = [x for x in records if x.path.startswith("/cdn/")]
    assert cdn and not any(x.authorization for x in cdn)
    assert all(x.authorization for x in records if "/resolve/" in x.path and x.status in (200, 302))


@pytest.mark.parametrize("tool", TOOLS)
def test_credentials_in_hf_endpoint_are_never_shown_or_stored(
    shard_repo_dir: Path, tmp_path: Path, tool: str
):
    # A mirror behind basic auth: HF_ENDPOINT=http://user:password@host. The user info reaches the server,
    # never a message, a log or a file of the download (as HF_TOKEN never does).
    # Nor a command line, where `ps` shows it to every user: each downloader runs through a shim that
    # writes its arguments to a file under tmp_path (checked with the others below), then runs the real one.
    secret = "pw-" + secrets.token_hex(6)
    out_dir = tmp_path / "out"
    shims = tmp_path / "shims"
    shims.mkdir()
    for name in ("curl", "wget", "aria2c"):
        real = shutil.which(name)
        if real is not None:
            shim = shims / name
            shim.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >>"{tmp_path}/argv.log"\nexec "{real}" "$@"\n')
            shim.chmod(0o755)
    with serve_in_background(shard_repo_dir, REPO) as server:
        endpoint = server.endpoint.replace("http://", f"http://someone:{secret}@")
        env = make_env(tmp_path, endpoint, path=f"{shims}{os.pathsep}{os.environ['PATH']}")
        runs = [
            run_hfd([REPO, "--dataset", "--tool", tool, "--local-dir", str(out_dir)], env),
            run_hfd(["testorg/nope", "--dataset", "--tool", tool, "--local-dir", str(tmp_path / "x")], env),
            run_hfd([REPO, "--dataset", "--list-only"], env),
        ]
    assert runs[0].returncode == 0 and runs[1].returncode == 1 and runs[2].returncode == 0, runs[1].stderr
    assert repo_files(out_dir) == repo_files(shard_repo_dir)
    assert f"not found at {server.endpoint}" in runs[1].stderr
    for r in runs:
        assert secret not in r.stdout + r.stderr
    argv = (tmp_path / "argv.log").read_text().splitlines()
    assert "-sS" in argv and ("--tries=10" if tool == "wget" else "--no-conf=true") in argv  # the shims ran
    stored = [p for p in tmp_path.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert stored == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "missing REPO_ID"),
        ([REPO, "--tool", "curl"], "--tool must be aria2c or wget"),
        ([REPO, "-x", "0"], "-x must be a number from 1 to 16"),
        ([REPO, "-j", "many"], "-j must be a number"),
        ([REPO, "--bogus"], "unknown option '--bogus'"),
        ([REPO, "--include"], "--include needs at least one pattern"),
        ([REPO, "--local-dir"], "--local-dir needs a value"),
        (["not a repo"], "is not a repo id"),
        ([REPO, "other/repo"], "unexpected argument 'other/repo'"),
    ],
)
def test_bad_arguments_give_usage_and_exit_1(tmp_path: Path, args: list[str], message: str):
    r = run_hfd(args, make_env(tmp_path, "http://127.0.0.1:9"))
    assert r.returncode == 1
    assert message in r.stderr.splitlines()[0]
    assert "Usage: hfd.sh REPO_ID" in r.stderr


@pytest.mark.parametrize("wait", ["0", "soon", "601"])
def test_a_bad_retry_wait_is_refused_before_any_request(tmp_path: Path, wait: str):
    r = run_hfd(
        [REPO, "--local-dir", str(tmp_path / "out")],
        make_env(tmp_path, "http://127.0.0.1:9", HFD_RETRY_WAIT=wait),
    )
    assert r.returncode == 1 and not (tmp_path / "out").exists()
    assert r.stderr.splitlines() == [
        f"hfd.sh: error: HFD_RETRY_WAIT '{wait}' is not a number of seconds from 1 to 600; unset it for the "
        "default 2"
    ]


def test_list_only_prints_the_selection_at_a_pinned_commit_and_writes_nothing(
    shard_repo_dir: Path, tmp_path: Path
):
    # data2rec.py --from-hub lists through this, then downloads file by file at the commit
    with serve_in_background(shard_repo_dir, REPO) as server:
        env = make_env(tmp_path, server.endpoint)
        r = run_hfd(
            [REPO, "--dataset", "--include", "data/*", "--local-dir", str(tmp_path / "out"), "--list-only"],
            env,
        )
    assert r.returncode == 0, r.stderr
    head, *lines = r.stdout.splitlines()
    assert re.fullmatch(r"commit\t[0-9a-f]{40}", head)
    data = {k: v for k, v in repo_files(shard_repo_dir).items() if k.startswith("data/")}
    assert lines == [
        f"{len(v)}\tsha256\t{hashlib.sha256(v).hexdigest()}\t{k}" for k, v in sorted(data.items())
    ]
    assert not (tmp_path / "out").exists() and not served(server, 0, "/resolve/")


def test_help_and_missing_manifest(tmp_path: Path):
    r = run_hfd(["--help"], make_env(tmp_path, "http://127.0.0.1:9"))
    assert r.returncode == 0 and "--include PAT" in r.stdout and "HF_TOKEN" in r.stdout
    (tmp_path / "empty").mkdir()
    r = run_hfd(
        [REPO, "--verify-only", "--local-dir", str(tmp_path / "empty")],
        make_env(tmp_path, "http://127.0.0.1:9"),
    )
    assert r.returncode == 1 and "no saved listing" in r.stderr


def test_unknown_repo_and_revision_are_named(shard_repo_dir: Path, tmp_path: Path):
    with serve_in_background(shard_repo_dir, REPO) as server:
        env = make_env(tmp_path, server.endpoint)
        r = run_hfd(["testorg/nope", "--dataset", "--local-dir", str(tmp_path / "x")], env)
        assert r.returncode == 1 and "dataset 'testorg/nope' (revision 'main') not found" in r.stderr
        r = run_hfd([REPO, "--dataset", "--revision", "v9", "--local-dir", str(tmp_path / "x")], env)
        assert r.returncode == 1 and "revision 'v9' not found in dataset 'testorg/shards'" in r.stderr
        r = run_hfd([REPO, "--local-dir", str(tmp_path / "x")], env)  # a dataset asked for as a model
        assert r.returncode == 1 and "add --dataset" in r.stderr
    assert not (tmp_path / "x").exists()


def path_without(tmp_path: Path, *missing: str) -> str:
    """A PATH with every system command except ``missing``: the script sees them as not installed."""
    bin_dir = tmp_path / ("bin-" + "-".join(missing))
    bin_dir.mkdir()
    for d in ("/usr/local/bin", "/usr/bin", "/bin"):
        if Path(d).is_dir():
            for exe in Path(d).iterdir():
                if exe.name not in missing and not (bin_dir / exe.name).exists():
                    (bin_dir / exe.name).symlink_to(exe)
    return str(bin_dir)


def test_missing_tools(shard_repo_dir: Path, tmp_path: Path):
    with serve_in_background(shard_repo_dir, REPO) as server:
        env = make_env(tmp_path, server.endpoint, path=path_without(tmp_path, "aria2c"))
        r = run_hfd([REPO, "--dataset", "--local-dir", str(tmp_path / "out"), "--include", "meta/*"], env)
        assert r.returncode == 0, r.stderr
        assert "aria2c not found, falling back to wget" in r.stderr and "apt-get install aria2" in r.stderr
        assert (tmp_path / "out" / "meta" / "info.json").exists()

        env = make_env(tmp_path, server.endpoint, path=path_without(tmp_path, "curl"))
        r = run_hfd([REPO, "--dataset"], env)
        assert r.returncode == 1 and "curl is required" in r.stderr and "apt-get install curl" in r.stderr

        env = make_env(tmp_path, server.endpoint, path=path_without(tmp_path, "aria2c", "wget"))
        r = run_hfd([REPO, "--dataset"], env)
        assert (
            r.returncode == 1
            and "neither aria2c nor wget" in r.stderr
            and "apt-get install aria2" in r.stderr
        )


def test_yfcc_wrapper_passes_arguments_through(shard_repo_dir: Path, tmp_path: Path):
    with serve_in_background(shard_repo_dir, "Kaichengalex/YFCC15M") as server:
        env = make_env(tmp_path, server.endpoint, YFCC15M_DIR=str(tmp_path / "yfcc"))
        r = run_hfd(["--include", "data/train-0000[12]*"], env, script=YFCC)
    assert r.returncode == 0, r.stderr
    assert re.search(r"1\.1 TB", r.stdout)
    got = sorted(p.name for p in (tmp_path / "yfcc" / "data").iterdir())
    assert got == ["train-00001-of-00003.parquet", "train-00002-of-00003.parquet"]
