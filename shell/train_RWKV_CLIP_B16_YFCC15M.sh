#!/usr/bin/env bash
# Train RWKV-CLIP B/16 on YFCC15M: the B/32 recipe (global batch 4,096 and all) with the
# B/16 architecture (16-pixel patches: 196 image tokens, about 4x the image tower's compute
# and activation memory). `--batch-size auto` (the B/32 script's) sizes the micro-batch and
# turns on gradient checkpointing to fit the GPU; accumulation keeps the global batch at 4,096.
#
#   export DATA_ROOT=/data/YFCC15M
#   bash shell/train_RWKV_CLIP_B16_YFCC15M.sh [extra train.py flags...]
#
# Same environment variables as shell/train_RWKV_CLIP_B32_YFCC15M.sh (multi-node included).
set -euo pipefail
export MODEL=RWKV_CLIP_B16 TRAIN_SCRIPT_NAME=${TRAIN_SCRIPT_NAME:-$(basename "$0")}
exec "$(dirname "$0")/train_RWKV_CLIP_B32_YFCC15M.sh" "$@"
