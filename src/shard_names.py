"""Every file name of a shard and of a conversion's output, in one place (docs/formats.md).

- A shard is a pair side by side: `NAME.rec` (the records) and `NAME.idx` (its index).
- A conversion at OUT writes `OUT.rec/.idx`, or numbered shards `OUT-NNNNN.rec/.idx` (--shard-size);
  machine III of a split writes under the prefix `OUT-mIII` (`OUT-mIII.rec`, `OUT-mIII-NNNNN.rec`).
- Beside them, the side files: `OUT.report.json`, `OUT.state.json` (the resume state), `OUT.lock`
  (while a run writes), and for --from-hub `OUT.onepass.json` and the work folder `.OUT.onepass/`.
  Every shard file is written as NAME + `.tmp` first and renamed when complete.
- A folder of shards (the launcher's DATA_ROOT, train.py --train-data, dali.py --data): every `.rec`
  directly in it that has its `.idx`. Left out, and said why: shards named `val*` (evaluation
  shards; name one explicitly to train on it), a `.rec` without its `.idx` or an `.idx` without its
  `.rec` (a copy cut short), and hidden files. `scan_folder` is that rule, for both.

Standard library only (and the temporary-name suffix of src/fsutil.py), so every floor can ask.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from src.fsutil import TMP_SUFFIX

REC = ".rec"
IDX = ".idx"
SHARD_SUFFIXES = (REC, IDX)
REPORT = ".report.json"
STATE = ".state.json"
LOCK = ".lock"
PROBE = ".probe" + TMP_SUFFIX  # the write test a conversion makes before it starts
ONEPASS_STATE = ".onepass.json"
_ONEPASS_WORK = ".onepass"

# The guide's `python data2rec.py`: the dataset folder the download makes, and the output name in
# it that the launcher's DATA_ROOT and dali.py --data-dir YFCC15M --rec-file datarec.rec read.
DEFAULT_DATASET = Path("YFCC15M")
DEFAULT_OUTPUT_NAME = "datarec"
SHARD_PLACEHOLDER = "NNNNN"  # how help and messages write a shard's number
MACHINE_PLACEHOLDER = "mIII"  # and a machine's

_NUMBER = r"-\d{5}"
_MACHINE = r"-m\d{3}"


# --- a conversion's outputs -------------------------------------------------------------------


def strip_shard_suffix(path: str | os.PathLike[str]) -> Path:
    """`path` without a `.rec` or `.idx` ending: the prefix a shard's two files share."""
    path = Path(path)
    return path.with_suffix("") if path.suffix in SHARD_SUFFIXES else path


def output_prefix(output: str | os.PathLike[str], num_machines: int = 1, machine_id: int = 0) -> Path:
    """The path every output name starts with; machines of a split get distinct prefixes (`-mIII`)."""
    out = strip_shard_suffix(output)
    return machine_prefix(out, machine_id) if num_machines > 1 else out


def machine_prefix(prefix: Path, machine_id: int) -> Path:
    """The prefix machine `machine_id` of a split of the run at `prefix` writes under."""
    return prefix.with_name(f"{prefix.name}-m{machine_id:03d}")


def side_file(prefix: Path, suffix: str) -> Path:
    """A side file of the run at `prefix`: `side_file(prefix, REPORT)` is OUT.report.json."""
    return prefix.with_name(prefix.name + suffix)


def onepass_work(prefix: Path) -> Path:
    """The hidden folder beside the output where --from-hub downloads and converts: `.OUT.onepass/`."""
    return prefix.with_name(f".{prefix.name}{_ONEPASS_WORK}")


def shard_paths(prefix: Path, shard: int | None) -> tuple[Path, Path]:
    """The `.rec` and `.idx` of shard number `shard` at `prefix` (None: the one unnumbered shard)."""
    stem = prefix.name if shard is None else f"{prefix.name}-{shard:05d}"
    return prefix.with_name(stem + REC), prefix.with_name(stem + IDX)


def shard_names_text(prefix: Path, sharded: bool = True) -> str:
    """How a message shows the shards a run at `prefix` writes: `OUT-NNNNN.rec/.idx` or `OUT.rec/.idx`."""
    return f"{prefix}-{SHARD_PLACEHOLDER}{REC}/{IDX}" if sharded else f"{prefix}{REC}/{IDX}"


def temp_path(path: Path) -> Path:
    """The name a shard file is written under until it is complete."""
    return path.with_name(path.name + TMP_SUFFIX)


def _output_rest(machines: bool) -> str:
    machine = f"(?:{_MACHINE})?" if machines else ""
    side = "|".join(re.escape(s) for s in (REPORT, STATE, LOCK))
    shard = "|".join(re.escape(s[1:]) for s in SHARD_SUFFIXES)
    return (
        rf"{machine}(?:{_NUMBER})?\.(?:{shard})(?:{re.escape(TMP_SUFFIX)})?"
        rf"|{machine}(?:{side}|{re.escape(PROBE)})"
    )


def is_output_name(name: str, prefix: Path, machines: bool = True) -> bool:
    """True for a file name a run at `prefix` writes: its shards, their indexes, the side files and
    their temporaries; with `machines`, also those of every machine of a split of `prefix`."""
    rest = name[len(prefix.name) :]
    return name.startswith(prefix.name) and re.fullmatch(_output_rest(machines), rest) is not None


def _files_named(prefix: Path, rest: str) -> list[Path]:
    """The files beside `prefix` named `prefix.name` followed by what the regex `rest` matches."""
    pattern = re.compile(rest)
    found = (
        p
        for p in prefix.parent.glob(glob.escape(prefix.name) + "*")
        if pattern.fullmatch(p.name[len(prefix.name) :])
    )
    return sorted(p for p in found if p.is_file())


def _shard_rest(machines: bool, numbered_only: bool, suffixes: tuple[str, ...]) -> str:
    ends = "|".join(re.escape(s) for s in suffixes)
    number = _NUMBER if numbered_only else f"(?:{_NUMBER})?"
    if machines:  # OUT-mIII.rec, OUT-mIII-NNNNN.rec
        return rf"(?:{_MACHINE})?{number}(?:{ends})"
    return rf"{number}(?:{ends})"


def output_shards(
    prefix: Path, *, machines: bool = False, numbered_only: bool = False, suffixes: tuple[str, ...] = (REC,)
) -> list[Path]:
    """The finished shard files of the run at `prefix` that exist: `OUT.rec` and `OUT-NNNNN.rec`
    (`numbered_only`: the latter alone); with `machines`, those of every machine of a split too;
    `suffixes` picks `.rec` and/or `.idx` files."""
    return _files_named(prefix, _shard_rest(machines, numbered_only, suffixes))


def run_files(prefix: Path, suffix: str) -> list[Path]:
    """The side files named `suffix` of the run at `prefix` and of each machine of a split of it."""
    return _files_named(prefix, rf"(?:{_MACHINE})?{re.escape(suffix)}")


def run_prefix(side: Path, suffix: str) -> Path:
    """The prefix of the run whose side file named `suffix` is `side`."""
    return side.with_name(side.name[: -len(suffix)])


# --- shards given to a reader -------------------------------------------------------------------


def pair(item: str | os.PathLike[str]) -> tuple[Path, Path]:
    """The `.rec` and `.idx` that a `.rec` path, an `.idx` path or a prefix names (neither need exist)."""
    text = os.fspath(item)
    path = Path(text)
    if path.suffix in SHARD_SUFFIXES:
        return path.with_suffix(REC), path.with_suffix(IDX)
    return Path(text + REC), Path(text + IDX)


def index_of(rec: Path) -> Path:
    return rec.with_suffix(IDX)


def is_evaluation_shard(path: Path) -> bool:
    """Named like an evaluation shard (`val.rec`, `val_256.rec`, ...), as im2rec names them."""
    return path.name.lower().startswith("val")


@dataclass
class FolderShards:
    """What `scan_folder` found: the training shards, and what it left out with the reason."""

    shards: list[tuple[Path, Path]] = field(default_factory=list)  # (.rec, .idx), in natural order
    left_out: list[tuple[Path, str]] = field(default_factory=list)  # (path, why)


def natural_key(path: Path) -> list:
    """shard-2 before shard-10, as a person numbering shards expects."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(path))]


def scan_folder(folder: Path) -> FolderShards:
    """The training shards directly in `folder` (no deeper), by the rule in the module docstring."""
    files = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")]
    recs = {p.with_suffix(""): p for p in files if p.suffix == REC}
    idxs = {p.with_suffix(""): p for p in files if p.suffix == IDX}
    scan = FolderShards()
    for stem in sorted(recs.keys() | idxs.keys(), key=natural_key):
        rec, idx = recs.get(stem), idxs.get(stem)
        if rec is None:
            why = f"no {stem.name}{REC} beside it (a copy cut short); remove it or restore its {REC}"
            scan.left_out.append((idx, why))
        elif is_evaluation_shard(rec):
            why = "named like an evaluation shard (val*); name it explicitly to train on it"
            scan.left_out.append((rec, why))
        elif idx is None:
            why = f"no {stem.name}{IDX} beside it (an unfinished or partial copy); rebuild it with data2rec"
            scan.left_out.append((rec, why))
        else:
            scan.shards.append((rec, idx))
    return scan
