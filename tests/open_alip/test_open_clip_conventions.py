"""RWKV_CLIP follows open_clip's CLIP class where open_clip has a convention (docs/model.md), and a
model built in any precision runs.

The signatures are compared with the real open_clip source (open_clip_torch in the oracle venv,
benchmarks/oracles.py), read with `ast`: that venv lacks torchvision, so its model module cannot
be imported, and its text is what an open_clip user's code is written against.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from benchmarks.oracles import reference_python, run_oracle
from src.open_alip import RWKV_CLIP, create_model, create_model_and_transforms, tokenize

TINY = "RWKV_CLIP_tiny"
METHODS = (
    "__init__", "forward", "encode_image", "encode_text", "get_logits",
    "lock_image_tower", "lock_text_tower", "set_grad_checkpointing",
)  # fmt: skip


@pytest.fixture(scope="module")
def model() -> RWKV_CLIP:
    torch.manual_seed(0)
    return create_model(TINY).eval()


def _images(n: int, size: int = 32) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(1))


def _default(node: ast.expr | None) -> object:
    if node is None:
        return "<required>"
    try:
        return ast.literal_eval(node)
    except ValueError:  # an expression such as np.log(1 / 0.07)
        return ast.unparse(node)


def _open_clip_signatures() -> dict[str, list[tuple[str, object]]]:
    """open_clip's CLIP methods: [(parameter, default or '<required>')] without self."""
    python = reference_python()
    purelib = run_oracle(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    tree = ast.parse((Path(purelib) / "open_clip" / "model.py").read_text())
    clip = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CLIP")
    out = {}
    for fn in clip.body:
        if isinstance(fn, ast.FunctionDef) and fn.name in METHODS:
            args = fn.args.args[1:]
            defaults = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
            out[fn.name] = [(a.arg, _default(d)) for a, d in zip(args, defaults)]
    return out


def _ours(name: str) -> list[tuple[str, object]]:
    params = list(inspect.signature(getattr(RWKV_CLIP, name)).parameters.values())[1:]
    return [(p.name, "<required>" if p.default is inspect.Parameter.empty else p.default) for p in params]


def test_method_signatures_match_open_clip():
    theirs = _open_clip_signatures()
    assert set(theirs) == set(METHODS)
    for name in METHODS[1:]:
        ours = _ours(name)
        # Same positional parameters, names and defaults; ours may add keyword-only ones (forward's
        # normalize), which open_clip-style calls never pass.
        assert ours[: len(theirs[name])] == theirs[name], name
        extra = list(inspect.signature(getattr(RWKV_CLIP, name)).parameters.values())[1 + len(theirs[name]) :]
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra), name
    # The constructor takes a config instead of open_clip's tower configs; output_dict is shared.
    assert ("output_dict", False) in theirs["__init__"] and ("output_dict", False) in _ours("__init__")


def test_forward_returns_normalised_features_and_exp_scale(model):
    images, tokens = _images(3), tokenize(["a cat", "a dog", "two birds"])
    with torch.no_grad():
        image_features, text_features, scale = model(images, tokens)
        raw_image, raw_text = model.encode_image(images), model.encode_text(tokens)
        raw = model(images, tokens, normalize=False)
        image_logits, text_logits = model.get_logits(images, tokens)
        # Under no_grad too: with autograd the blocks take their other path, equal only to rounding.
        normed_image, normed_text = (
            model.encode_image(images, normalize=True),
            model.encode_text(tokens, normalize=True),
        )
    torch.testing.assert_close(image_features.norm(dim=-1), torch.ones(3))
    torch.testing.assert_close(text_features.norm(dim=-1), torch.ones(3))
    assert not torch.allclose(raw_image.norm(dim=-1), torch.ones(3))  # encode_* default: raw, as open_clip
    assert torch.equal(image_features, F.normalize(raw_image, dim=-1))
    assert torch.equal(text_features, F.normalize(raw_text, dim=-1))
    assert torch.equal(normed_image, image_features)
    assert torch.equal(normed_text, text_features)
    assert torch.equal(raw[0], raw_image) and torch.equal(raw[1], raw_text)
    assert scale.item() == pytest.approx(1 / 0.07, rel=1e-6)
    # open_clip's zero-shot recipe now gives probabilities from cosine similarities.
    torch.testing.assert_close(image_logits, scale * image_features @ text_features.T)
    torch.testing.assert_close(text_logits, image_logits.T)


def test_forward_takes_one_input_and_can_return_a_dict():
    torch.manual_seed(0)
    model = create_model(TINY, output_dict=True).eval()
    images = _images(2)
    with torch.no_grad():
        out = model(image=images)
        only_text = model(text=tokenize(["x"]))
    assert set(out) == {"image_features", "text_features", "logit_scale"}
    assert out["text_features"] is None and out["image_features"].shape == (2, model.embed_dim)
    assert only_text["image_features"] is None and only_text["text_features"].shape == (1, model.embed_dim)
    model.output_dict = False
    with torch.no_grad():
        image_features, text_features, _ = model(images)
    assert text_features is None and torch.equal(image_features, out["image_features"])


def test_visual_and_text_are_aliases_not_new_state_dict_keys(model):
    assert model.visual is model.image_model and model.text is model.text_model
    keys = list(model.state_dict())
    assert not any(k.startswith(("visual.", "text.")) for k in keys)
    assert len(keys) == len(set(keys)) == len(list(model.parameters()))  # no tensor reachable twice


def _trainable(module: torch.nn.Module) -> set[str]:
    return {n for n, p in module.named_parameters() if p.requires_grad}


def test_lock_image_tower_unlocks_open_clips_groups_from_the_end():
    torch.manual_seed(0)
    model = create_model(TINY)  # image_depth 2: groups [embeddings], [block 0], [block 1 + ln1]
    every = _trainable(model)
    model.lock_image_tower()
    assert _trainable(model) == {n for n in every if not n.startswith("image_model.")}
    model.lock_image_tower(unlocked_groups=1, freeze_bn_stats=True)
    assert {n for n in _trainable(model) if n.startswith("image_model.")} == {
        n for n in every if n.startswith(("image_model.layers.1.", "image_model.ln1."))
    }
    model.lock_image_tower(unlocked_groups=3)
    assert _trainable(model) == every
    with pytest.raises(ValueError, match="between 0 and 3"):
        model.lock_image_tower(unlocked_groups=4)

    # A LiT step: a frozen tower gets no gradient, the text tower and the temperature do.
    model.lock_image_tower()
    image_features, text_features, scale = model(_images(2), tokenize(["a", "b"]))
    (scale * image_features @ text_features.T).logsumexp(-1).sum().backward()
    got = {n for n, p in model.named_parameters() if p.grad is not None}
    assert got and not any(n.startswith("image_model.") for n in got) and "logit_scale" in got


def test_lock_text_tower_unlocks_open_clips_groups_from_the_end():
    torch.manual_seed(0)
    model = create_model(TINY)  # n_layer 2: groups [emb], [block 0], [block 1 + ln_out]
    every = _trainable(model)
    model.lock_text_tower(unlocked_layers=1)
    assert {n for n in _trainable(model) if n.startswith("text_model.")} == {
        n for n in every if n.startswith(("text_model.blocks.1.", "text_model.ln_out."))
    }
    assert {n for n in _trainable(model) if not n.startswith("text_model.")} == {
        n for n in every if not n.startswith("text_model.")
    }
    model.lock_text_tower()
    assert not any(n.startswith("text_model.") for n in _trainable(model))
    with pytest.raises(ValueError, match="freeze_layer_norm"):
        model.lock_text_tower(freeze_layer_norm=False)


def test_set_grad_checkpointing_takes_open_clips_keyword(model):
    model.set_grad_checkpointing(enable=True)
    assert all(b.with_cp for b in [*model.visual.layers, *model.text.blocks])
    model.set_grad_checkpointing(False)
    assert not any(b.with_cp for b in [*model.visual.layers, *model.text.blocks])


# ---------------------------------------------------------------- precisions


@pytest.fixture(scope="module")
def fp32_reference():
    """(weights, inputs, float32 outputs) that every precision is compared with."""
    torch.manual_seed(5)
    model, _, preprocess_val = create_model_and_transforms(TINY)
    rng = np.random.default_rng(0)
    pictures = [Image.fromarray((rng.random((40, 50, 3)) * 255).astype(np.uint8)) for _ in range(2)]
    images = torch.stack([preprocess_val(p) for p in pictures])  # float32, as the transform gives
    tokens = tokenize(["a photo of a cat", "a red square"])
    with torch.no_grad():
        want = (model.encode_image(images), model.encode_text(tokens), *model(images, tokens))
    return model.state_dict(), images, tokens, want


@pytest.mark.parametrize(
    ("precision", "dtype", "min_cosine"),
    [("fp32", torch.float32, 1.0 - 1e-6), ("bf16", torch.bfloat16, 0.999), ("fp16", torch.float16, 0.9999)],
)
def test_every_precision_runs_forward_on_cpu(fp32_reference, precision, dtype, min_cosine):
    # fp16 on CPU: every op of the model has a float16 CPU kernel in the tested torch (2.13), so
    # fp16 runs there as well as bf16; the WKV computes in float32 in every precision (wkv.py).
    weights, images, tokens, want = fp32_reference
    model, _, _ = create_model_and_transforms(TINY, precision=precision)
    model.load_state_dict(weights)
    assert {p.dtype for p in model.parameters()} == {dtype}
    with torch.no_grad():
        got = (model.encode_image(images), model.encode_text(tokens), *model(images, tokens))
    names = ("encode_image", "encode_text", "image_features", "text_features", "logit_scale")
    for name, value, reference in zip(names, got, want):
        assert value.dtype == dtype, name
        assert torch.isfinite(value).all(), name
        if value.dim() == 2:
            cosine = F.cosine_similarity(value.float(), reference, dim=-1).min().item()
            assert cosine >= min_cosine, f"{name}: cosine {cosine} to float32"
    torch.testing.assert_close(got[2].float().norm(dim=-1), torch.ones(2), rtol=0, atol=1e-2)


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16", "amp_bf16"])
def test_demo_config_runs_forward_in_every_precision(precision):
    # The demo's config (demo.py trains it) has a head size of 16, the tiny one 32.
    torch.manual_seed(2)
    model, _, preprocess_val = create_model_and_transforms("RWKV_CLIP_demo", precision=precision)
    image = preprocess_val(Image.new("RGB", (48, 40), (200, 30, 30))).unsqueeze(0)
    with torch.no_grad():
        image_emb = model.encode_image(image, normalize=True)
        text_emb = model.encode_text(tokenize(["a red square"]), normalize=True)
    dtype = next(model.parameters()).dtype
    for value in (image_emb, text_emb):
        assert value.shape == (1, 32) and value.dtype == dtype and torch.isfinite(value).all()
        torch.testing.assert_close(value.float().norm(dim=-1), torch.ones(1), rtol=0, atol=1e-2)


# open_clip's keyword arguments of its entry points that mean the same here (the others, such as
# jit or force_quick_gelu, have no RWKV-CLIP meaning).
SHARED_KEYWORDS = {
    "create_model": ("model_name", "pretrained", "precision", "device", "cache_dir", "output_dict"),
    "create_model_and_transforms": (
        "model_name",
        "pretrained",
        "precision",
        "device",
        "cache_dir",
        "output_dict",
    ),
    "create_model_from_pretrained": (
        "model_name",
        "pretrained",
        "precision",
        "device",
        "cache_dir",
        "return_transform",
    ),
    "get_tokenizer": ("model_name", "context_length", "cache_dir"),
}


def test_entry_points_take_open_clips_keywords():
    import src.open_alip as library

    python = reference_python()
    purelib = run_oracle(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip()
    tree = ast.parse((Path(purelib) / "open_clip" / "factory.py").read_text())
    theirs = {
        n.name: [a.arg for a in (*n.args.args, *n.args.kwonlyargs)]
        for n in tree.body
        if isinstance(n, ast.FunctionDef) and n.name in SHARED_KEYWORDS
    }
    for name, keywords in SHARED_KEYWORDS.items():
        assert set(keywords) <= set(theirs[name]), (name, theirs[name])  # still open_clip's own names
        ours = inspect.signature(getattr(library, name)).parameters
        assert [k for k in keywords if k not in ours] == [], name


def test_open_clip_calls_work_as_written(caplog):
    import src.open_alip as library

    assert {"create_model", "get_tokenizer", "create_model_and_transforms", "tokenize"} <= set(dir(library))
    with caplog.at_level("WARNING"):
        model = create_model(TINY, precision="bf16", device="cpu")
    assert (
        next(model.parameters()).dtype == torch.bfloat16 and model.training
    )  # open_clip's create_model: train mode
    assert "no pretrained weights loaded for model RWKV_CLIP_tiny: it is randomly initialised" in caplog.text
    tokenizer = library.get_tokenizer(TINY, context_length=16)
    assert tokenizer(["a cat"]).shape == (1, 16)
    _, train, val = create_model_and_transforms(model_name=TINY)
    assert [type(t).__name__ for t in val.transforms] == [
        "ConvertRGB",
        "ResizeShorterSide",
        "CenterCrop",
        "ToTensor",
        "Normalize",
    ]
    assert [type(t).__name__ for t in train.transforms] == [
        "ConvertRGB",
        "RandomResizedCropFlip",
        "NormalizedTensor",
    ]
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 56, 3), dtype=np.uint8))
    stepped = image
    for step in val.transforms:  # applied by hand, the steps give what the transform gives
        stepped = step(stepped)
    assert torch.equal(stepped, val(image)) and stepped.shape == (3, 32, 32)
