#!/usr/bin/env bash
# Zero-shot classification of an RWKV-CLIP checkpoint on the paper's 11 datasets, with the
# original protocol (the original repo's script name, sic). It evaluates every dataset whose path
# is set, ends with the paper's table row and appends the original's result line to
# $OUTPUT_DIR/eval/zero_shot_imagenet.txt. Edit the settings below (and in shell/_eval_common.sh) or set them in the environment:
#   MODEL_WEIGHT=RWKV-CLIP-B32-YFCC15M.pt DATA_ROOT=/data IMAGENET=/data/imagenet/val.rec \
#       bash shell/test_zero_shot_classificaiton.sh [extra zero_shot.py flags]
# DATA_ROOT is torchvision's root (the folder holding cifar-10-batches-py/, food-101/, dtd/, ...);
# a dataset's own variable (CIFAR10=..., DTD=...) overrides it. `python zero_shot.py --list-datasets`
# shows each dataset's layout.
set -euo pipefail
cd "$(dirname "$0")/.."

batch_size=${BATCH_SIZE:-120}
protocol=${PROTOCOL:-original}  # original (the paper's numbers) or standard
source shell/_eval_common.sh  # the shared settings: MODEL_NAME, MODEL_WEIGHT, OUTPUT_DIR, DATA_ROOT, DEVICE, WORKERS

find_datasets cifar10 cifar100 food101 pets flowers sun397 stanford_car dtd caltech101 aircraft imagenet

echo "######################## Zero-shot Classification Start ########################"
echo "datasets: ${datasets[*]}"
"$PYTHON" zero_shot.py \
    "${model_args[@]}" \
    --model-weight "$model_weight" \
    --protocol "$protocol" \
    --batch-size "$batch_size" \
    --workers "$workers" \
    --datasets "${datasets[@]}" \
    --output-dir "$output_dir" \
    --csv "$output_dir/zero_shot_imagenet.txt" \
    --device "$device" \
    "$@"
