"""Re-read finished shards: index consistency, every record parses, optionally every image decodes;
each shard against what the run recorded for it (every shard present, sizes and counts equal);
and say so when the conversion itself is not finished (its resume state, its lock)."""

from __future__ import annotations

import glob
import json
from collections import Counter
from pathlib import Path

from src.fsutil import TMP_SUFFIX
from src.lock import describe, held_by, lock_path

from ..caption_record import CONTEXT_LENGTH, InvalidCaptions, unpack_caption_record
from ..recordio import RecordIOError, iter_records, read_index, unpack
from ..shard_names import (
    MACHINE_PLACEHOLDER,
    REC,
    REPORT,
    STATE,
    index_of,
    machine_prefix,
    output_shards,
    run_files,
    run_prefix,
    strip_shard_suffix,
)
from .images import sniff


def find_shards(output: str | Path) -> list[Path]:
    """The `.rec` files of a conversion at `output` (one file, numbered shards, or machine parts)."""
    out = Path(output)
    if out.suffix == REC and out.is_file():
        return [out]
    return output_shards(strip_shard_suffix(out), machines=True)


def _check_record(record: bytes, decode: bool) -> str | None:
    try:
        payload = unpack_caption_record(record).payload  # the loaders' rule for the captions
    except InvalidCaptions as exc:
        return str(exc)
    if sniff(payload) != "JPEG":
        return f"payload is not a JPEG ({len(payload)} bytes, starts {payload[:4]!r})"
    if decode:
        import io

        from PIL import Image

        try:
            with Image.open(io.BytesIO(payload)) as img:
                img.load()
        except Exception as exc:
            return f"image does not decode: {exc}"
    return None


def _index_problems(idx: Path, index: list[tuple[int, int]], records: dict[int, int | None]) -> list[str]:
    """What is wrong with `index` (key, offset) for a .rec whose records start at the offsets of
    `records` (offset -> the record's id, None if unreadable). An .idx is a key -> offset map, as
    MXNet reads it: its lines may come in any order."""
    problems = []
    if len(index) != len(records):
        problems.append(f"{idx}: {len(index)} index entries for the {len(records)} records of the .rec")
    keys = [k for k, _ in index]
    if len(set(keys)) != len(keys):
        problems.append(f"{idx}: {len(keys) - len(set(keys))} duplicate keys")
    stray = [(k, o) for k, o in index if o not in records]
    if stray:
        k, o = stray[0]
        problems.append(
            f"{idx}: {len(stray)} entries point at no record's start (first: key {k} at byte {o})"
        )
    wrong = [(k, o) for k, o in index if o in records and records[o] is not None and records[o] != k]
    if wrong:
        k, o = wrong[0]
        problems.append(
            f"{idx}: {len(wrong)} keys differ from their record's id (first: key {k} at byte {o}, "
            f"where the record's id is {records[o]})"
        )
    return problems


def _listing_problems(rec: Path, listed: dict, records: int, ids: list[int]) -> list[str]:
    """Where the shard differs from what the run recorded for it: a shard cut at a record
    boundary (and its index cut to match) reads as whole otherwise."""
    problems = []
    if records != listed.get("records"):
        problems.append(f"{rec}: {records} records, but the run wrote {listed.get('records')}")
    size = rec.stat().st_size
    if "bytes" in listed and size != listed["bytes"]:
        problems.append(f"{rec}: {size} bytes, but the run wrote {listed['bytes']}")
    if ids and (ids[0], ids[-1]) != (listed.get("first_id", ids[0]), listed.get("last_id", ids[-1])):
        problems.append(
            f"{rec}: record ids {ids[0]}..{ids[-1]}, but the run wrote "
            f"{listed.get('first_id')}..{listed.get('last_id')}"
        )
    return problems


def verify_shard(rec: Path, decode: bool = False, max_errors: int = 20, listed: dict | None = None) -> dict:
    """Check one shard: every record parses, its index maps each record's id to its offset, and,
    given what the run `listed` for it (its report entry), its size, record count and ids match."""
    idx = index_of(rec)
    errors: list[str] = []
    ids: list[int] = []
    captions: Counter = Counter()
    result = {"rec": str(rec), "records": 0, "errors": errors, "ids": ids, "captions": captions}
    try:
        index = read_index(idx)
    except (OSError, RecordIOError) as exc:
        errors.append(f"index {idx}: {exc}")
        return result
    records: dict[int, int | None] = {}
    try:
        for offset, record in iter_records(rec):
            records[offset] = None
            try:
                problem = _check_record(record, decode)
                header = unpack(record)[0]
                ids.append(int(header.id))
                records[offset] = int(header.id)
                captions[header.flag // CONTEXT_LENGTH] += 1
            except RecordIOError as exc:
                problem = str(exc)
            if problem and len(errors) < max_errors:
                errors.append(f"record at byte {offset}: {problem}")
    except (OSError, RecordIOError) as exc:
        errors.append(f"{rec}: {exc}")
    result["records"] = len(records)
    errors.extend(_index_problems(idx, index, records))
    if listed is not None:
        errors.extend(_listing_problems(rec, listed, len(records), ids))
    return result


def listed_shards(output: str | Path) -> tuple[dict[Path, tuple[dict, Path]], list[Path]]:
    """The shards the run at `output` recorded as finished: .rec path -> (its entry, the file that
    lists it), from each part's resume state, or its report where the state is gone; and the
    parts' prefixes that have neither."""
    out = strip_shard_suffix(output)
    listed: dict[Path, tuple[dict, Path]] = {}
    prefixes: dict[Path, list[Path]] = {}
    for suffix in (STATE, REPORT):
        for path in run_files(out, suffix):
            prefixes.setdefault(run_prefix(path, suffix), []).append(path)
    for prefix, sources in sorted(prefixes.items()):
        for source in sources:  # the state first: it is what a resume trusts
            try:
                shards = json.loads(source.read_text(encoding="utf-8"))["shards"]
                entries = {prefix.parent / s["rec"]: (s, source) for s in shards}
            except (OSError, ValueError, KeyError, TypeError):
                continue  # unfinished() reports an unreadable state
            listed.update(entries)
            break
    return listed, sorted(prefixes)


def unfinished(output: str | Path) -> list[str]:
    """What keeps the conversion at `output` from being finished: a run still writing it,
    resume states of runs that stopped part-way, machines of a split that have not run here."""
    out = strip_shard_suffix(output)
    problems: list[str] = []
    states = run_files(out, STATE)
    machines: set[int] = set()
    expected = 1
    for path in states:
        prefix = run_prefix(path, STATE)
        holder = held_by(lock_path(prefix))
        if holder is not None:
            problems.append(f"{prefix} is still being written by {describe(holder)}")
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            fingerprint = state["fingerprint"]
            if prefix != out:  # a machine's part of the split `out`
                expected = max(expected, int(fingerprint["num_machines"]))
                machines.add(int(fingerprint["machine_id"]))
        except (OSError, ValueError, KeyError, TypeError):
            problems.append(f"{path}: unreadable resume state; rerun the conversion command to finish it")
            continue
        mine = [
            i
            for i in range(len(state["counts"]))
            if i % fingerprint["num_machines"] == fingerprint["machine_id"]
        ]
        unread = [fingerprint["units"][int(i)][0] for i in state.get("unreadable", {}) if int(i) in mine]
        if unread:  # a complete run all the same: their rows are in no shard
            problems.append(
                f"{prefix}: {len(unread)} input file(s) could not be read at all and none of their rows "
                f"is converted: {', '.join(unread[:3])}; replace them and rerun with --overwrite"
            )
        if state.get("complete"):
            continue
        slot, _ = state["next"]
        total = sum(state["counts"][i] for i in mine)
        done = (state.get("report") or {}).get("seen", 0)
        left = [fingerprint["units"][i][0] for i in mine[slot:]]
        where = f"; next input: {left[0]}" if left else ""
        temps = sorted(p.name for p in prefix.parent.glob(glob.escape(prefix.name) + "*" + TMP_SUFFIX))
        problems.append(
            f"{prefix}: conversion unfinished: {done} of {total} input rows done in {len(state['shards'])} "
            f"finished shard(s), {len(left)} of {len(mine)} input unit(s) not finished{where}"
            + (f"; unfinished files: {', '.join(temps)}" if temps else "")
            + "; rerun the same data2rec command to finish it"
        )
    missing = sorted(set(range(expected)) - machines) if expected > 1 else []
    if missing:
        parts = ", ".join(machine_prefix(out, m).name for m in missing)
        problems.append(
            f"{out}: split over {expected} machines, but the parts of machine(s) "
            f"{', '.join(map(str, missing))} ({parts}) are not here; copy them here, or verify one part with "
            f"--verify {out}-{MACHINE_PLACEHOLDER}"
        )
    return problems


def verify(output: str | Path, decode: bool = False, progress: bool = False) -> dict:
    """Check every shard of `output` against what the run recorded (its resume state or report:
    every shard there, each of the size, record count and ids written), and that the conversion
    finished; `ok` is True when nothing is wrong. `records_by_caption_count` counts records by
    their number of captions; `notes` says what could not be checked."""
    pending = unfinished(output)
    shards = find_shards(output)
    listed, prefixes = listed_shards(output)
    missing = [
        f"{rec}: listed as finished in {source.name} ({entry.get('records')} records) but missing; "
        "rerun the conversion with --overwrite to write it again"
        for rec, (entry, source) in sorted(listed.items())
        if rec not in shards
    ]
    unlisted = [
        f"{rec}: not a shard of the run at {output} (not listed in its "
        f"{', '.join(sorted({s.name for _, s in listed.values()}))}); move it away"
        for rec in shards
        if listed and rec not in listed
    ]
    notes = (
        []
        if prefixes
        else [
            f"no report or resume state of {output} beside the shards, so a missing "
            "shard cannot be told; each shard is checked on its own"
        ]
    )
    if not shards:
        return {
            "output": str(output),
            "ok": False,
            "shards": [],
            "records": 0,
            "unfinished": pending,
            "records_by_caption_count": {},
            "notes": notes,
            "errors": [*pending, *missing, f"no .rec shards found at {output}"],
        }
    from tqdm import tqdm

    results = [
        verify_shard(rec, decode, listed=listed[rec][0] if rec in listed else None)
        for rec in tqdm(shards, disable=not progress, unit="shard")
    ]
    all_ids = [i for r in results for i in r.pop("ids")]
    by_captions: Counter = sum((r.pop("captions") for r in results), Counter())
    errors = [*pending, *missing, *unlisted, *(e for r in results for e in r["errors"])]
    if len(set(all_ids)) != len(all_ids):
        errors.append(f"{len(all_ids) - len(set(all_ids))} duplicate record ids across shards")
    return {
        "output": str(output),
        "ok": not errors,
        "shards": results,
        "unfinished": pending,
        "records": sum(r["records"] for r in results),
        "errors": errors,
        "notes": notes,
        "records_by_caption_count": {str(k): by_captions[k] for k in sorted(by_captions)},
    }
