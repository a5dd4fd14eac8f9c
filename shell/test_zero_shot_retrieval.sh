#!/usr/bin/env bash
# Zero-shot image<->text retrieval (R@1/5/10) of an RWKV-CLIP checkpoint on the Karpathy test
# splits of MSCOCO and Flickr30k. Edit the settings below or override them from the environment:
#   MODEL_WEIGHT=RWKV-CLIP-B32-YFCC15M.pt COCO=/data/coco FLICKR=/data/flickr30k bash shell/test_zero_shot_retrieval.sh
# COCO is a folder with dataset_coco.json and val2014/; FLICKR a folder with dataset_flickr30k.json
# and the images (directly or in flickr30k-images/). See `python retrieval.py --help`.
set -euo pipefail
cd "$(dirname "$0")/.."

######################### Model #########################
model_name=${MODEL_NAME:-RWKV_CLIP_B32}
model_weight=${MODEL_WEIGHT:-MODEL_WEIGHT_PATH}
batch_size=${BATCH_SIZE:-120}

######################### Eval Settings #########################
output_dir=${OUTPUT_DIR:-OUTPUT_PATH}/eval
coco=${COCO:-data/eval/coco}
flickr=${FLICKR:-data/eval/flickr30k}
device=${DEVICE:-auto}
PYTHON=${PYTHON:-.venv/bin/python}

if [ ! -f "$model_weight" ]; then
    echo "error: checkpoint '$model_weight' not found; set MODEL_WEIGHT=path/to/checkpoint.pt" >&2
    exit 2
fi
mkdir -p "$output_dir"

echo "######################## Retrieval Start ########################"
"$PYTHON" retrieval.py \
    --model-name "$model_name" \
    --model-weight "$model_weight" \
    --batch-size "$batch_size" \
    --datasets "coco=$coco" "flickr30k=$flickr" \
    --output-dir "$output_dir" \
    --device "$device"
