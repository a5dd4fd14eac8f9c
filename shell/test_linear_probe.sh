#!/usr/bin/env bash
# Linear probe of an RWKV-CLIP checkpoint on the paper's linear-probe datasets (its third table):
# frozen image features, a logistic-regression classifier per dataset, the paper's table row at
# the end. It probes every dataset whose path is set. Edit the settings below (and in shell/_eval_common.sh) or set them in the
# environment:
#   MODEL_WEIGHT=RWKV-CLIP-B32-YFCC15M.pt DATA_ROOT=/data bash shell/test_linear_probe.sh [extra linear_probe.py flags]
# DATA_ROOT is torchvision's root (the folder holding cifar-10-batches-py/, food-101/, dtd/, ...)
# with each dataset's training split beside its test split; a dataset's own variable (CIFAR10=...,
# DTD=...) overrides it. `python linear_probe.py --list-datasets` shows each dataset's layout.
# Features are cached under $OUTPUT_DIR/eval/features: a second run of the same weights reads them.
set -euo pipefail
cd "$(dirname "$0")/.."

batch_size=${BATCH_SIZE:-256}  # images per forward pass while extracting features
protocol=${PROTOCOL:-paper}    # paper (L-BFGS, CLIP's sweep) or clip_benchmark
source shell/_eval_common.sh  # the shared settings: MODEL_NAME, MODEL_WEIGHT, OUTPUT_DIR, DATA_ROOT, DEVICE, WORKERS

# The paper's linear-probe datasets (its zero-shot ones without ImageNet), as linear_probe.py has them.
probe_names=$("$PYTHON" -c 'from src.evaluation.probe_settings import LINEAR_PROBE_DATASETS as d; print(*d)')
# shellcheck disable=SC2086  # one word per dataset name
find_datasets $probe_names

echo "######################## Linear Probe Start ########################"
echo "datasets: ${datasets[*]}"
"$PYTHON" linear_probe.py \
    "${model_args[@]}" \
    --model-weight "$model_weight" \
    --protocol "$protocol" \
    --batch-size "$batch_size" \
    --workers "$workers" \
    --datasets "${datasets[@]}" \
    --output-dir "$output_dir" \
    --device "$device" \
    "$@"
