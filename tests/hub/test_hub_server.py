"""The local hub server: faithful enough that the real huggingface_hub client works against it,
and its fault injection does what the downloader tests rely on."""

import hashlib
import http.client
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from src.open_alip.hub_server import RangeNotSatisfiable, parse_range, serve_in_background
from tests._hub_faults import Faults, serve_with_faults
from tests._repo import REPO as REPO_ROOT

REPO = "testorg/tiny"


@pytest.fixture(scope="module")
def hub_files_dir(tmp_path_factory) -> Path:
    import random

    rnd = random.Random(1)
    root = tmp_path_factory.mktemp("hubrepo")
    (root / "data").mkdir()
    (root / "data" / "train-00000-of-00002.parquet").write_bytes(rnd.randbytes(300_000))
    (root / "data" / "train-00001-of-00002.parquet").write_bytes(rnd.randbytes(200_001))
    (root / "README.md").write_text("# tiny\n")
    (root / "meta").mkdir()
    (root / "meta" / "info.json").write_text('{"rows": 2}\n')
    # the downloader's state folder is never part of the repo
    (root / ".hfd").mkdir()
    (root / ".hfd" / "manifest.tsv").write_text("")
    return root


def request(endpoint: str, method: str, path: str, headers: dict | None = None):
    u = urlsplit(endpoint if path.startswith("/") else path)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    target = path if path.startswith("/") else (u.path + ("?" + u.query if u.query else ""))
    conn.request(method, target, headers=headers or {})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    return resp, body


def git_hash_object(path: Path) -> str:
    """git itself is the oracle for the blob ids of small files."""
    return subprocess.run(
        ["git", "hash-object", str(path)], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_listing_and_resolve_match_the_hub_protocol(hub_files_dir: Path):
    with serve_in_background(hub_files_dir, REPO) as server:
        resp, body = request(server.endpoint, "GET", f"/api/datasets/{REPO}/revision/main?blobs=true")
        assert resp.status == 200
        info = json.loads(body)
        assert len(info["sha"]) == 40
        sib = {s["rfilename"]: s for s in info["siblings"]}
        assert set(sib) == {
            "README.md",
            "meta/info.json",
            "data/train-00000-of-00002.parquet",
            "data/train-00001-of-00002.parquet",
        }
        shard = hub_files_dir / "data" / "train-00000-of-00002.parquet"
        sha = hashlib.sha256(shard.read_bytes()).hexdigest()
        assert sib["data/train-00000-of-00002.parquet"]["lfs"]["sha256"] == sha
        assert "lfs" not in sib["README.md"]
        assert sib["README.md"]["blobId"] == git_hash_object(hub_files_dir / "README.md")

        # small file: served in place, git sha1 ETag
        resp, body = request(server.endpoint, "GET", f"/datasets/{REPO}/resolve/main/README.md")
        assert resp.status == 200 and body == b"# tiny\n"
        assert resp.getheader("ETag") == f'"{git_hash_object(hub_files_dir / "README.md")}"'
        assert resp.getheader("X-Repo-Commit") == info["sha"]

        # LFS file: 302 to the second host name, sha256 and size in X-Linked-*
        resp, _ = request(
            server.endpoint,
            "HEAD",
            f"/datasets/{REPO}/resolve/{info['sha']}/data/train-00000-of-00002.parquet",
        )
        assert resp.status == 302
        assert resp.getheader("X-Linked-Etag") == f'"{sha}"'
        assert int(resp.getheader("X-Linked-Size")) == shard.stat().st_size
        location = resp.getheader("Location")
        assert (
            urlsplit(location).hostname == "localhost" and urlsplit(server.endpoint).hostname == "127.0.0.1"
        )

        # Range on the CDN URL
        resp, body = request(server.endpoint, "GET", location, {"Range": "bytes=1000-"})
        assert resp.status == 206
        assert body == shard.read_bytes()[1000:]
        assert (
            resp.getheader("Content-Range") == f"bytes 1000-{shard.stat().st_size - 1}/{shard.stat().st_size}"
        )
        resp, _ = request(server.endpoint, "GET", location, {"Range": f"bytes={shard.stat().st_size}-"})
        assert resp.status == 416
        # a tampered signature is refused
        resp, _ = request(server.endpoint, "GET", location.replace("sig=", "sig=0"))
        assert resp.status == 403

        # errors name what is missing, with the hub's X-Error-Code
        resp, _ = request(server.endpoint, "GET", "/api/datasets/other/repo")
        assert resp.status == 404 and resp.getheader("X-Error-Code") == "RepoNotFound"
        resp, _ = request(server.endpoint, "GET", f"/api/datasets/{REPO}/revision/v2")
        assert resp.status == 404 and resp.getheader("X-Error-Code") == "RevisionNotFound"
        resp, _ = request(server.endpoint, "HEAD", f"/datasets/{REPO}/resolve/main/nope.txt")
        assert resp.status == 404 and resp.getheader("X-Error-Code") == "EntryNotFound"


def test_tree_listing_paginates_with_link_header(hub_files_dir: Path):
    with serve_in_background(hub_files_dir, REPO) as server:
        server.set_tree_page_size(2)
        url, seen = f"/api/datasets/{REPO}/tree/main?recursive=true", []
        while url:
            resp, body = request(server.endpoint, "GET", url)
            assert resp.status == 200
            seen += json.loads(body)
            link = resp.getheader("Link")
            url = link.split(">")[0].lstrip("<") if link else ""
        files = {e["path"]: e for e in seen if e["type"] == "file"}
        assert len(files) == 4
        assert {e["path"] for e in seen if e["type"] == "directory"} == {"data", "meta"}
        shard = hub_files_dir / "data" / "train-00001-of-00002.parquet"
        assert (
            files["data/train-00001-of-00002.parquet"]["lfs"]["oid"]
            == hashlib.sha256(shard.read_bytes()).hexdigest()
        )


def test_gating_and_fault_injection(hub_files_dir: Path):
    faults = Faults()
    with serve_with_faults(hub_files_dir, REPO, faults, token="hf_secret_test") as server:
        path = f"/datasets/{REPO}/resolve/main/data/train-00000-of-00002.parquet"
        assert request(server.endpoint, "HEAD", path)[0].status == 401
        assert request(server.endpoint, "HEAD", path, {"Authorization": "Bearer wrong"})[0].status == 403
        resp, _ = request(server.endpoint, "HEAD", path, {"Authorization": "Bearer hf_secret_test"})
        assert resp.status == 302
        location = resp.getheader("Location")

        faults.fail_503 = 2
        assert [request(server.endpoint, "GET", location)[0].status for _ in range(3)] == [503, 503, 200]

        faults.drop_count, faults.drop_after = 1, 50_000
        with pytest.raises(http.client.IncompleteRead):
            request(server.endpoint, "GET", location)
        resp, body = request(server.endpoint, "GET", location)
        assert resp.status == 200 and len(body) == 300_000

        faults.corrupt = {"data/train-00000-of-00002.parquet"}
        body = request(server.endpoint, "GET", location)[1]
        assert (
            body != (hub_files_dir / "data" / "train-00000-of-00002.parquet").read_bytes()
            and len(body) == 300_000
        )
        faults.corrupt = set()

        records = server.requests
        assert [r.sent for r in records if r.status == 200 and "/cdn/" in r.path][0] == 300_000
        assert any(r.sent == 50_000 for r in records)


def test_reuses_hashes_verified_by_the_downloader(tmp_path: Path):
    # data/hfd.sh leaves .hfd/verified.tsv; a 1 TB mirror must not be re-hashed at start-up
    (tmp_path / "a.parquet").write_bytes(b"x" * 1000)
    st = (tmp_path / "a.parquet").stat()
    (tmp_path / ".hfd").mkdir()
    fake = "ab" * 32
    mtime = subprocess.run(
        ["stat", "-c", "%.9Y", str(tmp_path / "a.parquet")], capture_output=True, text=True
    ).stdout.strip()
    (tmp_path / ".hfd" / "verified.tsv").write_text(f"a.parquet\t1000\t{mtime}\tsha256\t{fake}\n")
    with serve_in_background(tmp_path, REPO) as server:
        assert server.repo.files["a.parquet"].sha256 == fake
    os.utime(tmp_path / "a.parquet", (st.st_atime, st.st_mtime + 10))  # changed since: hash again
    with serve_in_background(tmp_path, REPO) as server:
        assert server.repo.files["a.parquet"].sha256 == hashlib.sha256(b"x" * 1000).hexdigest()


def test_symlinks_leaving_the_root_are_not_served(tmp_path: Path):
    (tmp_path / "root").mkdir()
    (tmp_path / "secret.txt").write_text("not for clients")
    (tmp_path / "root" / "leak.txt").symlink_to(tmp_path / "secret.txt")
    (tmp_path / "root" / "ok.txt").write_text("fine")
    with serve_in_background(tmp_path / "root", REPO) as server:
        assert sorted(server.repo.files) == ["ok.txt"]
        assert request(server.endpoint, "GET", f"/datasets/{REPO}/resolve/main/leak.txt")[0].status == 404


HF_CLIENT = r"""
import json, sys
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
repo, out, cache = sys.argv[1:4]
try:
    snap = snapshot_download(repo, repo_type="dataset", local_dir=out, cache_dir=cache)
except Exception as e:  # report the client's own error class
    print(json.dumps({"error": type(e).__name__}))
    sys.exit(0)
one = hf_hub_download(repo, "data/train-00001-of-00002.parquet", repo_type="dataset", cache_dir=cache)
api = HfApi()
tree = sorted(e.path for e in api.list_repo_tree(repo, repo_type="dataset", recursive=True))
info = api.dataset_info(repo, files_metadata=True)
print(json.dumps({"snapshot": snap, "one": one, "tree": tree,
                  "lfs": {s.rfilename: s.lfs.sha256 for s in info.siblings if s.lfs}}))
"""


def run_hf_client(endpoint: str, tmp_path: Path, token: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(
        HF_ENDPOINT=endpoint,
        HF_HOME=str(tmp_path / "hfhome"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_XET="1",
    )
    if token:
        env["HF_TOKEN"] = token
    out = subprocess.run(
        [sys.executable, "-c", HF_CLIENT, REPO, str(tmp_path / "snap"), str(tmp_path / "cache")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_real_huggingface_hub_client_downloads_from_it(hub_files_dir: Path, tmp_path: Path):
    with serve_in_background(hub_files_dir, REPO, token="hf_client_token") as server:
        assert run_hf_client(server.endpoint, tmp_path, token=None) == {"error": "GatedRepoError"}
        server.set_tree_page_size(3)  # the client must follow the Link header
        got = run_hf_client(server.endpoint, tmp_path, token="hf_client_token")
        records = server.requests
    for rel in (
        "README.md",
        "meta/info.json",
        "data/train-00000-of-00002.parquet",
        "data/train-00001-of-00002.parquet",
    ):
        assert (Path(got["snapshot"]) / rel).read_bytes() == (hub_files_dir / rel).read_bytes()
    assert Path(got["one"]).read_bytes() == (hub_files_dir / "data/train-00001-of-00002.parquet").read_bytes()
    assert got["tree"] == [
        "README.md",
        "data",
        "data/train-00000-of-00002.parquet",
        "data/train-00001-of-00002.parquet",
        "meta",
        "meta/info.json",
    ]
    shard = hub_files_dir / "data/train-00000-of-00002.parquet"
    assert got["lfs"]["data/train-00000-of-00002.parquet"] == hashlib.sha256(shard.read_bytes()).hexdigest()
    cdn = [r for r in records if r.path.startswith("/cdn/")]
    assert cdn and all(r.host.startswith("localhost:") for r in cdn)
    # the client drops the token when the redirect leaves the hub's host; so must we
    assert not any(r.authorization for r in cdn)


def test_cli_serves_and_writes_port_file(hub_files_dir: Path, tmp_path: Path):
    port_file = tmp_path / "endpoint.txt"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "src.open_alip.hub_server",
            "--root",
            str(hub_files_dir),
            "--repo-id",
            REPO,
            "--port-file",
            str(port_file),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(300):
            if port_file.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        endpoint = port_file.read_text().strip()
        resp, body = request(endpoint, "GET", f"/api/datasets/{REPO}")
        assert resp.status == 200 and json.loads(body)["id"] == REPO
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"export HF_ENDPOINT={endpoint}" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--root", "/nonexistent/dir", "--repo-id", "a/b"], "--root /nonexistent/dir is not a folder"),
        (["--root", ".", "--repo-id", "noslash"], "--repo-id 'noslash' must look like ORG/NAME"),
        (
            ["--root", ".", "--repo-id", "a/b", "--port-file", "/missing/dir/pf"],
            "--port-file /missing/dir/pf: folder /missing/dir does not exist",
        ),
        (
            ["--root", ".", "--repo-id", "a/b", "--host", "no-such-host.invalid"],
            "cannot resolve --host 'no-such-host.invalid'",
        ),
        (
            ["--root", ".", "--repo-id", "a/b", "--host", "192.0.2.1"],  # TEST-NET-1: never this machine's
            "--host 192.0.2.1 is not an address of this machine",
        ),
    ],
)
def test_cli_bad_input_is_one_line(args: list[str], message: str):
    out = subprocess.run(
        [sys.executable, "-m", "src.open_alip.hub_server", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert message in out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cli_port_in_use_says_pick_another_port(hub_files_dir: Path):
    with serve_in_background(hub_files_dir, REPO) as server:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "src.open_alip.hub_server",
                "--root",
                str(hub_files_dir),
                "--repo-id",
                REPO,
                "--port",
                str(server.port),
            ],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert out.returncode == 1
    assert (
        out.stderr
        == f"python -m src.open_alip.hub_server: error: port {server.port} on 127.0.0.1 is in use; "
        "pick another --port (0: any free port)\n"
    )
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-99", (0, 100)),
        ("bytes=10-", (10, 100)),
        ("bytes=10-10", (10, 11)),
        ("bytes=90-500", (90, 100)),  # past the end: cut at the end
        ("bytes=99-", (99, 100)),
        ("bytes=-10", (90, 100)),  # suffix: the last 10 bytes
        ("bytes=-500", (0, 100)),  # a suffix longer than the file is the whole file
        ("BYTES=5-6", (5, 7)),  # the unit is case-insensitive
        ("bytes=5-6, ", (5, 7)),  # empty list elements are ignored
        # invalid: ignored, the whole file is sent (RFC 9110 §14.1.1, §14.2)
        ("bytes=5-3", None),
        ("bytes=-", None),
        ("bytes=abc", None),
        ("bytes=a-5", None),
        ("bytes=+5-6", None),
        ("bytes=5", None),
        ("bytes=١-٢", None),  # non-ASCII digits
        ("items=0-5", None),  # a unit we do not serve
        ("bytes 0-5", None),
        ("", None),
        # several ranges: multipart answers are not implemented, so the whole file
        ("bytes=0-1,5-6", None),
        ("bytes=0-1, 500-600", None),
    ],
)
def test_parse_range(header, expected):
    assert parse_range(header, 100) == expected


@pytest.mark.parametrize(
    ("header", "size"), [("bytes=100-", 100), ("bytes=100-200", 100), ("bytes=-0", 100), ("bytes=0-", 0)]
)
def test_parse_range_unsatisfiable(header, size):
    with pytest.raises(RangeNotSatisfiable):
        parse_range(header, size)


def test_parse_range_suffix_of_an_empty_file_is_the_whole_file():
    # a 206 for an empty file could name no byte in its Content-Range
    assert parse_range("bytes=-5", 0) is None


def test_invalid_range_is_ignored_and_the_whole_body_sent(hub_files_dir: Path):
    with serve_in_background(hub_files_dir, REPO) as server:
        resp, body = request(
            server.endpoint, "GET", f"/datasets/{REPO}/resolve/main/README.md", {"Range": "bytes=5-3"}
        )
    assert resp.status == 200 and body == b"# tiny\n" and resp.getheader("Content-Range") is None


@pytest.mark.parametrize("cursor", ["abc", "-2", "1.5", "%20"])
def test_tree_listing_refuses_a_bad_cursor(hub_files_dir: Path, cursor: str):
    with serve_in_background(hub_files_dir, REPO) as server:
        server.set_tree_page_size(2)
        resp, body = request(
            server.endpoint, "GET", f"/api/datasets/{REPO}/tree/main?recursive=true&cursor={cursor}"
        )
        assert resp.status == 400 and b"Invalid cursor" in body
        assert "Link header" in resp.getheader("X-Error-Message")
        # the connection stays usable, and a good cursor still pages
        resp, body = request(
            server.endpoint, "GET", f"/api/datasets/{REPO}/tree/main?recursive=true&cursor=2"
        )
        assert resp.status == 200 and len(json.loads(body)) == 2


@pytest.mark.parametrize(
    "path",
    [
        f"/datasets/{REPO}/resolve/%ff/README.md",  # a revision that is not UTF-8
        f"/datasets/{REPO}/resolve/main%0d%0aX-Injected:%201/README.md",  # a line break into the error header
        f"/datasets/{REPO}/resolve/main/%ff.md",
        f"/api/datasets/{REPO}/tree/%ff",
        f"/api/datasets/{REPO}/tree/main?recursive=true&cursor={'9' * 5000}",  # past int()'s digit limit
    ],
)
def test_malformed_requests_get_400_with_one_line(hub_files_dir: Path, path: str, capfd):
    # Once: a traceback on the server and a dropped connection.
    with serve_in_background(hub_files_dir, REPO) as server:
        resp, body = request(server.endpoint, "GET", path)
        assert resp.status == 400, (resp.status, body)
        assert body.count(b"\n") == 1 and resp.getheader("X-Injected") is None
        assert "\n" not in resp.getheader("X-Error-Message")
        resp, body = request(
            server.endpoint, "GET", f"/datasets/{REPO}/resolve/main/README.md"
        )  # still serving
        assert resp.status == 200 and body == b"# tiny\n"
    assert "Traceback" not in capfd.readouterr().err


def test_a_file_changed_or_deleted_after_start_is_served_as_it_is_now(tmp_path: Path):
    # Once: the old Content-Length, fewer bytes, and the connection kept open (clients stalled); a
    # deleted file was a 200 line and then a broken body.
    root = tmp_path / "repo"
    root.mkdir()
    (root / "README.md").write_text("# a readme of some length\n")
    (root / "gone.md").write_text("soon gone\n")
    (root / "data.parquet").write_bytes(bytes(range(256)) * 400)  # an LFS file, through the "CDN"
    with serve_in_background(root, REPO) as server:
        (root / "README.md").write_text("# short\n")
        (root / "data.parquet").write_bytes(b"cut")
        (root / "gone.md").unlink()
        resp, body = request(server.endpoint, "GET", f"/datasets/{REPO}/resolve/main/README.md")
        assert resp.status == 200 and body == b"# short\n"
        resp, _ = request(server.endpoint, "GET", f"/datasets/{REPO}/resolve/main/data.parquet")
        assert resp.status == 302
        resp, body = request(server.endpoint, "GET", resp.getheader("Location"))
        assert resp.status == 200 and body == b"cut"
        resp, body = request(
            server.endpoint,
            "GET",
            resp.getheader("Location") or server.requests[-1].path,
            {"Range": "bytes=1000-"},
        )
        assert resp.status == 416 and resp.getheader("Content-Range") == "bytes */3"
        resp, body = request(server.endpoint, "GET", f"/datasets/{REPO}/resolve/main/gone.md")
        assert resp.status == 404 and b"no longer" in body


def test_request_log_is_bounded(hub_files_dir: Path):
    with serve_in_background(hub_files_dir, REPO, log_size=3) as server:
        for i in range(5):
            request(server.endpoint, "HEAD", f"/datasets/{REPO}/resolve/main/nope-{i}")
        assert [r.path.rsplit("-", 1)[1] for r in server.requests] == ["2", "3", "4"]


def test_without_range_support_the_whole_body_comes_back(hub_files_dir: Path):
    faults = Faults(ignore_range=True)
    with serve_with_faults(hub_files_dir, REPO, faults) as server:
        resp, body = request(
            server.endpoint, "GET", f"/datasets/{REPO}/resolve/main/README.md", {"Range": "bytes=2-"}
        )
    assert resp.status == 200 and body == b"# tiny\n" and resp.getheader("Accept-Ranges") is None


def test_hub_server_does_not_load_the_model_stack():
    # A mirror machine needs no torch: the content ids come from src/open_alip/hashes.py alone.
    code = "import sys, src.open_alip.hub_server; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)
