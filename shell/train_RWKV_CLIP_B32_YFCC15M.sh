#!/usr/bin/env bash
# Train RWKV-CLIP B/32 on YFCC15M as the original paper's run did (deepglint/RWKV-CLIP,
# shell/train_RWKV_CLIP_B32_YFCC15M.sh and train.py): a global batch of 4,096 (512 per GPU
# on 8 GPUs), AdamW lr 1e-3, betas (0.9 cycled by OneCycle, 0.98), eps 1e-8, weight decay
# 0.2, OneCycle schedule ("cosine") rising over the first 10%, 32 epochs, bf16 autocast,
# gradient clipping at 1. The architecture (drop path 0.3 included) is --config's JSON.
#
#   export DATA_ROOT=/data/YFCC15M          # folder(s) of .rec/.idx shards from data2rec.py
#   bash shell/train_RWKV_CLIP_B32_YFCC15M.sh [extra train.py flags...]
#
# On fewer than 8 GPUs the global batch stays 4,096: each GPU accumulates micro-batches.
# --batch-size auto sizes them from the cost model's measured memory per sample for this GPU
# and WKV implementation (with gradient checkpointing when that is cheaper than accumulating),
# and logs its choice; --batch-size N sets the largest micro-batch yourself.
# A --global-batch-size other than 4,096 is the user's choice and is announced loudly.
#
# Multi-node: run the same command on every node with the same MASTER_ADDR/MASTER_PORT
# and NNODES, and each node's own NODE_RANK (0 on the node at MASTER_ADDR); MASTER_ADDR
# must be node 0's address as the other nodes reach it (README: "Training on GPUs" names
# the NCCL variables hosts with several network interfaces need):
#
#   NNODES=4 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=23760 bash shell/train_RWKV_CLIP_B32_YFCC15M.sh
#
# Environment (defaults in brackets): DATA_ROOT [./YFCC15M; several folders, .rec files or
# prefixes separated by spaces or colons], OUTPUT [./output/RWKV_CLIP_B32_YFCC15M], NNODES
# [1], NODE_RANK [0], MASTER_ADDR [127.0.0.1], MASTER_PORT [23760], NPROC_PER_NODE [the GPUs
# torch sees, CUDA_VISIBLE_DEVICES included; else 1], PYTHON [.venv/bin/python if present,
# else python3], DRY_RUN [unset; 1 prints the command instead of running it].
# Re-running the same command after a crash resumes from the newest checkpoint in OUTPUT
# (for several nodes OUTPUT must be a folder all nodes share).
# Flags given on the command line come last, so they override the ones below.
set -euo pipefail
export TRAIN_SCRIPT_NAME=${TRAIN_SCRIPT_NAME:-$(basename "$0")}
MODEL=${MODEL:-RWKV_CLIP_B32}
OUTPUT=${OUTPUT:-./output/${MODEL}_YFCC15M}
RECIPE_GLOBAL_BATCH=4096

# The last --global-batch-size given (argparse keeps the last one too).
chosen=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --global-batch-size) chosen=${args[i + 1]:-} ;;
        --global-batch-size=*) chosen=${args[i]#*=} ;;
    esac
done
if [[ -n "$chosen" && "$chosen" != "$RECIPE_GLOBAL_BATCH" ]]; then
    echo "${TRAIN_SCRIPT_NAME}: NOTICE: --global-batch-size $chosen replaces the recipe's $RECIPE_GLOBAL_BATCH" \
         "(512 per GPU x 8 GPUs in the paper's run); the contrastive batch, and so the results, will differ" >&2
fi

exec "$(dirname "$0")/_launch_train.sh" \
    --config "$MODEL" \
    --global-batch-size "$RECIPE_GLOBAL_BATCH" \
    --batch-size auto \
    --epochs 32 \
    --lr 1e-3 \
    --lr-scheduler cosine \
    --warmup 0.1 \
    --beta2 0.98 \
    --eps 1e-8 \
    --weight-decay 0.2 \
    --grad-clip-norm 1.0 \
    --precision bf16 \
    --workers 10 \
    --output "$OUTPUT" \
    --resume latest \
    "$@"
