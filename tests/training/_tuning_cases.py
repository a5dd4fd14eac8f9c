"""fla's autotuners tuned at the micro-batch, under Triton's interpreter (TRITON_INTERPRET=1):

    TRITON_INTERPRET=1 python -m tests.training._tuning_cases

prints one JSON line: what src/training/warmup.py leaves in the real fla autotuners after
warming the tiny model's WKV at two micro-batches. The interpreter cannot time a kernel (no GPU
clock), and fla's autotuners hold one configuration on a CPU (src/open_alip/wkv_fla.py pins
them); here the forward kernel's tuner is given two configurations again and a stand-in timer
that runs each candidate for real and calls the second one faster, so that a choice is made
exactly as on a GPU, only by another clock.
"""

from __future__ import annotations

import json

import torch

from src.open_alip import get_model_config
from src.open_alip.wkv_fla import fla_problem
from src.training import warmup

# The tiny model the warm-up tests use (tests/training/test_warmup.py imports it).
WARMUP_TINY = dict(
    n_layer=1,
    image_depth=1,
    n_embd=32,
    image_embed_dims=32,
    head_size=16,
    image_num_heads=2,
    input_size=16,
    dim_att=32,
    dim_ffn=64,
)
# Short captions here: the interpreter runs every candidate.
TINY = dict(WARMUP_TINY, ctx_len=12)


def main() -> dict:
    import triton
    from fla.ops.rwkv6 import fused_recurrent

    assert fla_problem("cpu") is None, fla_problem("cpu")
    (tuner,) = [t for t in warmup.autotuners(fused_recurrent) if t.base_fn.__name__.endswith("fwd_kernel")]
    tuner.configs = [triton.Config({}, num_warps=1), triton.Config({}, num_warps=2)]
    timings = iter([2.0, 1.0] * 100)  # per candidate, in the order tried: the second is faster

    def stand_in_timer(kernel_call, quantiles):
        kernel_call()  # the candidate runs, under the interpreter
        value = next(timings)
        return [value, value, value]

    tuner.__dict__["do_bench"] = stand_in_timer  # Autotuner.do_bench is a cached property
    cfg = get_model_config("RWKV_CLIP_tiny", **TINY)
    report: dict = {"choices": {}}
    for micro in (3, 5):
        warmup.warm_wkv(cfg, "fla", micro, torch.device("cpu"), precision="fp32", force=True)
        report["choices"][micro] = warmup.tuning_choices(micro)
        report[f"fwd_cache_{micro}"] = [
            dict(zip(tuner.keys, map(str, key)), num_warps=config.num_warps)
            for key, config in tuner.cache.items()
        ]
    report["keys"] = {t.base_fn.__name__: list(t.keys) for t in warmup.autotuners(fused_recurrent)}
    report["changed_again"] = warmup.key_tuning_by_shape()
    return report


if __name__ == "__main__":
    print(json.dumps(main()))
