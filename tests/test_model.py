"""RWKV-CLIP model: layout against the released checkpoints, numerics against a float64 reference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from src.open_alip import RWKV_CLIP, create_model, list_models

REFERENCE_DIR = Path("/work/shared/reference")


def _tiny(**overrides) -> RWKV_CLIP:
    torch.manual_seed(0)
    return create_model("RWKV_CLIP_tiny", **overrides)


def test_shipped_configs_are_listed():
    assert {"RWKV_CLIP_B32", "RWKV_CLIP_B16", "RWKV_CLIP_tiny"} <= set(list_models())


def test_tiny_forward_shapes_and_logit_scale():
    model = _tiny().eval()
    images = torch.randn(3, 3, 32, 32)
    tokens = torch.randint(0, 49408, (3, 77))
    with torch.no_grad():
        image_emb, text_emb, scale = model(images, tokens)
    assert image_emb.shape == (3, model.image_embed_dim) == (3, 64)
    assert text_emb.shape == (3, model.text_embed_dim) == (3, 64)
    assert torch.isfinite(image_emb).all() and torch.isfinite(text_emb).all()
    assert scale.item() == pytest.approx(1 / 0.07, rel=1e-6)
    assert torch.equal(model.encode_image(images), image_emb)
    assert torch.equal(model.encode_text(tokens), text_emb)
