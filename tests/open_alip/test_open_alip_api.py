"""open_clip's entry points of the model library: create_model_and_transforms, get_tokenizer,
list_models, local weights in every accepted form, and the errors users meet."""

from __future__ import annotations

import ast
import copy
import io
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from dataloaders.shards import load_shards
from dataloaders.torch_loader import RecordDataset
from src.evaluation.datasets import ImageDataset
from src.open_alip import (
    create_model,
    create_model_and_transforms,
    get_model_config,
    get_tokenizer,
    list_models,
    load_pretrained,
    tokenize,
)
from src.open_alip.errors import (
    ModelConfigError,
    OpenAlipError,
    PretrainedError,
    WeightsMismatchError,
    WeightsNotFoundError,
)
from src.open_alip.transform import preprocess_pil
from tests._loader_helpers import write_shard
from tests._repo import REPO as REPO_ROOT

TINY = "RWKV_CLIP_tiny"


def _image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8))


@pytest.fixture(scope="module")
def tiny():
    """(model, preprocess_train, preprocess_val) of the tiny config, built once for the module."""
    torch.manual_seed(3)
    return create_model_and_transforms(TINY)


@pytest.fixture(scope="module")
def tiny_weights(tiny) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in tiny[0].state_dict().items()}


def _same_weights(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> bool:
    own = model.state_dict()
    return own.keys() == weights.keys() and all(torch.equal(own[k], weights[k].to(own[k].dtype)) for k in own)


# --- the API ---------------------------------------------------------------------------------


def test_model_and_transforms_shapes_and_dtypes(tiny):
    assert {"RWKV_CLIP_B32", "RWKV_CLIP_B16", TINY} <= set(list_models())
    model, preprocess_train, preprocess_val = tiny
    assert not model.training and all(p.dtype == torch.float32 for p in model.parameters())
    size = model.config["input_size"]
    img = _image(50, 37, 0)
    for transform in (preprocess_train, preprocess_val):
        x = transform(img)
        assert x.shape == (3, size, size) and x.dtype == torch.float32
    tokenizer = get_tokenizer(TINY)
    tokens = tokenizer(["a photo of a cat", "a dog"])
    assert tokens.shape == (2, 77) and tokens.dtype == torch.int64
    assert torch.equal(tokens, tokenize(["a photo of a cat", "a dog"]))
    assert tokenizer("one text").shape == (1, 77)
    with torch.no_grad():
        image_emb = model.encode_image(torch.stack([preprocess_val(img), preprocess_train(img)]))
        text_emb = model.encode_text(tokens)
    assert image_emb.shape == (2, model.embed_dim) and text_emb.shape == (2, model.embed_dim)
    assert image_emb.dtype == text_emb.dtype == torch.float32


def test_precision_and_device():
    model, _, _ = create_model_and_transforms(TINY, device="cpu", precision="bf16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert next(model.parameters()).device == torch.device("cpu")
    with pytest.raises(OpenAlipError, match="precision 'fp8' is unknown"):
        create_model_and_transforms(TINY, precision="fp8")
    with pytest.raises(OpenAlipError, match="device 'gpu0' is not a torch device"):
        create_model_and_transforms(TINY, device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(OpenAlipError, match="sees no CUDA GPU"):
            create_model_and_transforms(TINY, device="cuda:0")


def test_preprocess_val_is_the_evaluation_preprocessing(tmp_path, tiny):
    preprocess_val = tiny[2]
    size = preprocess_val.size
    for i, (w, h, mode) in enumerate([(50, 37, "RGB"), (20, 64, "RGB"), (32, 32, "L"), (200, 120, "RGBA")]):
        img = _image(w, h, i).convert(mode)
        path = tmp_path / f"{i}.png"
        img.save(path)
        with Image.open(path) as opened:
            got = preprocess_val(opened)
        # what zero_shot.py / retrieval.py feed the model for this file on a CPU
        evaluated, _ = ImageDataset([path], size=size)[0]
        assert torch.equal(got, evaluated)
        assert torch.equal(got, preprocess_pil(img, size))


def test_preprocess_train_is_the_torch_loaders_augmentation(tmp_path, tiny):
    write_shard(tmp_path / "data" / "s", range(6), size=(64, 48))
    preprocess_train = tiny[1]
    dataset = RecordDataset(
        load_shards(tmp_path / "data", cache_dir=tmp_path / "cache"), preprocess_train.size, train=True
    )
    for record, seed in [(0, 1), (3, 12345), (5, 2**62 + 7), (2, 99)]:
        loader_image, _ = dataset[(record, seed)]
        _, payload = dataset.read(record)
        with Image.open(io.BytesIO(payload)) as img:
            ours = preprocess_train(img, seed=seed)
        assert torch.equal(ours, loader_image)
    # Without an rng the draws follow torch's generator, like torchvision's transforms.
    img = _image(64, 48, 5)
    torch.manual_seed(7)
    first = [preprocess_train(img) for _ in range(4)]
    torch.manual_seed(7)
    again = [preprocess_train(img) for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not all(torch.equal(first[0], x) for x in first[1:])


# --- local weights ---------------------------------------------------------------------------


def test_local_weights_in_every_form(tmp_path, tiny, tiny_weights):
    prefixed = {f"module.{k}": v for k, v in tiny_weights.items()}
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())
    files = {
        "raw.pt": tiny_weights,
        "ddp.pt": prefixed,
        # the shape train.py saves: the model under "state_dict" beside the run's state
        "checkpoint.pt": {
            "state_dict": prefixed,
            "optimizer": optimizer.state_dict(),
            "step": 10,
            "epoch": 1,
            "args": {"lr": 0.001},
        },
    }
    for name, obj in files.items():
        torch.save(obj, tmp_path / name)
    save_file({k: v.contiguous() for k, v in tiny_weights.items()}, tmp_path / "raw.safetensors")
    save_file({k: v.contiguous() for k, v in prefixed.items()}, tmp_path / "ddp.safetensors")
    model, _, _ = create_model_and_transforms(TINY, pretrained=tmp_path / "checkpoint.pt")
    assert _same_weights(model, tiny_weights)
    for name in [*files, "raw.safetensors", "ddp.safetensors"]:
        blank = copy.deepcopy(tiny[0])
        with torch.no_grad():
            for p in blank.parameters():
                p.zero_()
        assert load_pretrained(blank, tmp_path / name) == tmp_path / name
        assert _same_weights(blank, tiny_weights), name


def _one_line_error(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text and text
    return text


def test_weight_and_config_errors_are_one_line(tmp_path, tiny_weights):
    with pytest.raises(WeightsNotFoundError) as e:
        create_model_and_transforms(TINY, pretrained=tmp_path / "nope.pt")
    assert "nope.pt does not exist" in _one_line_error(e)

    # weights of another architecture: one layer more, and wider text embeddings
    other = dict(tiny_weights)
    other["text_model.emb.weight"] = torch.zeros(49408, 96)
    other["text_model.blocks.9.ln1.weight"] = torch.ones(64)
    save_file({k: v.contiguous() for k, v in other.items()}, tmp_path / "other.safetensors")
    with pytest.raises(WeightsMismatchError) as e:
        create_model_and_transforms(TINY, pretrained=tmp_path / "other.safetensors")
    text = _one_line_error(e)
    assert f"do not fit model {TINY}" in text and "unexpected keys: text_model.blocks.9.ln1.weight" in text
    assert "text_model.emb.weight (checkpoint (49408, 96), model (49408, 64))" in text

    (tmp_path / "junk.pt").write_bytes(b"\x00not a checkpoint" * 10)
    with pytest.raises(PretrainedError) as e:
        create_model_and_transforms(TINY, pretrained=tmp_path / "junk.pt")
    assert "cannot read weights" in _one_line_error(e)
    (tmp_path / "junk.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json")
    with pytest.raises(PretrainedError) as e:
        create_model_and_transforms(TINY, pretrained=tmp_path / "junk.safetensors")
    assert "not a valid safetensors file" in _one_line_error(e)

    with pytest.raises(ModelConfigError) as e:
        create_model_and_transforms("RWKV_CLIP_B64")
    assert "RWKV_CLIP_B32" in _one_line_error(e)  # the message lists the shipped models
    with pytest.raises(ModelConfigError):
        get_tokenizer("no_such_model")
    with pytest.raises(PretrainedError, match="expected hf-hub:ORG/REPO"):
        create_model_and_transforms(TINY, pretrained="hf-hub:justone")


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("input_size", "abc", "must be a whole number"),  # once a raw TypeError from inside a tower
        ("input_size", 30, "must be a multiple of image_patch_size 8"),
        ("head_size", 0, "must be at least 1"),
        ("dropout", 1.5, "must be in [0, 1)"),
        ("drop_path_rate", float("nan"), "must be in [0, 1)"),
    ],
)
def test_a_config_value_of_the_wrong_kind_is_a_model_config_error_naming_it(key, value, why):
    config = {**get_model_config(TINY), key: value}
    for make in (lambda: create_model_and_transforms(config), lambda: create_model(config)):
        with pytest.raises(ModelConfigError) as e:
            make()
        assert _one_line_error(e) == f"model config key {key} {value!r}: {why}" and e.value.key == key


def test_weights_that_are_no_regular_file_are_said_to_be_what_they_are(tmp_path):
    # Once: pretrained="/dev/zero" "does not exist".
    (tmp_path / "broken.pt").symlink_to(tmp_path / "gone.pt")
    cases = {
        "/dev/zero": "is not a regular file (a character device)",
        str(tmp_path): "is a folder, not a weights file",
        str(tmp_path / "broken.pt"): f"is a broken link (to {tmp_path / 'gone.pt'})",
        str(tmp_path / "none.pt"): "does not exist",
    }
    for path, what in cases.items():
        with pytest.raises(WeightsNotFoundError) as e:
            create_model_and_transforms(TINY, pretrained=path)
        assert _one_line_error(e).startswith(f"weights {path} {what}; give a .pt or .safetensors file")


def test_model_library_stays_light_and_self_contained():
    # Importing the package builds nothing; the hub client and safetensors load only when used.
    code = (
        "import sys, src.open_alip as m; m.__all__; "
        "bad = [n for n in ('torch', 'huggingface_hub', 'safetensors', 'PIL') if n in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True, timeout=60)
    # src/open_alip imports only itself (docs/architecture.md)
    for path in sorted((REPO_ROOT / "src" / "open_alip").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            )
            for name in names:
                top = name.split(".")[0]
                assert top not in ("dataloaders", "benchmarks", "tests") and (
                    top != "src" or name.startswith("src.open_alip")
                ), f"{path.name} imports {name}"
