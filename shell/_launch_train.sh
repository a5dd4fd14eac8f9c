#!/usr/bin/env bash
# Shared launcher of the train_*.sh scripts: finds the shards under DATA_ROOT and starts
# train.py through torchrun, whose static rendezvous (MASTER_ADDR:MASTER_PORT, NNODES,
# NODE_RANK) joins the nodes; no ssh, no hard-coded addresses. Arguments go to train.py.
set -euo pipefail
# Paths in DATA_ROOT / OUTPUT stay relative to where the user runs the script.
REPO=$(cd "$(dirname "$0")/.." && pwd)
TRAIN_SCRIPT_NAME=${TRAIN_SCRIPT_NAME:-$(basename "$0")}

DATA_ROOT=${DATA_ROOT:-./YFCC15M}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-23760}
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
if [[ -z "${NPROC_PER_NODE:-}" ]]; then
    NPROC_PER_NODE=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [[ "$NPROC_PER_NODE" -ge 1 ]] 2>/dev/null || NPROC_PER_NODE=1
fi
for var in NNODES NODE_RANK MASTER_PORT NPROC_PER_NODE; do
    if ! [[ "${!var}" =~ ^[0-9]+$ ]]; then
        echo "${TRAIN_SCRIPT_NAME}: $var=${!var} is not a whole number; fix the environment variable" >&2
        exit 2
    fi
done
if (( NODE_RANK >= NNODES )); then
    echo "${TRAIN_SCRIPT_NAME}: NODE_RANK=$NODE_RANK must be below NNODES=$NNODES" >&2
    exit 2
fi

# The loader takes folders of shards; data2rec may have written them in sub-folders.
if [[ ! -d "$DATA_ROOT" ]]; then
    echo "${TRAIN_SCRIPT_NAME}: DATA_ROOT=$DATA_ROOT is not a folder; export DATA_ROOT=<folder of .rec/.idx shards>" >&2
    exit 2
fi
mapfile -t SHARD_DIRS < <(find -L "$DATA_ROOT" -maxdepth 3 -name '*.rec' -type f -printf '%h\n' | sort -u)
if (( ${#SHARD_DIRS[@]} == 0 )); then
    echo "${TRAIN_SCRIPT_NAME}: no .rec files under DATA_ROOT=$DATA_ROOT; convert the data with data2rec.py first" >&2
    exit 2
fi

CMD=("$PYTHON" -m torch.distributed.run
     --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE"
     --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT"
     "$REPO/train.py" --train-data "${SHARD_DIRS[@]}" "$@")
if [[ -n "${DRY_RUN:-}" ]]; then
    printf '%q ' "${CMD[@]}"
    echo
    exit 0
fi
exec "${CMD[@]}"
