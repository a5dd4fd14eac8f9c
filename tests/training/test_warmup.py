"""Kernel tuning at the real batch (src/training/warmup.py, the planner's GPU batches).

The Triton autotuner's choice can only be made on a GPU; here the real fla autotuner objects
are checked to be found and cleared, and the warm-up itself runs with the chunked WKV on CPU."""

import pytest
import torch

from src.open_alip import get_model_config
from src.perf.cost_model import BATCHES, wkv_batches
from src.training.warmup import autotuners, forget_tuning, warm_wkv
from tests.training._tuning_cases import WARMUP_TINY as TINY


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


def test_fla_tunes_at_the_micro_batch_for_each_tower_apart():
    # Under Triton's interpreter in a child process; only the GPU's clock is a stand-in there
    # (tests/training/_tuning_cases.py): fla's real autotuner chooses among two configurations.
    from tests._wkv_fla_cases import run_report

    report = run_report("tests.training._tuning_cases")
    keys = report["keys"]
    assert keys["fused_recurrent_rwkv6_fwd_kernel"] == ["BK", "BV", "B", "T", "H"]
    assert keys["fused_recurrent_rwkv6_bwd_kernel_dw"] == ["K", "T", "H"]  # takes no batch: no choice on disk
    assert report["changed_again"] == 0
    for micro in (3, 5):
        # The image tower (4 tokens) and the text tower (12) each got a choice of their own, at this
        # micro-batch only: the earlier micro-batch's choices were forgotten before tuning.
        cache = report[f"fwd_cache_{micro}"]
        assert sorted((c["B"], c["T"], c["H"]) for c in cache) == [
            (str(micro), "12", "2"),
            (str(micro), "4", "2"),
        ]
        assert all(c["num_warps"] == 2 for c in cache)  # the faster of the two, by the stand-in clock
        lines = [
            line
            for line in report["choices"][str(micro)]
            if line.startswith("fused_recurrent_rwkv6_fwd_kernel")
        ]
        assert lines == [
            f"fused_recurrent_rwkv6_fwd_kernel [BK=16 BV=16 B={micro} T={t} H=2 float32]: num_warps: 2, "
            "num_ctas: 1, num_stages: 3, maxnreg: None"
            for t in (12, 4)
        ]
