"""The fla (flash-linear-attention) WKV: exact against the reference, selectable, compilable.

The fla kernels are Triton code. With no GPU here they run under Triton's interpreter,
which must be switched on (TRITON_INTERPRET=1) before fla is imported, so those checks
run in one child process (tests/_wkv_fla_cases.py) and are asserted here case by case.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from src.open_alip import create_model
from src.open_alip import wkv_bi_triton as bi_binding
from src.open_alip import wkv_fla as fla_binding
from src.open_alip.rwkv6 import TimeMix
from src.open_alip.wkv import (
    WKV_IMPL_CHOICES,
    available_implementations,
    resolve_wkv_impl,
    wkv,
)
from tests._repo import REPO as REPO_ROOT
from tests._wkv_fla_cases import CASES, GRADIENTS, run_report, tolerance


@pytest.fixture(scope="module")
def interpreted() -> dict:
    return run_report("tests._wkv_fla_cases")


@pytest.mark.parametrize("case", list(CASES))
def test_fla_forward_and_every_gradient_match_the_reference(interpreted, case):
    result = interpreted["cases"][case]
    for name in ("y", *GRADIENTS, "w_where_logit_le_0"):
        err = result[name]
        assert err["finite"], f"{case}: {name} has inf/nan"
        # A reference gradient that is exactly 0 (w at T <= 2) leaves only rounding noise.
        scale = err["max_abs_ref"] or 1.0
        assert err["max_abs_err"] <= tolerance(name) * scale, f"{case}: {name} {err}"


def test_fla_keeps_float32_under_autocast(interpreted):
    assert interpreted["autocast"] == {"dtype": "torch.float32", "max_abs_diff": 0.0}


def test_fla_compiles_into_one_graph_with_aot_eager(interpreted):
    # TimeMix on fla, fullgraph=True, forward + backward: identical to eager fla and
    # within float32 rounding of the chunked PyTorch form (output, input and 19 parameter grads).
    result = interpreted["compile"]
    assert result["tensors"] == 21
    assert result["compiled_vs_eager"] == 0.0
    assert result["compiled_vs_chunked"] < 1e-5


def test_names_under_the_interpreter(interpreted):
    names = interpreted["names"]
    assert names["available_cpu"] == ["chunked", "reference", "fla", "bi_triton"]
    assert names["auto_cpu"] == "chunked"  # the interpreter is for checks, never the default
    assert names["auto_cuda"] == "fla"  # fla imports here, so a CUDA tensor would get it
    assert names["fla_cpu"] == "fla"
    assert "runs only on CUDA" in names["fla_chunk_cpu"]


# ------------------------------------------------------- without the interpreter (this process)


@pytest.fixture
def no_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(fla_binding, "_problems", {})
    monkeypatch.setattr(bi_binding, "_problems", {})


def test_auto_is_chunked_on_cpu_and_fla_needs_the_interpreter_there(no_interpreter):
    assert resolve_wkv_impl("auto", "cpu") == "chunked"
    assert available_implementations("cpu") == ["chunked", "reference"]
    with pytest.raises(ValueError, match="cannot run on cpu: .*set TRITON_INTERPRET=1"):
        resolve_wkv_impl("fla", "cpu")
    inputs = [torch.randn(1, 3, 4) for _ in range(4)] + [torch.randn(1, 4)]
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        wkv(*inputs, impl="fla")
    with pytest.raises(ValueError, match="'fla_chunk' cannot run on cpu: it runs only on CUDA"):
        resolve_wkv_impl("fla_chunk", "cpu")


def test_auto_follows_whether_fla_can_run_on_cuda(monkeypatch):
    # The probe's answer stands in for a GPU; the choice made from it is what is tested.
    monkeypatch.setattr(fla_binding, "_problems", {"cuda": None})
    assert resolve_wkv_impl("auto", "cuda") == "fla"
    assert resolve_wkv_impl("fla_chunk", torch.device("cuda", 1)) == "fla_chunk"
    monkeypatch.setattr(fla_binding, "_problems", {"cuda": "it needs the fla-core and triton packages"})
    assert resolve_wkv_impl("auto", "cuda") == "chunked"
    with pytest.raises(ValueError, match="'fla' cannot run on cuda: it needs the fla-core"):
        resolve_wkv_impl("fla", "cuda")


def test_unknown_names_are_refused_with_the_choices():
    choices = ", ".join(WKV_IMPL_CHOICES)
    assert WKV_IMPL_CHOICES == ("auto", "chunked", "reference", "fla", "fla_chunk", "bi_triton")
    with pytest.raises(ValueError, match=f"unknown wkv implementation 'cuda'; choose one of {choices}$"):
        resolve_wkv_impl("cuda", "cpu")
    with pytest.raises(ValueError, match="unknown wkv implementation 'triton'"):
        create_model("RWKV_CLIP_tiny", wkv_impl="triton")
    model = create_model("RWKV_CLIP_tiny", wkv_impl="reference")
    impls = {m.wkv_impl for m in model.modules() if isinstance(m, TimeMix)}
    assert impls == {"reference"}
    model.set_wkv_impl("auto")
    assert {m.wkv_impl for m in model.modules() if isinstance(m, TimeMix)} == {"auto"}
    with pytest.raises(ValueError, match="unknown wkv implementation 'gpu'"):
        model.set_wkv_impl("gpu")


def test_model_on_cpu_never_imports_fla():
    code = (
        "import sys, torch\n"
        "from src.open_alip import create_model, tokenize\n"
        "model = create_model('RWKV_CLIP_tiny').eval()\n"
        "with torch.no_grad(): model(torch.randn(1, 3, 32, 32), tokenize(['a cat']))\n"
        "assert not any(m == 'fla' or m.startswith('fla.') for m in sys.modules), 'fla imported'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_chunked_model_compiles_into_graphs_that_match_eager():
    # The whole model (both towers' shifts, norms and the chunked WKV with its custom
    # backward) through dynamo + AOTAutograd, forward and backward; one layer per tower
    # and 20 text tokens keep the compile short.
    torch.manual_seed(0)
    model = create_model("RWKV_CLIP_tiny", wkv_impl="chunked", n_layer=1, image_depth=1, ctx_len=20)
    images = torch.randn(2, 3, 32, 32)
    tokens = torch.randint(1, 1000, (2, 20))

    def step(module) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        image, text, scale = module(images, tokens)
        (image.square().sum() + text.square().sum() + scale).backward()
        return [image.detach(), text.detach()] + [p.grad.clone() for p in model.parameters()]

    eager = step(model)
    compiled = step(torch.compile(model, backend="aot_eager", fullgraph=True))
    for a, b in zip(compiled, eager):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
