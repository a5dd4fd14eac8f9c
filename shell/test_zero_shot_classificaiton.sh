#!/usr/bin/env bash
# Zero-shot classification of an RWKV-CLIP checkpoint (the original repo's script name, sic).
# Edit the settings below or override them from the environment, e.g.
#   MODEL_WEIGHT=RWKV-CLIP-B32-YFCC15M.pt DATA_ROOT=/data bash shell/test_zero_shot_classificaiton.sh
# Each dataset is NAME=PATH (or a bare NAME found under DATA_ROOT); see `python zero_shot.py --help`.
set -euo pipefail
cd "$(dirname "$0")/.."

######################### Model #########################
model_name=${MODEL_NAME:-RWKV_CLIP_B32}          # shipped config name or a JSON config file
model_weight=${MODEL_WEIGHT:-MODEL_WEIGHT_PATH}  # checkpoint .pt
batch_size=${BATCH_SIZE:-120}

######################### Eval Settings #########################
output_dir=${OUTPUT_DIR:-OUTPUT_PATH}/eval
data_root=${DATA_ROOT:-data/eval}
zero_shot_dataset=${DATASETS:-cifar10,cifar100,imagenet}
device=${DEVICE:-auto}
PYTHON=${PYTHON:-.venv/bin/python}

if [ ! -f "$model_weight" ]; then
    echo "error: checkpoint '$model_weight' not found; set MODEL_WEIGHT=path/to/checkpoint.pt" >&2
    exit 2
fi
mkdir -p "$output_dir"

echo "######################## Zero-shot Classification Start ########################"
"$PYTHON" zero_shot.py \
    --model-name "$model_name" \
    --model-weight "$model_weight" \
    --batch-size "$batch_size" \
    --data-root "$data_root" \
    --datasets "$zero_shot_dataset" \
    --output-dir "$output_dir" \
    --device "$device"
