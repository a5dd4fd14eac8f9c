"""Which `.rec/.idx` shards a loader reads, and where every record of them starts.

A folder means the shards directly in it, by the rule the launcher uses too (src/shard_names.py:
`val*` shards and a `.rec` or `.idx` without its partner are left out, with a warning); a prefix,
a `.rec`/`.idx` path or a glob is taken as named.

Records are numbered shard after shard, each shard by ascending offset; both loader
backends address records by that number (dataloaders/records.py reads one). A record's
bytes run from its offset to the next record's offset in the same shard (or the end of
the file), the same rule DALI's RecordIO reader uses.

Collecting the offsets reads every per-shard index, which takes a while for thousands
of shards; the arrays are cached under a key made of the shards' paths, sizes and
modification times, so a changed or rewritten shard gets a new entry.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from src.errors import UserError
from src.fsutil import atomic_open
from src.recordio import MAGIC_BYTES, RecordIOError, read_index
from src.shard_names import DEFAULT_OUTPUT_NAME, IDX, REC, natural_key, pair, scan_folder

__all__ = [
    "Shard",
    "ShardError",
    "ShardSet",
    "default_cache_dir",
    "find_rec_file",
    "load_shards",
    "resolve_shards",
]

LOG = logging.getLogger(__name__)
_GLOB_CHARS = re.compile(r"[*?\[]")
# Bump when the cached files' layout changes, so old caches are not misread.
_CACHE_VERSION = 2


class ShardError(UserError):
    """The loader's input is missing, empty, unmatched or corrupt (message is one line)."""


@dataclass(frozen=True)
class Shard:
    rec: Path
    idx: Path

    @property
    def name(self) -> str:
        return self.rec.name


def _named(rec: Path, idx: Path) -> Shard:
    """A shard named explicitly: both files must be there."""
    if not idx.is_file():
        raise ShardError(f"{rec}: no index {idx.name} beside it; rebuild it (data2rec.py writes both)")
    return Shard(rec, idx)


def _in_folder(folder: Path) -> list[Shard]:
    scan = scan_folder(folder)
    if not scan.shards:
        why = f" ({scan.left_out[0][0].name}: {scan.left_out[0][1]})" if scan.left_out else ""
        raise ShardError(
            f"{folder}: directory holds no training {REC} files{why}; pass a folder of {REC}/{IDX} shards"
        )
    for path, why in scan.left_out:
        LOG.warning("left out %s: %s", path, why)
    return [Shard(rec, idx) for rec, idx in scan.shards]


def _resolve_one(item: str | os.PathLike[str]) -> list[Shard]:
    text = os.fspath(item)
    path = Path(text).expanduser()
    if path.is_dir():
        return _in_folder(path)
    if _GLOB_CHARS.search(text):
        matches = [Path(p) for p in glob.glob(str(path))]
        # A glob of .rec or .idx files, or of prefixes ("shards/part-*"), names shards by stem.
        recs = sorted({p.with_suffix(REC) for p in matches}, key=natural_key)
        recs = [rec for rec in recs if rec.is_file()]
        if not recs:
            raise ShardError(f"{text}: pattern matches no {REC} files")
        return [_named(*pair(rec)) for rec in recs]
    rec, idx = pair(path)
    if not rec.is_file():
        raise ShardError(
            f"{text}: no such {REC} file ({rec}); pass a prefix, a {REC} file, a folder or a glob"
        )
    return [_named(rec, idx)]


def resolve_shards(data) -> list[Shard]:
    """Shards named by a prefix, a `.rec`/`.idx` path, a folder, a glob, or a list of those."""
    items = [data] if isinstance(data, str | os.PathLike) else list(data)
    if not items:
        raise ShardError("no input given; pass a prefix, a .rec file, a folder or a glob of shards")
    shards: list[Shard] = []
    seen: set[Path] = set()
    for item in items:
        for shard in _resolve_one(item):
            real = shard.rec.resolve()
            if real in seen:
                raise ShardError(f"{shard.rec}: shard given twice; list each shard once")
            seen.add(real)
            shards.append(Shard(real, shard.idx.resolve()))
    return shards


def find_rec_file(data_dir: str | os.PathLike[str] | None, rec_file: str) -> Path:
    """The guide's `--data-dir DIR --rec-file NAME`: NAME under DIR, else NAME from the working folder.

    NAME may be a `.rec` file or a prefix; its `.idx` is looked up beside it later.
    """
    name = Path(rec_file).expanduser()
    tried = [] if name.is_absolute() or data_dir is None else [Path(data_dir).expanduser() / name]
    tried.append(name)
    for path in tried:
        if pair(path)[0].is_file():
            return path
    where = " nor in the working folder ".join(
        str((p.parent if p.is_absolute() else Path.cwd() / p.parent).resolve()) for p in tried
    )
    raise ShardError(
        f"--rec-file {rec_file}: not found in {where}; give the name of a {REC} file in "
        f"--data-dir (data2rec.py writes {DEFAULT_OUTPUT_NAME}{REC} by default) or a path to "
        "one"
    )


def default_cache_dir() -> Path:
    """Where record indexes are cached: $RWKV_CLIP_CACHE, else $XDG_CACHE_HOME or ~/.cache."""
    env = os.environ.get("RWKV_CLIP_CACHE")
    if env:
        return Path(env).expanduser() / "loader"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rwkv-clip" / "loader"


@dataclass
class ShardSet:
    """Shards plus every record's key and offset; record `i` is the i-th in shard order."""

    shards: list[Shard]
    counts: np.ndarray  # records per shard
    keys: np.ndarray  # per record: its key in its shard's own index
    offsets: np.ndarray  # per record: byte offset inside its shard
    sizes: np.ndarray  # per shard: size of the .rec file in bytes

    def __post_init__(self) -> None:
        self.starts = np.concatenate([[0], np.cumsum(self.counts)]).astype(np.int64)

    @property
    def total_records(self) -> int:
        return int(self.counts.sum())

    def shard_of(self, record: int) -> int:
        return int(np.searchsorted(self.starts, record, side="right")) - 1

    def locate(self, record: int) -> tuple[Shard, int, int]:
        """(shard, key, offset) of record number `record`."""
        return self.shards[self.shard_of(record)], int(self.keys[record]), int(self.offsets[record])

    def describe(self, record: int) -> str:
        shard, key, offset = self.locate(record)
        return f"{shard.rec} record key {key} at byte {offset}"

    def span(self, record: int) -> tuple[int, int, int]:
        """(shard number, first byte, end byte) of record `record`: up to the next record or the file's
        end."""
        shard = self.shard_of(record)
        end = int(self.offsets[record + 1]) if record + 1 < self.starts[shard + 1] else int(self.sizes[shard])
        return shard, int(self.offsets[record]), end

    def spans(self, records: np.ndarray) -> np.ndarray:
        """`span` of many records at once: int64 [n, 3] of (shard number, first byte, end byte)."""
        records = np.asarray(records, np.int64)
        shard = np.searchsorted(self.starts, records, side="right") - 1
        following = np.minimum(records + 1, len(self.offsets) - 1)
        last = records + 1 >= self.starts[shard + 1]
        end = np.where(last, self.sizes[shard], self.offsets[following])
        return np.stack([shard, self.offsets[records], end], axis=1).astype(np.int64)

    def without_records(self) -> ShardSet:
        """The shards without the per-record arrays (what reading a known span needs; cheap to pickle)."""
        empty = np.empty(0, np.int64)
        return ShardSet(self.shards, self.counts, empty, empty, self.sizes)


def _cache_key(shards: list[Shard]) -> str:
    parts = []
    for s in shards:
        rs, ist = s.rec.stat(), s.idx.stat()
        parts.append([str(s.rec), rs.st_size, rs.st_mtime_ns, str(s.idx), ist.st_size, ist.st_mtime_ns])
    blob = json.dumps([_CACHE_VERSION, parts]).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def _read_shard_index(shard: Shard) -> tuple[np.ndarray, np.ndarray]:
    size = shard.rec.stat().st_size
    if size == 0:
        raise ShardError(f"{shard.rec}: empty .rec file; reconvert this shard")
    with open(shard.rec, "rb") as f:
        if f.read(4) != MAGIC_BYTES:
            raise ShardError(f"{shard.rec}: not a RecordIO file (no magic at byte 0)")
    try:
        entries = read_index(shard.idx)
    except (RecordIOError, UnicodeDecodeError) as e:
        raise ShardError(f"{shard.idx}: unreadable index: {e}") from None
    if not entries:
        raise ShardError(f"{shard.idx}: index lists no records; reconvert this shard")
    arr = np.asarray(entries, dtype=np.int64)
    keys, offsets = arr[:, 0], arr[:, 1]
    order = np.argsort(offsets, kind="stable")
    keys, offsets = keys[order], offsets[order]
    if offsets[-1] >= size:
        raise ShardError(
            f"{shard.idx}: offset {offsets[-1]} is past the end of {shard.rec.name} "
            f"({size} bytes); the .rec is truncated or the index is stale"
        )
    if np.any(np.diff(offsets) == 0):
        raise ShardError(f"{shard.idx}: two entries share one offset; rebuild the index")
    misaligned = np.flatnonzero(offsets & 3)
    if len(misaligned):
        # Every RecordIO part starts on a 4-byte boundary (docs/formats.md), so this offset is not a record's.
        j = misaligned[0]
        raise ShardError(
            f"{shard.idx}: offset {offsets[j]} (key {keys[j]}) is not the start of a record in "
            f"{shard.rec.name}; the index belongs to another .rec or is damaged: rebuild the shard"
        )
    if len(np.unique(keys)) != len(keys):
        raise ShardError(f"{shard.idx}: duplicate keys; rebuild the index")
    return keys, offsets


def load_shards(data, cache_dir: str | os.PathLike[str] | None = None) -> ShardSet:
    """Resolve `data` and return its shards with every record's key and offset (cached)."""
    shards = resolve_shards(data)
    sizes = np.array([s.rec.stat().st_size for s in shards], dtype=np.int64)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    key = _cache_key(shards)
    arrays = {name: cache / f"{key}.{name}.npy" for name in ("keys", "offsets", "counts")}
    if all(p.is_file() for p in arrays.values()):
        try:
            # Memory-mapped: with 15M records these are 240 MB a rank would otherwise hold.
            loaded = {name: np.load(p, mmap_mode="r") for name, p in arrays.items()}
            if len(loaded["keys"]) == len(loaded["offsets"]) == int(loaded["counts"].sum()):
                return ShardSet(
                    shards, np.asarray(loaded["counts"]), loaded["keys"], loaded["offsets"], sizes
                )
        except (OSError, ValueError):
            pass  # a damaged cache entry is rebuilt below
    per_shard = [_read_shard_index(s) for s in shards]
    counts = np.array([len(k) for k, _ in per_shard], dtype=np.int64)
    keys = np.concatenate([k for k, _ in per_shard])
    offsets = np.concatenate([o for _, o in per_shard])
    try:
        cache.mkdir(parents=True, exist_ok=True)
        # counts goes last: its presence marks a complete cache entry.
        for name, value in (("keys", keys), ("offsets", offsets), ("counts", counts)):
            with atomic_open(arrays[name], "wb") as f:
                np.save(f, value)
    except OSError as e:
        raise ShardError(
            f"{cache}: cannot write the record index cache ({e.strerror}); "
            "set RWKV_CLIP_CACHE to a writable folder"
        ) from None
    return ShardSet(shards, counts, keys, offsets, sizes)
