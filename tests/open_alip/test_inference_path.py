"""The blocks' forward-only path (no gradient recorded, no autocast) against the path training runs.

The fast path fuses the token-shift mixes, works in place and uses the WKV's inference form; the
other path is the one every gradient goes through. Same model, same inputs: grad mode decides."""

import pytest
import torch

from src.open_alip import create_model
from src.open_alip.rwkv6 import inference_path
from tests import _model_reference as ref
from tests.open_alip.test_model import _images, _randomize, _tiny64, _tokens


def _both(fn, *args):
    """(fn under no_grad: the inference path, fn with autograd recording: the training path)."""
    with torch.no_grad():
        fast = fn(*args)
    with torch.enable_grad():
        plain = fn(*args)
    assert plain.requires_grad and not fast.requires_grad
    return fast, plain.detach()


def test_inference_path_is_taken_only_without_autograd_and_autocast():
    x = torch.zeros(1, 2, 4)
    assert not inference_path(x)
    with torch.no_grad():
        assert inference_path(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert not inference_path(x)
    with torch.inference_mode():
        assert inference_path(x)


def test_every_block_part_equals_the_training_path_and_the_reference_in_float64():
    model = _tiny64()
    x = torch.randn(2, 16, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    image_block, text_block = model.image_model.layers[1], model.text_model.blocks[1]
    xs = ref.image_shift(x, 4, 4, 32)
    params = ref.sub(image_block.state_dict(), "")
    for fast, plain, want in (
        (*_both(image_block.att, x, xs), ref.time_mix(ref.sub(params, "att."), x, xs, 2, 1e-5)),
        (*_both(image_block.ffn, x, (4, 4)), ref.image_channel_mix(ref.sub(params, "ffn."), x, xs)),
    ):
        torch.testing.assert_close(fast, plain, rtol=0, atol=1e-12)
        torch.testing.assert_close(fast, want, rtol=0, atol=1e-12)
    params = ref.sub(text_block.state_dict(), "")
    xs = ref.text_shift(x, 32)
    for fast, plain, want in (
        (*_both(text_block.att, x, xs), ref.time_mix(ref.sub(params, "att."), x, xs, 2, 6.4e-4)),
        (*_both(text_block.ffn, x), ref.text_channel_mix(ref.sub(params, "ffn."), x, xs)),
    ):
        torch.testing.assert_close(fast, plain, rtol=0, atol=1e-12)
        torch.testing.assert_close(fast, want, rtol=0, atol=1e-12)


def test_towers_per_token_equal_the_training_path_in_float64():
    model = _tiny64()
    fast, plain = _both(lambda images: model.image_model.forward_features(images)[0], _images(2, size=48))
    torch.testing.assert_close(fast, plain, rtol=0, atol=1e-12)
    fast, plain = _both(model.text_model.forward_features, _tokens(2))
    torch.testing.assert_close(fast, plain, rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def b32_width():
    """B/32's widths and heads (640 = 8 x 80 image, 10 x 64 text), two layers each, random weights."""
    torch.manual_seed(0)
    return _randomize(create_model("RWKV_CLIP_B32", image_depth=2, n_layer=2), seed=4).eval()


@pytest.mark.parametrize("size", [224, 448])  # 49 tokens (one WKV chunk), 196 (four, with boundary states)
def test_float32_encodings_equal_the_training_path_within_1e_5(b32_width, size):
    images = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
    fast, plain = _both(b32_width.encode_image, images)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
    if size == 224:
        tokens = _tokens(2)
        fast, plain = _both(b32_width.encode_text, tokens)
        torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
        # Per token too (pooling hides errors), relative to the features' scale (up to about 6 here):
        # each path is about 2e-5 from the float64 model at that scale, the two 1.3e-5 apart.
        fast, plain = _both(b32_width.text_model.forward_features, tokens)
        torch.testing.assert_close(fast, plain, rtol=0, atol=1e-5 * plain.abs().max().item())
