#!/usr/bin/env bash
# Zero-shot image<->text retrieval (R@1/5/10) of an RWKV-CLIP checkpoint on the MSCOCO (5k) and
# Flickr30k (1k) test splits, with the original protocol ("a photo of " before each caption).
# Edit the settings below (and in shell/_eval_common.sh) or override them from the environment:
#   MODEL_WEIGHT=RWKV-CLIP-B32-YFCC15M.pt COCO=/data/coco/coco_test.json COCO_IMAGES=/data/coco \
#       FLICKR=/data/flickr30k/flickr30k_test.json bash shell/test_zero_shot_retrieval.sh [extra retrieval.py flags]
# COCO / FLICKR: the ALBEF/BLIP test JSON (what the original reads) or a Karpathy dataset_*.json
# (or its folder). *_IMAGES: the image root, by default the JSON's folder; an entry
# "val2014/x.jpg" is found at ROOT/val2014/x.jpg or ROOT/x.jpg. See `python retrieval.py --help`.
set -euo pipefail
cd "$(dirname "$0")/.."

batch_size=${BATCH_SIZE:-120}
protocol=${PROTOCOL:-original}
coco=${COCO:-data/eval/coco/coco_test.json}
flickr=${FLICKR:-data/eval/flickr30k/flickr30k_test.json}
source shell/_eval_common.sh  # the shared settings: MODEL_NAME, MODEL_WEIGHT, OUTPUT_DIR, DATA_ROOT, DEVICE, WORKERS

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
