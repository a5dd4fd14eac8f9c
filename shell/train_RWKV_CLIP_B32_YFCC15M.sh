#!/usr/bin/env bash
# Train RWKV-CLIP B/32 on YFCC15M as the original paper's run did: train.py's recipe
# rwkv_clip_b32_yfcc15m (src/training/config.py, RECIPES; `python train.py --help` lists its
# settings): the paper's global batch, AdamW with the original's OneCycle schedule, bf16
# autocast. The architecture (drop path 0.3 included) is the model config's JSON.
#
#   export DATA_ROOT=/data/YFCC15M          # folder(s) of .rec/.idx shards from data2rec.py
#   bash shell/train_RWKV_CLIP_B32_YFCC15M.sh [extra train.py flags...]
#
# On fewer GPUs than the paper's 8 the global batch stays the same: each GPU accumulates
# micro-batches. The recipe's --batch-size auto sizes them from the cost model's measured
# memory per sample for this GPU and WKV implementation (with gradient checkpointing when that
# is cheaper than accumulating), and logs its choice; --batch-size N sets the largest
# micro-batch yourself. Flags given to the script win over the recipe's values; one that
# changes what is trained (e.g. another --global-batch-size) is announced with a NOTICE.
#
# Multi-node: run the same command on every node with the same MASTER_ADDR/MASTER_PORT
# and NNODES, and each node's own NODE_RANK (0 on the node at MASTER_ADDR); MASTER_ADDR
# must be node 0's address as the other nodes reach it (README: "Training on GPUs" names
# the NCCL variables hosts with several network interfaces need):
#
#   NNODES=4 NPROC_PER_NODE=8 NODE_RANK=0 MASTER_ADDR=10.0.0.1 MASTER_PORT=23760 bash shell/train_RWKV_CLIP_B32_YFCC15M.sh
#
# Environment (defaults in brackets): DATA_ROOT [./YFCC15M; several folders, .rec files or
# prefixes separated by spaces or colons; a path holding a space: alone, or colon-separated], OUTPUT [./output/RWKV_CLIP_B32_YFCC15M], NNODES
# [1], NODE_RANK [0], MASTER_ADDR [127.0.0.1], MASTER_PORT [23760], NPROC_PER_NODE [the GPUs
# torch sees, CUDA_VISIBLE_DEVICES included; else 1; required when NNODES > 1], PYTHON [.venv/bin/python if present,
# else python3], DRY_RUN [unset; 1 prints the command instead of running it].
# Re-running the same command after a crash resumes from the newest checkpoint in OUTPUT
# (for several nodes OUTPUT must be a folder all nodes share).
set -euo pipefail
export TRAIN_SCRIPT_NAME=${TRAIN_SCRIPT_NAME:-$(basename "$0")}
exec "$(dirname "$0")/_launch_train.sh" --recipe rwkv_clip_b32_yfcc15m \
    --output "${OUTPUT:-./output/RWKV_CLIP_B32_YFCC15M}" --resume latest "$@"
