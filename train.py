#!/usr/bin/env python
"""Train RWKV-CLIP on RecordIO shards.

One process:      python train.py --train-data DATA --output runs/b32 --config RWKV_CLIP_B32
One node, 8 GPUs: torchrun --nproc_per_node 8 train.py ...
The B/32 recipe:  bash shell/train_RWKV_CLIP_B32_YFCC15M.sh (any number of GPUs and nodes)
Resume after a kill: add --resume latest.
Zero-shot accuracy at epoch ends: --zeroshot-data imagenet=/data/imagenet/val --zeroshot-frequency 1
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from src.errors import UserError, report
    from src.training.params import parse_config

    try:
        config = parse_config(argv)  # --help and flag errors answer before torch is imported
        from src.training.main import run

        hooks = []
        if config.zeroshot_data:
            from src.evaluation.hook import zero_shot_epoch_hook

            # Built (and its data read) before training, so a wrong path fails at once.
            hooks.append(zero_shot_epoch_hook(config.zeroshot_data, frequency=config.zeroshot_frequency))
        run(config, epoch_end_hooks=hooks)
    except UserError as exc:
        from src.training.launch import leave_error_for_launcher

        leave_error_for_launcher(f"train.py: error: {exc}")  # for the shell launcher's last line
        return report("train.py", exc)
    except KeyboardInterrupt:
        print("train.py: interrupted; resume with --resume latest", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
