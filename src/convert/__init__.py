"""Convert image-text pairs (hub parquet, image folders, manifests, WebDataset tars) to RecordIO shards.

Shape: sources (one class per input kind) -> worker (validate/transform image,
tokenise, pack) -> ShardWriter, spread by the distributor, with a report and resume
state beside the output. `convert()` runs it; `verify()` re-reads finished shards.
"""

from src.lock import OutputLocked

from .images import (
    DEFAULT_MAX_PIXELS,
    DEFAULT_VALIDATE,
    VALIDATE_LEVELS,
    ImageOptions,
    Validate,
    validate_level,
)
from .items import MAX_CAPTIONS
from .pipeline import (
    DEFAULT_MAX_SKIP_FRACTION,
    MAX_ID,
    MAX_WORKERS_PER_CORE,
    ConvertOptions,
    OutputError,
    TooManySkipped,
    check_skips,
    convert,
    is_output_file,
    output_prefix,
    shard_paths,
)
from .processes import Terminated, sigterm_as_interrupt
from .sources import SOURCES, InputError, SourceOptions
from .verify import find_shards, verify

__all__ = [
    "DEFAULT_MAX_SKIP_FRACTION",
    "MAX_CAPTIONS",
    "MAX_ID",
    "MAX_WORKERS_PER_CORE",
    "SOURCES",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_VALIDATE",
    "VALIDATE_LEVELS",
    "Validate",
    "validate_level",
    "ConvertOptions",
    "ImageOptions",
    "InputError",
    "OutputError",
    "OutputLocked",
    "SourceOptions",
    "Terminated",
    "TooManySkipped",
    "check_skips",
    "convert",
    "find_shards",
    "is_output_file",
    "output_prefix",
    "shard_paths",
    "sigterm_as_interrupt",
    "verify",
]
