#!/usr/bin/env bash
# Zero-shot image<->text retrieval (R@1/5/10) of an RWKV-CLIP checkpoint on the MSCOCO (5k) and
# Flickr30k (1k) test splits, with the original protocol ("a photo of " before each caption).
# Edit the settings below or override them from the environment:
#   MODEL_WEIGHT=RWKV-CLIP-B32-YFCC15M.pt COCO=/data/coco/coco_test.json COCO_IMAGES=/data/coco \
#       FLICKR=/data/flickr30k/flickr30k_test.json bash shell/test_zero_shot_retrieval.sh [extra retrieval.py flags]
# COCO / FLICKR: the ALBEF/BLIP test JSON (what the original reads) or a Karpathy dataset_*.json
# (or its folder). *_IMAGES: the image root, by default the JSON's folder; an entry
# "val2014/x.jpg" is found at ROOT/val2014/x.jpg or ROOT/x.jpg. See `python retrieval.py --help`.
set -euo pipefail
cd "$(dirname "$0")/.."

######################### Model #########################
model_name=${MODEL_NAME:-}  # empty: the config the weights record (or the shipped one they fit); else a name or JSON
model_weight=${MODEL_WEIGHT:-MODEL_WEIGHT_PATH}  # .pt/.safetensors file or hf-hub:ORG/REPO[/FILE]
batch_size=${BATCH_SIZE:-120}
protocol=${PROTOCOL:-original}

######################### Eval Settings #########################
output_dir=${OUTPUT_DIR:-OUTPUT_PATH}/eval
coco=${COCO:-data/eval/coco/coco_test.json}
flickr=${FLICKR:-data/eval/flickr30k/flickr30k_test.json}
device=${DEVICE:-auto}
PYTHON=${PYTHON:-.venv/bin/python}

model_args=()
[ -n "$model_name" ] && model_args=(--model-name "$model_name")

# A local file must exist; hf-hub:ORG/REPO[/FILE] is fetched (and checked) by the Python loader.
if [[ "$model_weight" != hf-hub:* && ! -f "$model_weight" ]]; then
    echo "error: weights '$model_weight' not found; set MODEL_WEIGHT to a .pt or .safetensors file or hf-hub:ORG/REPO[/FILE]" >&2
    exit 2
fi

run() {  # NAME JSON IMAGE_ROOT EXTRA_FLAGS...
    local name=$1 json=$2 images=$3 root=()
    shift 3
    [ -n "$images" ] && root=(--image-root "$images")
    "$PYTHON" retrieval.py \
        "${model_args[@]}" \
        --model-weight "$model_weight" \
        --protocol "$protocol" \
        --batch-size "$batch_size" \
        --datasets "$name=$json" "${root[@]}" \
        --output-dir "$output_dir" \
        --device "$device" \
        "$@"
}

echo "######################## Retrieval Start ########################"
run coco "$coco" "${COCO_IMAGES:-}" "$@"
run flickr30k "$flickr" "${FLICKR_IMAGES:-}" "$@"
