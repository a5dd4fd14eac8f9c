#!/usr/bin/env bash
# Zero-shot classification of an RWKV-CLIP checkpoint on the paper's 11 datasets, with the
# original protocol (the original repo's script name, sic). It evaluates every dataset whose path
# is set, ends with the paper's table row and appends the original's result line to
# $OUTPUT_DIR/eval/zero_shot_imagenet.txt. Edit the settings below or set them in the environment:
#   MODEL_WEIGHT=RWKV-CLIP-B32-YFCC15M.pt DATA_ROOT=/data IMAGENET=/data/imagenet/val.rec \
#       bash shell/test_zero_shot_classificaiton.sh [extra zero_shot.py flags]
# DATA_ROOT is torchvision's root (the folder holding cifar-10-batches-py/, food-101/, dtd/, ...);
# a dataset's own variable (CIFAR10=..., DTD=...) overrides it. `python zero_shot.py --list-datasets`
# shows each dataset's layout.
set -euo pipefail
cd "$(dirname "$0")/.."

######################### Model #########################
model_name=${MODEL_NAME:-}  # empty: the config the weights record (or the shipped one they fit); else a name or JSON
model_weight=${MODEL_WEIGHT:-MODEL_WEIGHT_PATH}  # .pt/.safetensors file or hf-hub:ORG/REPO[/FILE]
batch_size=${BATCH_SIZE:-120}
protocol=${PROTOCOL:-original}                   # original (the paper's numbers) or standard

######################### Eval Settings #########################
output_dir=${OUTPUT_DIR:-OUTPUT_PATH}/eval
data_root=${DATA_ROOT:-}
device=${DEVICE:-auto}
workers=${WORKERS:-8}
PYTHON=${PYTHON:-.venv/bin/python}

model_args=()
[ -n "$model_name" ] && model_args=(--model-name "$model_name")

# A local file must exist; hf-hub:ORG/REPO[/FILE] is fetched (and checked) by the Python loader.
if [[ "$model_weight" != hf-hub:* && ! -f "$model_weight" ]]; then
    echo "error: weights '$model_weight' not found; set MODEL_WEIGHT to a .pt or .safetensors file or hf-hub:ORG/REPO[/FILE]" >&2
    exit 2
fi

# The paper's column order. Each entry: NAME VARIABLE FOLDER-UNDER-DATA_ROOT.
datasets=()
while read -r name var folder; do
    path=${!var:-}
    if [ -z "$path" ] && [ -n "$data_root" ] && [ -e "$data_root/$folder" ]; then
        path=$data_root
    fi
    [ -n "$path" ] && datasets+=("$name=$path")
done <<'TABLE'
cifar10 CIFAR10 cifar-10-batches-py
cifar100 CIFAR100 cifar-100-python
food101 FOOD101 food-101
pets PETS oxford-iiit-pet
flowers FLOWERS flowers-102
sun397 SUN397 SUN397
stanford_car STANFORD_CAR stanford_cars
dtd DTD dtd
caltech101 CALTECH101 caltech101
aircraft AIRCRAFT fgvc-aircraft-2013b
imagenet IMAGENET val.rec
TABLE

if [ ${#datasets[@]} -eq 0 ]; then
    echo "error: no dataset found; set DATA_ROOT=torchvision/root and/or CIFAR10=..., IMAGENET=..." >&2
    exit 2
fi

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
