#!/usr/bin/env bash
# Train RWKV-CLIP B/32 on YFCC15M with the original paper's hyper-parameters.
#
#   export DATA_ROOT=/data/YFCC15M          # folder(s) of .rec/.idx shards from data2rec.py
#   bash shell/train_RWKV_CLIP_B32_YFCC15M.sh [extra train.py flags...]
#
# Multi-node: run the same command on every node with the same MASTER_ADDR/MASTER_PORT
# and NNODES, and each node's own NODE_RANK (0 on the node at MASTER_ADDR):
#
#   NNODES=4 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=23760 bash shell/train_RWKV_CLIP_B32_YFCC15M.sh
#
# Environment (defaults in brackets): DATA_ROOT [./YFCC15M], OUTPUT
# [./output/RWKV_CLIP_B32_YFCC15M], NNODES [1], NODE_RANK [0], MASTER_ADDR [127.0.0.1],
# MASTER_PORT [23760], NPROC_PER_NODE [number of GPUs, else 1], PYTHON [.venv/bin/python
# if present, else python3], DRY_RUN [unset; 1 prints the command instead of running it].
# Re-running the same command after a crash resumes from the newest checkpoint in OUTPUT
# (for several nodes OUTPUT must be a folder all nodes share).
# Flags given on the command line come last, so they override the ones below.
set -euo pipefail
export TRAIN_SCRIPT_NAME=${TRAIN_SCRIPT_NAME:-$(basename "$0")}
MODEL=${MODEL:-RWKV_CLIP_B32}
PATCH_SIZE=${PATCH_SIZE:-32}
OUTPUT=${OUTPUT:-./output/${MODEL}_YFCC15M}
exec "$(dirname "$0")/_launch_train.sh" \
    --config "$MODEL" \
    --input-size 224 \
    --image-depth 12 \
    --image-embed-dims 640 \
    --image-patch-size "$PATCH_SIZE" \
    --image-hidden-rate 5 \
    --image-num-heads 8 \
    --drop-path-rate 0.3 \
    --ctx-len 77 \
    --vocab-size 49408 \
    --head-size 64 \
    --head-size-divisor 8 \
    --n-embd 640 \
    --n-layer 6 \
    --text-initialization True \
    --batch-size 512 \
    --epochs 32 \
    --lr 1e-3 \
    --lr-scheduler onecycle \
    --warmup 0.1 \
    --beta1 0.9 \
    --beta2 0.98 \
    --weight-decay 0.2 \
    --grad-clip-norm 1.0 \
    --precision bf16 \
    --workers 10 \
    --output "$OUTPUT" \
    --resume latest \
    "$@"
