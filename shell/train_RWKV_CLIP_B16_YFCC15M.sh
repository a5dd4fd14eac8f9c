#!/usr/bin/env bash
# Train RWKV-CLIP B/16 on YFCC15M: the B/32 recipe with 16-pixel patches (196 image tokens,
# about 4x the image-tower compute; lower the batch with `--batch-size N --accum-freq K` if
# a GPU runs out of memory, which keeps the contrastive batch the same).
#
#   export DATA_ROOT=/data/YFCC15M
#   bash shell/train_RWKV_CLIP_B16_YFCC15M.sh [extra train.py flags...]
#
# Same environment variables as shell/train_RWKV_CLIP_B32_YFCC15M.sh (multi-node included).
set -euo pipefail
export MODEL=RWKV_CLIP_B16 PATCH_SIZE=16 TRAIN_SCRIPT_NAME=${TRAIN_SCRIPT_NAME:-$(basename "$0")}
exec "$(dirname "$0")/train_RWKV_CLIP_B32_YFCC15M.sh" "$@"
