"""RWKV-CLIP model: layout against the released checkpoints, numerics against a float64 reference."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from src.open_alip import RWKV_CLIP, create_model, get_model_config, list_models, load_checkpoint
from src.open_alip.model import RUN_SETTING_KEYS, CheckpointMismatchError
from src.open_alip.rwkv6 import DropPath
from src.open_alip.text_rwkv import bi_shift
from src.open_alip.vision_rwkv import q_shift
from tests import _model_reference as ref
from tests._repo import REPO

# The released checkpoints' key lists (names, shapes, dtypes, order), as committed test data.
REFERENCE_DIR = Path(__file__).resolve().parent / "data"


def _reference(name: str) -> dict:
    path = REFERENCE_DIR / f"keys_{name}.json"
    return json.loads(path.read_text())


def _tiny(**overrides) -> RWKV_CLIP:
    torch.manual_seed(0)
    return create_model("RWKV_CLIP_tiny", **overrides)


@torch.no_grad()
def _randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give every parameter a nonzero, well-scaled random value (init zeroes many)."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
        if name == "logit_scale":
            value = torch.tensor(2.0, dtype=torch.float64)
        elif name.endswith("time_decay"):
            value = torch.rand(p.shape, generator=g, dtype=torch.float64) * 5 - 4
        elif "time_maa_" in name and not name.endswith(("w1", "w2")) or "spatial_mix" in name:
            value = torch.rand(p.shape, generator=g, dtype=torch.float64)
        elif p.dim() == 1 and name.endswith("weight"):  # norms
            value = 1 + 0.2 * noise
        elif p.dim() == 1:
            value = 0.2 * noise
        elif name.endswith("emb.weight") or name.endswith("time_faaaa"):
            value = noise
        else:
            fan_in = p[0].numel() if name.endswith("w2") is False else p.shape[-2]
            value = noise / math.sqrt(max(fan_in, 1))
        p.copy_(value.to(p.dtype))
    return model


def _tiny64(seed: int = 0) -> RWKV_CLIP:
    return _randomize(_tiny(), seed).double().eval()


def _images(batch: int, size: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randn(
        batch, 3, size, size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )


def _tokens(batch: int, seed: int = 2, length: int = 77) -> torch.Tensor:
    tokens = torch.randint(1, 49408, (batch, length), generator=torch.Generator().manual_seed(seed))
    tokens[:, length // 4 :] = 0  # padding, as the tokenizer produces
    return tokens


# ---------------------------------------------------------------- layout and configs


@pytest.fixture(scope="module")
def b32() -> RWKV_CLIP:
    """A B/32 with uninitialised CPU storage: building it on `meta` skips 150M random draws."""
    with torch.device("meta"):
        model = create_model("RWKV_CLIP_B32")
    return model.to_empty(device="cpu")


def _layout(model: RWKV_CLIP) -> list:
    state = model.released_state_dict()
    return [[k, list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in state.items()]


def test_b32_state_dict_equals_reference_layout_and_counts(b32):
    expected = _reference("B32")
    assert _layout(b32) == expected["keys"]
    assert sum(p.numel() for p in b32.parameters()) == expected["total_params"] == 149_561_601
    assert sum(p.numel() for p in b32.image_model.parameters()) == expected["image_params"]
    assert sum(p.numel() for p in b32.text_model.parameters()) == expected["text_params"]
    assert len(list(b32.buffers())) == 0


def test_b16_state_dict_equals_reference_layout_and_counts():
    expected = _reference("B16")
    with torch.device("meta"):  # shapes and dtypes only; no need to fill 148M weights
        model = create_model("RWKV_CLIP_B16")
    assert _layout(model) == expected["keys"]
    assert sum(p.numel() for p in model.parameters()) == expected["total_params"] == 148_181_121


def test_shipped_configs_match_the_original_arguments():
    assert {"RWKV_CLIP_B32", "RWKV_CLIP_B16", "RWKV_CLIP_tiny"} <= set(list_models())
    for name in ("B32", "B16"):
        # Run settings (precision, workers, data_type) belong to the trainer, not the config.
        skip = {"open_checkpoint", *RUN_SETTING_KEYS}
        original = {k: v for k, v in _reference(name)["derived_args"].items() if k not in skip}
        cfg = get_model_config(f"RWKV_CLIP_{name}")
        assert {k: cfg[k] for k in original} == original


def test_config_defaults_overrides_and_errors(tmp_path):
    base = get_model_config("RWKV_CLIP_tiny")
    derived = get_model_config({**base, "n_embd": 640, "dim_att": 0, "dim_ffn": 0})
    assert derived["dim_att"] == 640 and derived["dim_ffn"] == 2240
    assert get_model_config("RWKV_CLIP_tiny", input_size=64, with_cp=True)["input_size"] == 64
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({k: v for k, v in base.items() if k not in ("dropout", "precision")}))
    loaded = get_model_config(path)
    assert loaded["dropout"] == 0.0
    # Older configs carried run settings; they are dropped, and refused as overrides.
    path.write_text(json.dumps({**base, "precision": "bf16", "workers": 10, "data_type": "utf-8"}))
    assert get_model_config(path) == base
    with pytest.raises(ValueError, match="run settings"):
        get_model_config("RWKV_CLIP_tiny", precision="bf16")
    with pytest.raises(ValueError, match="unknown model config key.*'inpt_size'"):
        get_model_config("RWKV_CLIP_tiny", inpt_size=64)
    with pytest.raises(ValueError, match="lacks required key.*'n_layer'"):
        get_model_config({k: v for k, v in base.items() if k != "n_layer"})
    with pytest.raises(FileNotFoundError, match="RWKV_CLIP_B99"):
        get_model_config("RWKV_CLIP_B99")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ValueError, match="not valid JSON"):
        get_model_config(tmp_path / "bad.json")


# ---------------------------------------------------------------- pieces vs the float64 reference


def test_image_q_shift_matches_the_per_token_definition():
    x = torch.randn(2, 3 * 5, 16, dtype=torch.float64)
    assert torch.equal(q_shift(x, (3, 5), head_size=8), ref.image_shift(x, 3, 5, head_size=8))


def test_text_shift_matches_the_per_token_definition():
    x = torch.randn(2, 9, 24, dtype=torch.float64)
    assert torch.equal(bi_shift(x, head_size=8), ref.text_shift(x, head_size=8))


@pytest.mark.parametrize("tower", ["image", "text"])
def test_the_shifts_backward_is_the_per_token_definitions_gradient(tower):
    # The shift's own backward (the opposite shift) against autograd through the reference,
    # exactly, and to second order.
    if tower == "image":
        shift, reference = (
            (lambda t: q_shift(t, (3, 5), head_size=8)),
            (lambda t: ref.image_shift(t, 3, 5, head_size=8)),
        )
    else:
        shift, reference = (lambda t: bi_shift(t, head_size=8)), (lambda t: ref.text_shift(t, head_size=8))
    x = torch.randn(2, 15, 16, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 15, 16, dtype=torch.float64)
    (want,) = torch.autograd.grad(reference(x), x, grad)
    (got,) = torch.autograd.grad(shift(x), x, grad)
    assert torch.equal(got, want)
    assert torch.autograd.gradgradcheck(shift, (x,))


def test_group_norm_eps_per_tower():
    model = _tiny()
    assert all(b.att.ln_x.eps == 1e-5 for b in model.image_model.layers)
    assert all(b.att.ln_x.eps == pytest.approx(6.4e-4, rel=1e-12) for b in model.text_model.blocks)


def test_time_and_channel_mixes_match_reference():
    model = _tiny64()
    x = torch.randn(2, 16, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    image_block = model.image_model.layers[1]
    params = ref.sub(image_block.state_dict(), "")
    xs = ref.image_shift(x, 4, 4, 32)
    torch.testing.assert_close(
        image_block.att(x, xs), ref.time_mix(ref.sub(params, "att."), x, xs, 2, 1e-5), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        image_block.ffn(x, (4, 4)), ref.image_channel_mix(ref.sub(params, "ffn."), x, xs), rtol=0, atol=1e-12
    )
    text_block = model.text_model.blocks[1]
    params = ref.sub(text_block.state_dict(), "")
    xs = ref.text_shift(x, 32)
    torch.testing.assert_close(
        text_block.att(x, xs), ref.time_mix(ref.sub(params, "att."), x, xs, 2, 6.4e-4), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(
        text_block.ffn(x), ref.text_channel_mix(ref.sub(params, "ffn."), x, xs), rtol=0, atol=1e-12
    )


def test_towers_and_clip_outputs_match_reference_in_float64():
    model = _tiny64()
    cfg = model.config
    state = model.state_dict()
    images, tokens = _images(2), _tokens(2)
    with torch.no_grad():
        image_tokens, _ = model.image_model.forward_features(images)
        text_tokens = model.text_model.forward_features(tokens)
        image_emb, text_emb, scale = model(images, tokens, normalize=False)
        normed_image, normed_text, normed_scale = model(images, tokens)
    # Per-token features: pooling would hide a wrong shift or bonus in the text tower.
    torch.testing.assert_close(image_tokens, ref.image_features(state, images, cfg), rtol=0, atol=1e-12)
    torch.testing.assert_close(text_tokens, ref.text_features(state, tokens, cfg), rtol=0, atol=1e-12)
    want_image, want_text, want_scale = ref.clip_forward(state, images, tokens, cfg)
    torch.testing.assert_close(image_emb, want_image, rtol=0, atol=1e-12)
    torch.testing.assert_close(text_emb, want_text, rtol=0, atol=1e-12)
    assert scale.item() == pytest.approx(want_scale.item(), rel=1e-15)
    assert not torch.allclose(text_emb.norm(dim=-1), torch.ones(2, dtype=torch.float64))  # not re-normalised
    # open_clip's convention: forward L2-normalises both embeddings by default.
    torch.testing.assert_close(normed_image, F.normalize(want_image, dim=-1), rtol=0, atol=1e-12)
    torch.testing.assert_close(normed_text, F.normalize(want_text, dim=-1), rtol=0, atol=1e-12)
    assert torch.equal(normed_scale, scale)


def test_other_image_size_resizes_pos_embed_bicubically():
    model = _tiny64()
    images = _images(1, size=48)
    with torch.no_grad():
        got = model.encode_image(images)
    want = ref.image_features(model.state_dict(), images, model.config).mean(1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- training behaviour


def test_every_parameter_gets_a_gradient():
    model = _randomize(_tiny()).train()
    image_emb, text_emb, scale = model(_images(2).float(), _tokens(2, length=12), normalize=False)
    (image_emb.sum() + text_emb.sum() + scale).backward()
    silent = [n for n, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0)]
    assert silent == []


def test_gradient_checkpointing_gives_the_same_gradients():
    def grads(with_cp: bool) -> dict[str, torch.Tensor]:
        model = _tiny64(seed=5).train()
        model.set_grad_checkpointing(with_cp)
        image_emb, text_emb, _ = model(_images(2), _tokens(2, length=12), normalize=False)
        (image_emb.square().sum() + text_emb.square().sum()).backward()
        return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = grads(False), grads(True)
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-10, atol=1e-12, msg=name)
    assert create_model("RWKV_CLIP_tiny", with_cp=True).image_model.layers[0].with_cp


def test_drop_path_is_stochastic_in_training_only():
    drop = DropPath(0.5).train()
    out = drop(torch.ones(2000, 3))
    assert set(out[:, 0].tolist()) == {0.0, 2.0} and torch.equal(out[:, 0:1].expand(-1, 3), out)
    assert torch.equal(drop.eval()(torch.ones(4, 3)), torch.ones(4, 3))

    model = _randomize(_tiny(drop_path_rate=0.5))
    rates = [block.drop_path.p for block in model.image_model.layers]
    assert rates == [0.0, 0.5]
    images = _images(4).float()
    model.train()
    first, second = model.encode_image(images), model.encode_image(images)
    assert not torch.allclose(first, second)
    model.eval()
    assert torch.equal(model.encode_image(images), model.encode_image(images))


def test_bf16_autocast_keeps_the_wkv_in_float32():
    model = _randomize(_tiny()).eval()
    seen = []
    for block in model.text_model.blocks:
        block.att.ln_x.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    images, tokens = _images(2).float(), _tokens(2)
    with torch.no_grad():
        full = model(images, tokens)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(images, tokens)
    assert seen[-2:] == [torch.float32, torch.float32]
    for a, b in zip(full[:2], half[:2]):
        assert torch.nn.functional.cosine_similarity(a, b.float(), dim=-1).min() > 0.98


# ---------------------------------------------------------------- initialisation


def test_from_scratch_initialisation_follows_the_original():
    # B/32's layer counts (6 text, 12 image) at a width that builds quickly.
    torch.manual_seed(0)
    model = create_model(
        "RWKV_CLIP_tiny", n_embd=128, dim_att=128, dim_ffn=448, head_size=64, n_layer=6,
        image_embed_dims=128, image_depth=12, image_num_heads=2,
    )  # fmt: skip
    text, image = model.text_model, model.image_model
    c = 128
    ddd = torch.arange(c, dtype=torch.float64) / c
    n = torch.arange(c, dtype=torch.float64)

    def bf16(t: torch.Tensor) -> torch.Tensor:  # text values are rounded to bf16
        return t.to(torch.bfloat16).double()

    def same(param: torch.Tensor, want: torch.Tensor) -> None:
        torch.testing.assert_close(param.detach().double().flatten(), want.flatten(), rtol=0, atol=0)

    layer, n_layer = 3, 6
    r0, r1 = layer / (n_layer - 1), 1 - layer / n_layer
    att, ffn = text.blocks[layer].att, text.blocks[layer].ffn
    decay = -6 + 5 * (n / (c - 1)) ** (0.7 + 1.3 * r0)
    bonus = r0 * (1 - n / (c - 1)) + 0.1 * ((n + 1) % 3 - 1)
    same(att.time_maa_x, bf16(1 - ddd**r1))
    same(att.time_maa_v, bf16(1 - (ddd**r1 + 0.3 * r0)))
    same(att.time_maa_g, bf16(1 - ddd ** (0.5 * r1)))
    same(att.time_decay, bf16(decay))
    same(att.time_faaaa, bf16(bonus))
    same(ffn.time_maa_k, bf16(1 - ddd**r1))
    assert att.time_decay.dtype == att.time_faaaa.dtype == torch.float32  # masters (set_text_decay_dtype)
    assert not att.time_maa_w1.any() and not att.time_decay_w1.any()
    assert 0 < att.time_maa_w2.abs().max() <= 0.01 * (1 + 2**-8)
    same(att.ln_x.weight, bf16(torch.full((c,), ((layer + 1) / n_layer) ** 0.7)))
    same(att.ln_x.bias, torch.zeros(c, dtype=torch.float64))
    for zero in (att.output.weight, ffn.value.weight, ffn.receptance.weight):
        assert not zero.any()
    eye = torch.eye(c, dtype=torch.float64)
    for weight, scale in ((att.receptance.weight, 1.0), (att.key.weight, 0.1), (att.gate.weight, 0.1)):
        torch.testing.assert_close(
            weight.double() @ weight.double().T, scale**2 * eye, rtol=0, atol=2e-2 * scale**2
        )
    key = ffn.key.weight.double()  # 448 x 128: gain sqrt(448/128) times 0.5, orthonormal columns
    torch.testing.assert_close(key.T @ key, 0.25 * 3.5 * eye, rtol=0, atol=2e-2)
    assert 0 < text.emb.weight.abs().max() <= 1e-4 * (1 + 2**-8)
    assert all(torch.equal(p, p.bfloat16().to(p.dtype)) for p in text.parameters())

    layer, n_layer = 5, 12
    r0, r1 = layer / (n_layer - 1), 1 - layer / n_layer
    block = image.layers[layer]
    f32 = lambda t: t.float().double()  # noqa: E731 - image values are float32
    same(block.att.time_maa_w, f32(1 - ddd**r1))
    same(block.att.time_maa_r, f32(1 - ddd ** (0.5 * r1)))
    same(block.att.time_decay, f32(-6 + 5 * (n / (c - 1)) ** (0.7 + 1.3 * r0)))
    same(block.att.time_faaaa, f32(r0 * (1 - n / (c - 1)) + 0.1 * ((n + 1) % 3 - 1)))
    same(block.ffn.spatial_mix_k, f32(ddd**r1))
    same(block.ffn.spatial_mix_r, f32(ddd**r1))
    for lora in (
        block.att.time_maa_w1,
        block.att.time_maa_w2,
        block.att.time_decay_w1,
        block.att.time_decay_w2,
    ):
        assert 0 < lora.abs().max() <= 1e-4
    assert not image.pos_embed.any() and image.pos_embed.dtype == torch.float32
    assert model.logit_scale.item() == pytest.approx(math.log(1 / 0.07)) == pytest.approx(2.659260, abs=1e-6)


# ---------------------------------------------------------------- checkpoints


def _outputs(model: RWKV_CLIP) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return model.eval()(_images(2).float(), _tokens(2))


def test_save_load_round_trip(tmp_path):
    source = _randomize(_tiny(), seed=9)
    path = tmp_path / "epoch_1.pt"
    torch.save({"state_dict": source.state_dict(), "optimizer": {"lr": 1e-3}, "epoch": 1}, path)
    loaded = create_model("RWKV_CLIP_tiny", pretrained=path)
    for a, b in zip(_outputs(source), _outputs(loaded)):
        assert torch.equal(a, b)

    prefixed = {f"_orig_mod.module.{k}": v for k, v in source.state_dict().items()}
    again = _tiny()
    assert load_checkpoint(torch.nn.DataParallel(again), {"model": prefixed}) == ([], [], [])
    for a, b in zip(_outputs(source), _outputs(again)):
        assert torch.equal(a, b)


def test_loads_a_synthetic_original_b32_checkpoint(b32):
    g = torch.Generator().manual_seed(4)
    original = {
        f"module.{key}": torch.randn(shape, generator=g).to(getattr(torch, dtype))
        for key, shape, dtype in _reference("B32")["keys"]
    }
    load_checkpoint(b32, original)
    own = b32.state_dict()
    assert all(torch.equal(own[k.removeprefix("module.")].float(), v.float()) for k, v in original.items())
    assert own["text_model.blocks.0.att.time_decay"].dtype == torch.float32
    released = b32.released_state_dict()
    assert all(torch.equal(released[k.removeprefix("module.")], v) for k, v in original.items())

    fp32_model = _tiny().float()  # a model held in float32 takes bf16 tensors too (cast)
    source = {k: (v.bfloat16() if v.dtype == torch.float32 else v) for k, v in _tiny().state_dict().items()}
    load_checkpoint(fp32_model, source)
    assert fp32_model.text_model.blocks[0].att.time_decay.dtype == torch.float32


def test_the_shape_check_imports_no_compiler():
    # A fresh process: loading weights checks their shapes on a meta-device model first. Run there,
    # the initialisers import torch._dynamo (2 s at every start of an evaluation command).
    code = (
        "import sys\n"
        "from src.open_alip import get_model_config\n"
        "from src.open_alip.model import RWKV_CLIP, CheckpointMismatchError, check_fits\n"
        "tiny = RWKV_CLIP(get_model_config('RWKV_CLIP_tiny')).state_dict()\n"
        "check_fits(get_model_config('RWKV_CLIP_tiny'), tiny)\n"
        "try:\n"
        "    check_fits(get_model_config('RWKV_CLIP_B32'), tiny)\n"
        "except CheckpointMismatchError:\n"
        "    print('mismatch found', 'torch._dynamo' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "mismatch found False"


def test_a_checkpoint_that_does_not_fit_names_the_keys(tmp_path):
    model = _tiny()
    state = dict(model.state_dict())
    del state["text_model.blocks.1.att.gate.weight"]
    state["image_model.cls_token"] = torch.zeros(1, 1, 64)
    state["image_model.pos_embed"] = torch.zeros(1, 49, 64)
    before = model.state_dict()["logit_scale"].clone()
    with pytest.raises(CheckpointMismatchError) as info:
        load_checkpoint(model, {"state_dict": state})
    message = str(info.value)
    assert "missing keys: text_model.blocks.1.att.gate.weight" in message
    assert "unexpected keys: image_model.cls_token" in message
    assert "image_model.pos_embed (checkpoint (1, 49, 64), model (1, 16, 64))" in message
    assert torch.equal(model.logit_scale.detach(), before)  # strict failure loads nothing

    state["logit_scale"] = torch.tensor(1.5)
    missing, unexpected, mismatched = load_checkpoint(model, state, strict=False)
    assert (len(missing), len(unexpected), len(mismatched)) == (1, 1, 1)
    assert model.logit_scale.item() == 1.5

    with pytest.raises(FileNotFoundError, match="nothing.pt"):
        load_checkpoint(model, tmp_path / "nothing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointMismatchError, match="cannot read checkpoint"):
        load_checkpoint(model, tmp_path / "junk.pt")
    with pytest.raises(CheckpointMismatchError, match="holds no state_dict"):
        load_checkpoint(model, {"epoch": 3})


class _Payload:  # any non-tensor object: weights_only loading must refuse to build it
    pass


def test_checkpoint_loading_refuses_pickled_objects(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"state_dict": _tiny().state_dict(), "extra": _Payload()}, path)
    with pytest.raises(CheckpointMismatchError, match="cannot read checkpoint"):
        load_checkpoint(_tiny(), path)
