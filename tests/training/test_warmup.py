"""Kernel tuning at the real batch (src/training/warmup.py, the planner's GPU batches).

The Triton autotuner's choice can only be made on a GPU; here the real fla autotuner objects
are checked to be found and cleared, and the warm-up itself runs with the chunked WKV on CPU."""

import pytest
import torch

from src.open_alip import get_model_config
from src.perf.cost_model import BATCHES, wkv_batches
from src.training.warmup import autotuners, forget_tuning, warm_wkv

TINY = dict(n_layer=1, image_depth=1, n_embd=32, image_embed_dims=32, head_size=16, image_num_heads=2,
            input_size=16, dim_att=32, dim_ffn=64)


def test_fla_autotuner_choices_are_forgotten():
    recurrent = pytest.importorskip("fla.ops.rwkv6.fused_recurrent")
    tuners = autotuners(recurrent)
    assert tuners, "fla's RWKV-6 kernels are no longer triton autotuners: update warmup.py"
    for tuner in tuners:
        tuner.cache[(64, 64, "stand-in key")] = tuner.configs[0]  # what a tiny first call leaves
    assert forget_tuning() == len(tuners)
    assert all(not tuner.cache for tuner in tuners)


def test_warm_up_runs_at_the_micro_batch_and_skips_where_nothing_is_tuned():
    cfg = get_model_config("RWKV_CLIP_tiny", **TINY)
    assert warm_wkv(cfg, "chunked", 4, torch.device("cpu")) is None  # CPU: no autotuner to steer
    assert warm_wkv(cfg, "fla", 4, torch.device("cpu")) is None
    assert warm_wkv(cfg, "chunked", 4, torch.device("cpu"), precision="fp32", force=True) >= 0


def test_the_planner_measures_a_real_gpu_wkv_at_a_batch_of_64_or_more():
    assert min(wkv_batches("cuda", fake=False)) >= 64
    assert wkv_batches("cpu", fake=True) == BATCHES == wkv_batches("cpu", fake=False)
