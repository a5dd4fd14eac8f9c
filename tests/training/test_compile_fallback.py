"""A torch.compile failure falls back to the eager model with one warning, and the step finishes
(src/training/compiled.py, the Trainer in src/training/loop.py, built as train.py builds it).

The failing compiler is a real dynamo backend registered here that raises when asked to
compile, as a broken toolchain would; the other failure is an unknown backend name."""

from __future__ import annotations

import logging

import pytest
import torch

from src.training.config import build_config
from src.training.distributed import DistEnv
from src.training.main import build_training_step

CPU = DistEnv(0, 0, 1, torch.device("cpu"), None)


def _broken_backend(gm, example_inputs):
    raise RuntimeError("the stand-in compiler cannot compile anything")


@pytest.fixture(scope="module", autouse=True)
def _register_broken_backend():
    # Registered when these tests run, not when the suite is collected: importing torch._dynamo
    # costs every pytest worker about a second, and only the one running this file needs it.
    from torch._dynamo import list_backends, register_backend

    if "rwkv_clip_test_broken" not in list_backends(exclude_tags=()):
        register_backend(_broken_backend, name="rwkv_clip_test_broken")


def _step(backend: str, tmp_path):
    cfg = build_config(
        {
            "config": "RWKV_CLIP_tiny",
            "batch_size": 2,
            "wkv_impl": "chunked",
            "compile": True,
            "compile_backend": backend,
            "precision": "fp32",
            "device": "cpu",
            "train_data": ["(generated batches)"],
            "output": str(tmp_path),
        },
        {},
    )
    trainer, plan = build_training_step(cfg, CPU, total_steps=4)
    g = torch.Generator().manual_seed(0)
    size, ctx = cfg.model["input_size"], cfg.model["ctx_len"]
    micro = [
        (
            torch.randn(plan.micro_batch, 3, size, size, generator=g),
            torch.randint(1, 49406, (plan.micro_batch, ctx), generator=g),
        )
    ]
    before = [p.detach().clone() for p in trainer.raw_model.parameters()]
    result = trainer.step(micro, 0)
    result = trainer.step(micro, 1)  # the second step runs eagerly with no new warning
    changed = any(not torch.equal(a, p) for a, p in zip(before, trainer.raw_model.parameters()))
    return trainer, result, changed


@pytest.mark.parametrize("backend", ["rwkv_clip_test_broken", "no_such_backend"])
def test_a_compile_failure_warns_once_and_the_step_finishes_eagerly(backend, tmp_path, caplog):
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="rwkv_clip.train"):
        trainer, result, changed = _step(backend, tmp_path)
    warnings = [r.getMessage() for r in caplog.records if "torch.compile" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"torch.compile (backend {backend}) failed" in warnings[0] and "continues EAGERLY" in warnings[0]
    assert torch.isfinite(result.loss) and changed
    assert trainer.model is trainer.raw_model and trainer.eager_fallback is None
    torch._dynamo.reset()
