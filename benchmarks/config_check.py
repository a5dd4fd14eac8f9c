"""Seconds to find that weights do not fit a config: the shape check on a meta-device model
(model.check_fits, what create_model_and_transforms runs first) against building the real model,
which is what loading without the check had to do before it could compare shapes.

    .venv/bin/python -m benchmarks.config_check                  # RWKV_CLIP_B32
    .venv/bin/python -m benchmarks.config_check --config RWKV_CLIP_B16 --rounds 5

The weights are the tiny test config's (random), so every check ends in a mismatch, as it does
for a user who passed the wrong config. Median of the rounds, wall clock.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from src.open_alip.model import RWKV_CLIP, CheckpointMismatchError, check_fits, get_model_config


def _median_seconds(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="RWKV_CLIP_B32")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    config = get_model_config(args.config)
    torch.manual_seed(0)
    weights = RWKV_CLIP(get_model_config("RWKV_CLIP_tiny")).state_dict()

    def check() -> None:
        try:
            check_fits(config, weights)
        except CheckpointMismatchError:
            return
        raise AssertionError("the tiny weights fitted")

    def build() -> None:
        RWKV_CLIP(config)

    checked = _median_seconds(check, args.rounds)
    built = _median_seconds(build, args.rounds)
    print(
        f"{args.config}: shape check on meta {checked:.3f} s, building the model {built:.2f} s, "
        f"ratio {built / checked:.0f}x ({torch.get_num_threads()} threads, median of {args.rounds})"
    )


if __name__ == "__main__":
    main()
