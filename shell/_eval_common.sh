# Shared by the evaluation scripts (sourced, not run): the model settings, the weights check, and
# the paper's dataset table. Each script sets its own batch size and protocol default first.

######################### Model #########################
model_name=${MODEL_NAME:-}  # empty: the config the weights record (or the shipped one they fit); else a name or JSON
model_weight=${MODEL_WEIGHT:-MODEL_WEIGHT_PATH}  # .pt/.safetensors file or hf-hub:ORG/REPO[/FILE]

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

# find_datasets NAME...: fills `datasets` with NAME=PATH for each named dataset whose path is set,
# in the paper's column order: its own variable (CIFAR10=..., IMAGENET=...), else DATA_ROOT when
# the dataset's folder is there. Stops with one line when none is found.
find_datasets() {
    local wanted=" $* " name var folder path
    datasets=()
    while read -r name var folder; do
        [[ "$wanted" == *" $name "* ]] || continue
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
        echo "error: no dataset found; set DATA_ROOT=torchvision/root and/or a dataset's own variable (CIFAR10=..., DTD=...)" >&2
        exit 2
    fi
}
