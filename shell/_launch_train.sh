#!/usr/bin/env bash
# Shared launcher of the train_*.sh scripts. src/training/launch.py reads the environment
# (DATA_ROOT, NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, NPROC_PER_NODE, DRY_RUN), resolves
# the arguments with train.py's own parser (a bad flag fails here, before any process starts),
# counts this node's GPUs with torch, lists the shards it found under DATA_ROOT and starts
# train.py through torchrun, whose static rendezvous joins the nodes (no ssh, no hard-coded
# addresses). Arguments go to train.py. Paths in DATA_ROOT / OUTPUT stay relative to where
# the script is run.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
export TRAIN_SCRIPT_NAME=${TRAIN_SCRIPT_NAME:-$(basename "$0")}
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$REPO/.venv/bin/python" ]]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m src.training.launch "$@"
