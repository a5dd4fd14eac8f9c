#!/usr/bin/env bash
# Download the YFCC15M image-text pairs (Kaichengalex/YFCC15M on the Hugging Face hub):
# about 1,500 parquet shards of ~750 MB, about 1.1 TB in all.
#
#   bash data/download_YFCC15M.sh                                   # everything, into ./YFCC15M
#   bash data/download_YFCC15M.sh --include 'data/train-0000*'      # a 10-shard sample (~7.5 GB)
#   bash data/download_YFCC15M.sh --local-dir /data/YFCC15M -j 8     # elsewhere, 8 shards at once
#
# Any option of data/hfd.sh can be added (they override the defaults below); run it again
# to resume. YFCC15M_DIR sets the default folder.
set -euo pipefail

here=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
for a in "$@"; do
  if [[ $a == -h || $a == --help ]]; then
    sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    echo "Options of data/hfd.sh:"
    exec bash "$here/hfd.sh" --help
  fi
done

echo "YFCC15M: about 1,500 shards x 750 MB = about 1.1 TB for the whole dataset (less with --include)."
echo "The download stops before starting if the target disk lacks the space for the selected files."
exec bash "$here/hfd.sh" Kaichengalex/YFCC15M --dataset --tool aria2c -x 4 -j 5 \
  --local-dir "${YFCC15M_DIR:-YFCC15M}" "$@"
