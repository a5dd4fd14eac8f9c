"""Convert image-text pairs (hub parquet, image folders, manifests, WebDataset tars) to RecordIO shards.

Shape: sources (one class per input kind) -> worker (validate/transform image,
tokenise, pack) -> ShardWriter, spread by the distributor, with a report and resume
state beside the output. `convert()` runs it; `verify()` re-reads finished shards.
"""

from .images import VALIDATE_LEVELS, ImageOptions
from .pipeline import ConvertOptions, OutputError, convert, output_prefix, shard_paths
from .sources import SOURCES, InputError, SourceOptions
from .verify import find_shards, verify

__all__ = [
    "SOURCES",
    "VALIDATE_LEVELS",
    "ConvertOptions",
    "ImageOptions",
    "InputError",
    "OutputError",
    "SourceOptions",
    "convert",
    "find_shards",
    "output_prefix",
    "shard_paths",
    "verify",
]
