#!/usr/bin/env bash
# Train RWKV-CLIP B/16 on YFCC15M: train.py's recipe rwkv_clip_b16_yfcc15m, the B/32 recipe
# (global batch 4,096 and all) with the B/16 architecture (16-pixel patches: 196 image tokens,
# about 4x the image tower's compute and activation memory). The recipe's `--batch-size auto`
# sizes the micro-batch and turns on gradient checkpointing to fit the GPU; accumulation keeps
# the global batch at 4,096.
#
#   export DATA_ROOT=/data/YFCC15M
#   bash shell/train_RWKV_CLIP_B16_YFCC15M.sh [extra train.py flags...]
#
# Same environment variables as shell/train_RWKV_CLIP_B32_YFCC15M.sh (multi-node included);
# OUTPUT defaults to ./output/RWKV_CLIP_B16_YFCC15M.
set -euo pipefail
export TRAIN_SCRIPT_NAME=${TRAIN_SCRIPT_NAME:-$(basename "$0")}
exec "$(dirname "$0")/_launch_train.sh" --recipe rwkv_clip_b16_yfcc15m \
    --output "${OUTPUT:-./output/RWKV_CLIP_B16_YFCC15M}" --resume latest "$@"
