"""The small values that flow through a conversion: input units, items, results, skip reasons."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Why an item was skipped. Reports count by these names, so they are part of the output format.
UNREADABLE = "unreadable_file"
NOT_REGULAR = "not_a_regular_file"  # a FIFO, device or socket with an image's or caption's name
FILE_TOO_LARGE = "file_too_large"  # over --max-file-bytes
EMPTY_IMAGE = "empty_image"
NOT_AN_IMAGE = "not_an_image"
TRUNCATED = "truncated_image"
UNDECODABLE = "undecodable_image"
TOO_LARGE = "image_too_large"
MISSING_IMAGE = "missing_image"
MISSING_CAPTION = "missing_caption"
EMPTY_CAPTION = "empty_caption"
UNDECODABLE_CAPTION = "undecodable_caption"  # not UTF-8 text
EMPTY_TOKENS = "caption_tokenizes_to_nothing"
BAD_TOKENS = "bad_tokens"
TOO_MANY_CAPTIONS = "too_many_captions"
UNSAFE_PATH = "unsafe_path"
BROKEN_ROW = "broken_row"
BROKEN_INPUT = "broken_input"
PROCESSING_ERROR = "processing_error"  # an unforeseen exception on one item: counted, not fatal

# A record stores K captions of 77 tokens, K differing between records. Past this many the row
# is almost surely not captions (a wrong column); a loader pads every label of a batch to the
# batch's largest K, so one such row would also cost memory in every batch it lands in.
MAX_CAPTIONS = 32


@dataclass(frozen=True)
class Unit:
    """One independently readable piece of input: a file, or a slice of a folder listing.

    Units are the grain of the multi-machine split and of sample ids: `index` is the
    unit's position in the full (unsplit) input list.
    """

    index: int
    path: str
    start: int = 0  # first item of the slice (folders only)
    stop: int | None = None


@dataclass
class Item:
    """One image-text pair as a source yields it; the worker turns it into a record.

    A source either reads the image bytes (`image`) or leaves the path for the worker
    (`image_path`), so that parallel workers, not the parent, pay for file reads.
    """

    pos: int  # position in the unit, counting every item, good or bad
    ref: str  # human-readable pointer for reports, e.g. "a.parquet:row 17"
    image: bytes | memoryview | None = None  # a view of the parquet column's buffer, from parquet
    # recordio.aligned_magic_offsets(image), where the source found them while the bytes were in
    # its cache (the parquet page reader); None: the writer finds them.
    image_magic: list[int] | None = None
    image_path: str | None = None
    captions: list[str] | None = None
    tokens: np.ndarray | None = None  # float32 [K*77] token ids, already tokenised
    tokens_checked: bool = False  # the tokens passed check_tokens already (worker.check_chunk_tokens)
    error: str | None = None  # the source already knows this item is bad
    detail: str = ""
    row: int = 0  # row in the source file, stored as the record's id2
    extra: dict = field(default_factory=dict)
    sample_id: int = 0  # set by the pipeline: unique over all machines
    slot: int = 0  # set by the pipeline: the unit's place in this machine's unit list


@dataclass
class Result:
    """What a worker returns for one item: what to store, or the reason it was skipped.

    A payload of None with no reason means "the item's own image bytes, unchanged": the
    parent still holds them, so they need not travel back from the worker.
    """

    pos: int
    ref: str
    slot: int = 0
    sample_id: int = 0
    tokens: np.ndarray | None = None  # float32 [K*77]
    payload: bytes | None = None
    captions: int = 0  # K: number of 77-token blocks
    reason: str | None = None
    detail: str = ""
    converted: bool = False  # the image was re-encoded (not passed through)
