"""Released weights by tag (`list_pretrained`, `pretrained="yfcc15m"`, `create_model_from_pretrained`),
and the config a checkpoint records: used when none is passed, named when the one passed does not
fit, checked before any model is built (issue 24 items 2 and 4).

Hub repos are served by the project's hub server on 127.0.0.1 (HF_ENDPOINT), never huggingface.co.
"""

from __future__ import annotations

import ast
import json

import pytest
import torch

from src.open_alip import (
    create_model_and_transforms,
    create_model_from_pretrained,
    get_pretrained_cfg,
    list_pretrained,
    register_pretrained,
)
from src.open_alip import released as released_module
from src.open_alip.errors import ChecksumError, ModelConfigError, PretrainedError, WeightsMismatchError
from src.open_alip.hashes import file_sha256
from src.open_alip.hub_server import serve_in_background
from src.open_alip.model import get_model_config
from tests._repo import REPO as REPO_ROOT

TINY = "RWKV_CLIP_tiny"


@pytest.fixture
def registered():
    """register_pretrained, with the records it adds removed afterwards."""
    before = list(released_module._RELEASED)
    yield register_pretrained
    released_module._RELEASED[:] = before


def _same(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    own = model.state_dict()
    return own.keys() == state.keys() and all(torch.equal(own[k], state[k]) for k in own)


def _train_checkpoint(state: dict[str, torch.Tensor], config: str) -> dict:
    """What train.py saves (src/training/state.py), with the parts a loader ignores left empty."""
    cfg = get_model_config(config)
    return {
        "state_dict": state,
        "master_params": {},
        "optimizer": {},
        "step": 1,
        "epoch": 0,
        "epoch_step": 1,
        "config": cfg,
        "run": {"config": config, "model": cfg, "lr": 1e-3},
    }


def test_the_released_checkpoints_are_listed_as_open_clip_lists_them():
    assert list_pretrained() == [
        ("RWKV_CLIP_B16", "laion10m"),
        ("RWKV_CLIP_B32", "laion10m"),
        ("RWKV_CLIP_B32", "laion30m"),
        ("RWKV_CLIP_B32", "yfcc15m"),
    ]
    assert "RWKV_CLIP_B32:yfcc15m" in list_pretrained(as_str=True)
    b32 = get_pretrained_cfg("RWKV_CLIP_B32", "YFCC15M")
    assert (b32.hub_repo, b32.filename, b32.sha256) == (
        "Kaichengalex/RWKV-CLIP-B32-YFCC15M",
        "model_31.pt",
        None,
    )
    assert b32.hub_spec == "hf-hub:Kaichengalex/RWKV-CLIP-B32-YFCC15M/model_31.pt"
    assert {e.hub_repo for e in list_pretrained(details=True)} == {
        "Kaichengalex/RWKV-CLIP-B32-YFCC15M",
        "Kaichengalex/RWKV-CLIP-B32-LAION10M",
        "Kaichengalex/RWKV-CLIP-B32-LAION30M",
        "Kaichengalex/RWKV-CLIP-B16-LAION10M",
    }
    with pytest.raises(
        PretrainedError, match="'yfcc15m' is not released for model RWKV_CLIP_B16; its tags: laion10m"
    ):
        create_model_and_transforms("RWKV_CLIP_B16", pretrained="yfcc15m")


def test_b32_by_tag_fetches_model_31_from_its_repo_and_checks_it_before_building(
    tmp_path, tiny_weights, hub_env, monkeypatch
):
    # The repo, named as released, holds the tiny weights: the tag must reach the file, and the
    # mismatch must be found from the shapes (a B/32 is never built).
    root = tmp_path / "b32"
    root.mkdir()
    torch.save(tiny_weights.model.state_dict(), root / "model_31.pt")
    with serve_in_background(root, "Kaichengalex/RWKV-CLIP-B32-YFCC15M", repo_type="model") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        with pytest.raises(WeightsMismatchError) as e:
            create_model_and_transforms("RWKV_CLIP_B32", pretrained="yfcc15m")
        assert any(r.path.endswith("/model_31.pt") for r in server.requests)
    text = str(e.value)
    assert "\n" not in text and text.startswith(
        "weights RWKV_CLIP_B32:yfcc15m (hf-hub:Kaichengalex/RWKV-CLIP-B32-YFCC15M/"
    )
    assert "do not fit model RWKV_CLIP_B32 (" in text and "missing keys" in text
    assert text.endswith("; they fit RWKV_CLIP_tiny: pass that config")


def test_a_registered_tag_with_its_sha256(tmp_path, tiny_weights, hub_env, monkeypatch, registered):
    root = tmp_path / "repo"
    root.mkdir()
    state = tiny_weights.model.state_dict()
    torch.save(state, root / "model_31.pt")
    digest = file_sha256(root / "model_31.pt")
    with serve_in_background(root, "testorg/tiny", repo_type="model") as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        registered(TINY, "Shapes", "testorg/tiny", "model_31.pt", sha256=digest)
        assert (TINY, "shapes") in list_pretrained()
        model, preprocess = create_model_from_pretrained(TINY, "shapes")
        assert _same(model, state) and preprocess.size == 32 and not model.training
        registered(TINY, "shapes", "testorg/tiny", "model_31.pt", sha256="0" * 64)
        with pytest.raises(ChecksumError, match="the repo was changed"):
            create_model_and_transforms(TINY, pretrained="shapes")
    with pytest.raises(PretrainedError, match="no weights given"):
        create_model_from_pretrained(TINY)
    with pytest.raises(PretrainedError, match="64 lower-case hex"):
        registered(TINY, "x", "testorg/tiny", "model_31.pt", sha256="abc")


def test_the_config_a_training_checkpoint_records(tmp_path, tiny_weights):
    state = tiny_weights.model.state_dict()
    ckpt = tmp_path / "step_000000001.pt"
    torch.save(_train_checkpoint(state, TINY), ckpt)
    model, _, preprocess_val = create_model_and_transforms(pretrained=ckpt)  # no config: the recorded one
    assert _same(model, state) and model.config == get_model_config(TINY) and preprocess_val.size == 32

    with pytest.raises(WeightsMismatchError) as e:
        create_model_and_transforms("RWKV_CLIP_demo", pretrained=ckpt)
    text = str(e.value)
    assert "\n" not in text and "do not fit model RWKV_CLIP_demo" in text
    assert text.endswith(
        "they hold their own config (RWKV_CLIP_tiny): pass no config to use it, or RWKV_CLIP_tiny"
    )

    # Weights that record no config: the one shipped config of their shapes, said as such.
    bare = tmp_path / "bare.pt"
    torch.save(state, bare)
    model, _, _ = create_model_and_transforms(pretrained=bare)
    assert _same(model, state) and model.config_source == f"{TINY}, the one shipped config the weights fit"
    assert create_model_and_transforms(pretrained=ckpt)[0].config_source == f"{TINY}, recorded in the weights"
    odd = tmp_path / "odd.pt"
    torch.save({**state, "text_model.blocks.9.ln1.weight": torch.ones(64)}, odd)
    with pytest.raises(
        ModelConfigError,
        match=r"no model config given and weights .*odd.pt record none \(they fit "
        r"no shipped config\); pass a config name",
    ):
        create_model_and_transforms(pretrained=odd)
    with pytest.raises(WeightsMismatchError) as e:  # the counts and the config they fit, for a command line
        create_model_and_transforms("RWKV_CLIP_demo", pretrained=bare)
    assert (e.value.fits, e.value.recorded, e.value.summary) == (TINY, False, "124 tensors of other shapes")


def test_params_json_is_a_config(tmp_path, tiny_weights):
    params = tmp_path / "params.json"  # as train.py writes it: run settings, the architecture under "model"
    params.write_text(
        json.dumps({"lr": 0.001, "batch_size": 4, "config": TINY, "model": get_model_config(TINY)})
    )
    model, _, _ = create_model_and_transforms(params, pretrained=tiny_weights.path)
    assert _same(model, tiny_weights.model.state_dict())


def test_weights_are_checked_against_the_config_before_the_model_is_built(tiny_weights):
    # A text embedding of 10**11 rows: building this model would need 25 TB, so reaching the
    # mismatch error at all shows that the shapes were compared first.
    with pytest.raises(
        WeightsMismatchError,
        match=r"text_model.emb.weight \(checkpoint \(49408, 64\), model \(100000000000, 64\)\)",
    ):
        create_model_and_transforms(TINY, pretrained=tiny_weights.path, vocab_size=10**11)


def test_the_readme_loads_the_released_b32_by_its_tag_in_three_lines():
    section = (REPO_ROOT / "README.md").read_text().split("## Use the model", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(code) == 3 and "create_model_and_transforms(" in code[1] and "get_tokenizer(" in code[2]
    call = ast.parse(code[1]).body[0].value
    config, tag = call.args[0].value, next(k.value.value for k in call.keywords if k.arg == "pretrained")
    assert (config, tag) == ("RWKV_CLIP_B32", "yfcc15m") and (config, tag) in list_pretrained()
