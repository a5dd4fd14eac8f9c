"""`hf-hub:` weights with HF_ENDPOINT unset, the normal case (issue 24.1).

Each load runs in a fresh interpreter: in the test process something may already have imported
`huggingface_hub.constants`, which hid a crash on reading the default endpoint. The hub cache is
filled from the project's hub server; huggingface.co itself is never contacted: offline, the cache
answers, and online a stand-in proxy on 127.0.0.1 receives the request and drops it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from src.open_alip.hub_server import serve_in_background
from src.open_alip.pretrained import download_from_hub
from tests._repo import REPO as REPO_ROOT
from tests.conftest import save_safetensors

REPO = "testorg/rwkv-clip-tiny"

_LOAD = """
import sys, torch
from safetensors.torch import load_file
from src.open_alip import create_model_and_transforms
from src.open_alip.errors import OpenAlipError
try:
    model, _, _ = create_model_and_transforms("RWKV_CLIP_tiny", pretrained=sys.argv[1])
except OpenAlipError as exc:
    print("ERROR", exc)
    raise SystemExit(1)
expected = load_file(sys.argv[2])
own = model.state_dict()
same = own.keys() == expected.keys() and all(torch.equal(own[k], expected[k]) for k in own)
print("SAME" if same else "DIFFERENT")
"""


def _clean_env(hf_home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any hub or proxy setting, plus `extra`."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING_FACE")) and "proxy" not in k.lower()
    }
    env.update(HF_HOME=str(hf_home), HF_HUB_DISABLE_TELEMETRY="1", **extra)
    return env


def _load(spec: str, weights: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _LOAD, spec, str(weights)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def filled_cache(tmp_path, tiny_weights, monkeypatch) -> tuple[Path, Path]:
    """(HF_HOME whose hub cache holds the repo's weights, the weights file served)."""
    root = tmp_path / "repo"
    root.mkdir()
    weights = save_safetensors(tiny_weights.model, root / "model.safetensors")
    hf_home = tmp_path / "hf_home"
    for name in list(os.environ):
        if name.startswith(("HF_", "HUGGING_FACE")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HOME", str(hf_home))
    with serve_in_background(root, REPO, repo_type="model") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        download_from_hub(f"hf-hub:{REPO}")
    return hf_home, weights


@pytest.fixture
def dropping_proxy() -> Iterator[tuple[str, list[bytes]]]:
    """(proxy URL, the first line of each request it got): a proxy that closes every connection."""
    seen: list[bytes] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                seen.append(conn.recv(4096).split(b"\r\n", 1)[0])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}", seen
    finally:
        try:
            server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        except OSError:
            pass
        server.close()
        thread.join(timeout=10)


def test_offline_from_the_cache_without_hf_endpoint(filled_cache):
    hf_home, weights = filled_cache
    for spec in (f"hf-hub:{REPO}", f"hf-hub:{REPO}/model.safetensors"):
        done = _load(spec, weights, _clean_env(hf_home, HF_HUB_OFFLINE="1"))
        assert done.returncode == 0 and done.stdout.strip() == "SAME", done.stdout + done.stderr[-3000:]


def test_default_endpoint_is_named_and_only_the_local_proxy_is_asked(filled_cache, dropping_proxy):
    hf_home, weights = filled_cache
    proxy, seen = dropping_proxy
    done = _load(f"hf-hub:{REPO}", weights, _clean_env(hf_home, HTTPS_PROXY=proxy, HTTP_PROXY=proxy))
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert done.stdout.startswith(f"ERROR hf-hub:{REPO}: cannot reach https://huggingface.co (")
    assert "HF_HUB_OFFLINE=1" in done.stdout
    assert seen and all(line == b"CONNECT huggingface.co:443 HTTP/1.1" for line in seen)
