"""The CLIP_benchmark-style loader's contract, and the wrapper that registers it.

CLIP_benchmark is not a dependency, so it is not run here: the loader is called the way its
`clip_benchmark.models.load_clip` calls a loader (keyword arguments model_name, pretrained,
cache_dir, device) and its results are used the way its zero-shot metrics use them; `register` is
checked on a stand-in holding the two names CLIP_benchmark's `models` module keeps (TYPE2FUNC,
MODEL_TYPES)."""

from __future__ import annotations

import inspect
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import clip_benchmark_eval
from src.errors import UserError
from src.evaluation.clip_bench import ClipBenchmarkError, precision_of, prepare_argv, register
from src.open_alip import load_rwkv_clip
from src.open_alip.errors import PretrainedError

TINY = "RWKV_CLIP_tiny"


@pytest.fixture
def weights(tiny_weights):
    return tiny_weights.state_dict, tiny_weights.path


def test_loader_contract(weights):
    state, path = weights
    assert list(inspect.signature(load_rwkv_clip).parameters) == [
        "model_name",
        "pretrained",
        "cache_dir",
        "device",
    ]
    model, transform, tokenizer = load_rwkv_clip(
        model_name=TINY, pretrained=str(path), cache_dir=None, device="cpu"
    )
    model.eval()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())

    # a dataset's transform: PIL image in, [3, S, S] float tensor out; batches come from a DataLoader
    rng = np.random.default_rng(0)
    images = [Image.fromarray((rng.random((40 + 9 * i, 48, 3)) * 255).astype(np.uint8)) for i in range(4)]
    batch = torch.utils.data.default_collate([transform(im) for im in images])
    assert batch.shape == (4, 3, 32, 32) and batch.dtype == torch.float32

    # zero-shot classification as CLIP_benchmark computes it: templates formatted with c=classname,
    # tokenizer(list of str).to(device), encode_text / encode_image, normalise, 100 * image @ classifier
    classnames, templates = ["cat", "dog", "car"], ["a photo of a {c}.", "a drawing of a {c}."]
    with torch.no_grad():
        weights_per_class = []
        for name in classnames:
            tokens = tokenizer([t.format(c=name) for t in templates]).to("cpu")
            assert tokens.shape == (2, 77) and tokens.dtype == torch.int64
            emb = F.normalize(model.encode_text(tokens), dim=-1).mean(dim=0)
            weights_per_class.append(emb / emb.norm())
        classifier = torch.stack(weights_per_class, dim=1)
        logits = 100.0 * F.normalize(model.encode_image(batch), dim=-1) @ classifier
    assert logits.shape == (4, 3) and torch.isfinite(logits).all()

    with pytest.raises(PretrainedError, match="no weights given"):
        load_rwkv_clip(model_name=TINY, pretrained="", cache_dir=None, device="cpu")


def test_register_adds_the_model_type(weights, tmp_path):
    _, path = weights
    # The two names of clip_benchmark.models (1.6.2) that dispatch `--model_type`.
    models = SimpleNamespace(
        TYPE2FUNC={"open_clip": None, "ja_clip": None}, MODEL_TYPES=["open_clip", "ja_clip"]
    )
    register(models)
    register(models)  # idempotent
    assert models.MODEL_TYPES == ["open_clip", "ja_clip", "rwkv_clip"]
    load = models.TYPE2FUNC["rwkv_clip"]
    model, transform, tokenizer = load(
        model_name=TINY, pretrained=str(path), cache_dir=str(tmp_path), device="cpu"
    )
    assert model.encode_text(tokenizer(["x"])).shape == (1, 64)
    # the model library's errors become the CLI's one-line UserErrors
    with pytest.raises(ClipBenchmarkError) as e:
        load(model_name=TINY, pretrained="laion400m_e32", cache_dir=None, device="cpu")
    assert isinstance(e.value, UserError) and "weights laion400m_e32 does not exist" in str(e.value)


def test_wrapper_arguments_and_missing_clip_benchmark(monkeypatch, capsys):
    assert prepare_argv(["eval", "--dataset", "cifar10", "--pretrained", "w.pt"]) == [
        "eval",
        "--model_type",
        "rwkv_clip",
        "--model",
        "RWKV_CLIP_B32",
        "--dataset",
        "cifar10",
        "--pretrained",
        "w.pt",
        "--no_amp",
    ]
    assert prepare_argv(
        ["eval", "--model=RWKV_CLIP_B16", "--pretrained=w.pt", "--model_type", "open_clip"]
    ) == ["eval", "--model=RWKV_CLIP_B16", "--pretrained=w.pt", "--model_type", "open_clip", "--no_amp"]
    # precision: fp32 unless --amp (CLIP_benchmark's own default, autocast), never both
    amp = prepare_argv(["eval", "--pretrained", "w.pt", "--amp"])
    assert "--amp" not in amp and "--no_amp" not in amp and precision_of(amp) == "amp"
    assert precision_of(prepare_argv(["eval", "--pretrained", "w.pt", "--no_amp"])) == "fp32"
    with pytest.raises(ClipBenchmarkError, match="--amp and --no_amp exclude each other"):
        prepare_argv(["eval", "--pretrained", "w.pt", "--amp", "--no_amp"])
    assert prepare_argv(["build", "a.json"]) == ["build", "a.json"]
    with pytest.raises(ClipBenchmarkError, match="eval needs weights: add --pretrained"):
        prepare_argv(["eval", "--dataset", "cifar10"])

    monkeypatch.setitem(sys.modules, "clip_benchmark", None)  # as on a machine without it
    rc = clip_benchmark_eval.main(["eval", "--dataset", "cifar10", "--pretrained", "w.pt"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("clip_benchmark_eval.py: error: cannot import CLIP_benchmark")
    assert "pip install clip-benchmark" in err and len(err.strip().splitlines()) == 1
    assert clip_benchmark_eval.main(["--help"]) == 0 and "--model_type rwkv_clip" in capsys.readouterr().out
