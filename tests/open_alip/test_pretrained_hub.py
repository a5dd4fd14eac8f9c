"""Weights through `hf-hub:` from the project's own hub server, with the real huggingface_hub client:
the server run as a private model hub (`python -m src.open_alip.hub_server --repo-type model`), the hub
cache, offline use, sha256 checks against a corrupting server, and the one-line errors."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch

from src.open_alip import create_model_and_transforms
from src.open_alip.errors import ChecksumError, HubError, PretrainedError, WeightsNotFoundError
from src.open_alip.hashes import file_sha256
from src.open_alip.hub_server import serve_in_background
from src.open_alip.pretrained import download_from_hub
from tests._hub_faults import Faults, serve_with_faults
from tests._hub_process import hub_server_cli
from tests.conftest import save_safetensors

TINY = "RWKV_CLIP_tiny"
REPO = "testorg/rwkv-clip-tiny"
TOKEN = "hf_private_hub_token"


@pytest.fixture
def tiny_model(tiny_weights):
    return tiny_weights.model


@pytest.fixture
def model_repo_dir(tmp_path, tiny_model) -> Path:
    root = tmp_path / "model_repo"
    root.mkdir()
    save_safetensors(tiny_model, root / "model.safetensors")
    (root / "README.md").write_text("# RWKV-CLIP tiny (test weights)\n")
    (root / "open_clip_config.json").write_text("{}\n")
    return root


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert text and "\n" not in text
    return text


def test_private_model_hub_from_the_cli(model_repo_dir, tiny_model, hub_env, monkeypatch, tmp_path):
    with hub_server_cli(
        model_repo_dir,
        REPO,
        tmp_path / "endpoint.txt",
        "--repo-type",
        "model",
        env={**os.environ, "HUB_SERVER_TOKEN": TOKEN},
    ) as endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)

        with pytest.raises(HubError) as e:  # a private hub: no token, no weights
            create_model_and_transforms(TINY, pretrained=f"hf-hub:{REPO}")
        assert "(HTTP 401); set HF_TOKEN" in _one_line(e)
        monkeypatch.setenv("HF_TOKEN", "hf_wrong")
        with pytest.raises(HubError, match=r"refused access \(HTTP 403\)"):
            download_from_hub(f"hf-hub:{REPO}")

        monkeypatch.setenv("HF_TOKEN", TOKEN)
        model, _, preprocess_val = create_model_and_transforms(TINY, pretrained=f"hf-hub:{REPO}")
        assert _same_weights(model, tiny_model) and preprocess_val.size == 32
        path = download_from_hub(f"hf-hub:{REPO}/model.safetensors")
        # in the hub cache (HF_HOME), stored under its sha256
        assert hub_env in path.resolve().parents or hub_env.resolve() in path.resolve().parents
        assert path.resolve().name == file_sha256(model_repo_dir / "model.safetensors")

        with pytest.raises(HubError) as e:
            download_from_hub("hf-hub:testorg/no-such-repo")
        assert "no such model repo" in _one_line(e) and "HTTP 404" in str(e.value)
        with pytest.raises(WeightsNotFoundError) as e:
            download_from_hub(f"hf-hub:{REPO}/weights/missing.pt")
        assert "no file 'weights/missing.pt'" in _one_line(e) and "model.safetensors" in str(e.value)

    # The server is gone: offline, the cache answers; online, the client says it cannot reach the hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, _, _ = create_model_and_transforms(TINY, pretrained=f"hf-hub:{REPO}")
    assert _same_weights(model, tiny_model)
    with pytest.raises(HubError, match="HF_HUB_OFFLINE is set and the file is not in the hub cache"):
        download_from_hub(f"hf-hub:{REPO}/README.md")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with pytest.raises(HubError) as e:
        download_from_hub(f"hf-hub:{REPO}")
    assert "cannot reach http://127.0.0.1:" in _one_line(e)


def test_downloads_are_checked_against_the_hubs_sha256(
    model_repo_dir, tiny_model, hub_env, monkeypatch, tmp_path
):
    cache = tmp_path / "explicit_cache"
    faults = Faults(corrupt={"model.safetensors"})  # the server flips the first byte of the body
    with serve_with_faults(model_repo_dir, REPO, faults, repo_type="model") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        with pytest.raises(ChecksumError) as e:
            download_from_hub(f"hf-hub:{REPO}", cache_dir=cache)
        assert "removed it from the cache" in _one_line(e)
        assert not [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size > 1_000_000]
        assert sum("/cdn/" in r.path for r in server.requests) == 2  # one retry, then the error

        faults.corrupt = set()
        model, _, _ = create_model_and_transforms(TINY, pretrained=f"hf-hub:{REPO}", cache_dir=cache)
        assert _same_weights(model, tiny_model)
        downloads = sum("/cdn/" in r.path for r in server.requests)
        download_from_hub(f"hf-hub:{REPO}", cache_dir=cache)  # from the cache: no new body transfer
        assert sum("/cdn/" in r.path for r in server.requests) == downloads
        assert not (hub_env).exists()  # cache_dir replaced the default cache


def test_which_file_a_bare_repo_means(tmp_path, hub_env, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    (root / "a.pt").write_bytes(b"1")
    (root / "b.bin").write_bytes(b"2")
    with serve_in_background(root, REPO, repo_type="model") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        with pytest.raises(PretrainedError) as e:
            download_from_hub(f"hf-hub:{REPO}")
        assert f"several weights files (a.pt, b.bin); name one as hf-hub:{REPO}/FILE" in _one_line(e)
        (root / "model.safetensors").write_bytes(b"3")
    with serve_in_background(root, REPO, repo_type="model") as server:  # a lone .safetensors wins
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        assert download_from_hub(f"hf-hub:{REPO}").read_bytes() == b"3"
        # a small (non-LFS) file is checked against its git blob id
        (root / "notes.txt").write_text("x")
    with serve_in_background(root, REPO, repo_type="model") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        assert download_from_hub(f"hf-hub:{REPO}/notes.txt").read_text() == "x"
    for name in ("a.pt", "b.bin", "model.safetensors"):
        (root / name).unlink()
    with serve_in_background(root, REPO, repo_type="model") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        with pytest.raises(WeightsNotFoundError, match="the repo has no weights file"):
            download_from_hub(f"hf-hub:{REPO}")


def test_unreachable_hub_fails_fast_and_in_one_line(hub_env, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(HubError) as e:
        download_from_hub(f"hf-hub:{REPO}")
    assert f"cannot reach http://127.0.0.1:{port}" in _one_line(e) and "HF_HUB_OFFLINE=1" in str(e.value)


def test_credentials_in_hf_endpoint_never_reach_a_message(tmp_path, hub_env, monkeypatch):
    # A mirror behind basic auth: HF_ENDPOINT=http://user:password@host. The errors name the endpoint
    # without its user info, also where huggingface_hub's own message quotes the URL.
    secret = "pw-3kd9q"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://someone:{secret}@127.0.0.1:{port}")
    with pytest.raises(HubError) as e:
        download_from_hub(f"hf-hub:{REPO}")
    assert f"cannot reach http://127.0.0.1:{port}" in _one_line(e) and secret not in str(e.value)
    (tmp_path / "empty").mkdir()
    with serve_in_background(tmp_path / "empty", REPO, "model") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint.replace("http://", f"http://someone:{secret}@"))
        with pytest.raises(PretrainedError) as e:
            download_from_hub("hf-hub:testorg/missing")
    assert server.endpoint in _one_line(e) and secret not in str(e.value)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://u:pw@host:8080/x", "http://host:8080/x"),
        (
            "see https://user:p@ss@mirror.example/api?a=b@c and http://plain/x",
            "see https://mirror.example/api?a=b@c and http://plain/x",
        ),
        ("https://huggingface.co", "https://huggingface.co"),
        ("no url: a@b", "no url: a@b"),
    ],
)
def test_urls_lose_their_user_info(text, shown):
    from src.open_alip.urls import redact_urls

    assert redact_urls(text) == shown
