"""export_hub.py -> `python -m src.open_alip.hub_server` -> create_model_and_transforms("hf-hub:ORG/REPO") and
get_tokenizer("hf-hub:ORG/REPO"): the architecture travels in the repo's open_clip_config.json
(issue 24.3). Everything runs as a user runs it: the CLIs as subprocesses, the real hub client."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from src.open_alip import create_model_and_transforms, create_model_from_pretrained, get_tokenizer
from src.open_alip.errors import ModelConfigError
from src.open_alip.hub_server import serve_in_background
from src.open_alip.model import get_model_config
from tests._hub_process import hub_server_cli
from tests._repo import REPO as REPO_ROOT
from tests.conftest import save_safetensors

TINY = "RWKV_CLIP_tiny"
REPO = "testorg/exported"


def _export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "export_hub.py", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )


def _same(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    own = model.state_dict()
    return own.keys() == state.keys() and all(torch.equal(own[k], state[k]) for k in own)


def test_export_serve_and_load_back(tmp_path, tiny_weights, hub_env, monkeypatch):
    state = tiny_weights.model.state_dict()
    cfg = get_model_config(TINY)
    ckpt = tmp_path / "epoch_002.pt"  # what train.py saves (src/training/state.py), trimmed
    torch.save(
        {
            "state_dict": state,
            "master_params": {},
            "optimizer": {},
            "step": 40,
            "epoch": 2,
            "epoch_step": 0,
            "config": cfg,
            "run": {
                "config": TINY,
                "model": cfg,
                "lr": 0.001,
                "epochs": 2,
                "batch_size": 8,
                "train_data": ["/data/shapes"],
                "precision": "bf16",
            },
        },
        ckpt,
    )
    results = tmp_path / "zero_shot.json"
    results.write_text(json.dumps({"shapes": {"top1": 0.625, "top5": 1.0}}))
    out = tmp_path / "rwkv-clip-tiny"

    done = _export(str(ckpt), "--output", str(out), "--results", str(results))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",
        "model.safetensors",
        "open_clip_config.json",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left
    hub_cfg = json.loads((out / "open_clip_config.json").read_text())
    assert hub_cfg["model_cfg"] == cfg and hub_cfg["preprocess_cfg"]["image_size"] == 32
    card = (out / "README.md").read_text()
    assert "architecture RWKV_CLIP_tiny" in card and "| lr | 0.001 |" in card and "| step | 40 |" in card
    assert "| zero_shot.shapes.top1 | 0.625 |" in card

    again = _export(str(ckpt), "--output", str(out))
    assert (
        again.returncode == 2
        and again.stderr.strip() == f"export_hub.py: error: output {out} already exists; pass a new folder"
    )

    with hub_server_cli(out, REPO, tmp_path / "endpoint.txt", "--repo-type", "model") as endpoint:
        monkeypatch.setenv("HF_ENDPOINT", endpoint)
        model, _, preprocess_val = create_model_and_transforms(f"hf-hub:{REPO}")
        assert _same(model, state) and model.config == cfg and preprocess_val.size == 32
        model, _, _ = create_model_and_transforms(
            pretrained=f"hf-hub:{REPO}"
        )  # weights named alone: the repo's config
        assert _same(model, state) and model.config_source == f"the config of hf-hub:{REPO}"
        tokenizer = get_tokenizer(f"hf-hub:{REPO}")
        assert tokenizer(["a red square"]).shape == (1, 77)
        model, preprocess = create_model_from_pretrained(f"hf-hub:{REPO}", precision="bf16")
        assert next(model.parameters()).dtype == torch.bfloat16 and preprocess.size == 32


def test_a_repo_without_a_config_and_an_export_without_one(tmp_path, tiny_weights, hub_env, monkeypatch):
    root = tmp_path / "bare"
    root.mkdir()
    save_safetensors(tiny_weights.model, root / "model.safetensors")
    with serve_in_background(root, REPO, repo_type="model") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        with pytest.raises(
            ModelConfigError,
            match="the repo has no open_clip_config.json; pass a config name .* and "
            f"pretrained=hf-hub:{REPO}",
        ):
            create_model_and_transforms(f"hf-hub:{REPO}")
        model, _, _ = create_model_and_transforms(
            TINY, pretrained=f"hf-hub:{REPO}"
        )  # the config passed instead
        assert _same(model, tiny_weights.model.state_dict())
        model, _, _ = create_model_and_transforms(pretrained=f"hf-hub:{REPO}")  # or the shipped one they fit
        assert _same(model, tiny_weights.model.state_dict()) and model.config_source.startswith(TINY)

    done = _export(
        str(tiny_weights.path), "--output", str(tmp_path / "out")
    )  # a bare state dict records no config
    assert done.returncode == 2 and "record no model config; pass --config NAME" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()
    done = _export(str(tiny_weights.path), "--output", str(tmp_path / "out"), "--config", TINY)
    assert done.returncode == 0, done.stderr
    assert "Training" not in (tmp_path / "out" / "README.md").read_text()  # nothing recorded, nothing claimed
