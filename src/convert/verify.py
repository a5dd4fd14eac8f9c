"""Re-read finished shards: index consistency, every record parses, optionally every image decodes;
and say so when the conversion itself is not finished (its resume state, its lock)."""

from __future__ import annotations

import glob
import json
import re
from collections import Counter
from pathlib import Path

from ..caption_record import CONTEXT_LENGTH, InvalidCaptions, unpack_caption_record
from ..recordio import RecordIOError, iter_records, read_index, unpack
from .images import sniff
from .lock import describe, held_by, lock_path

_SHARD = re.compile(r"-(m\d{3}-)?\d{5}\.rec$|-m\d{3}\.rec$")


def find_shards(output: str | Path) -> list[Path]:
    """The `.rec` files of a conversion at `output` (one file, numbered shards, or machine parts)."""
    out = Path(output)
    if out.suffix == ".rec" and out.is_file():
        return [out]
    if out.suffix in (".rec", ".idx"):
        out = out.with_suffix("")
    name = glob.escape(out.name)
    found = [p for p in out.parent.glob(name + ".rec")]
    found += [p for p in out.parent.glob(name + "-*.rec") if _SHARD.match(p.name[len(out.name):])]
    return sorted(set(found))


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


def verify_shard(rec: Path, decode: bool = False, max_errors: int = 20) -> dict:
    idx = rec.with_suffix(".idx")
    errors: list[str] = []
    ids: list[int] = []
    captions: Counter = Counter()
    result = {"rec": str(rec), "records": 0, "errors": errors, "ids": ids, "captions": captions}
    try:
        index = read_index(idx)
    except (OSError, RecordIOError) as exc:
        errors.append(f"index {idx}: {exc}")
        return result
    try:
        offsets = []
        for offset, record in iter_records(rec):
            offsets.append(offset)
            try:
                problem = _check_record(record, decode)
                header = unpack(record)[0]
                ids.append(int(header.id))
                captions[header.flag // CONTEXT_LENGTH] += 1
            except RecordIOError as exc:
                problem = str(exc)
            if problem and len(errors) < max_errors:
                errors.append(f"record at byte {offset}: {problem}")
    except (OSError, RecordIOError) as exc:
        errors.append(f"{rec}: {exc}")
    result["records"] = len(offsets)
    if [o for _, o in index] != offsets:
        errors.append(f"{idx}: {len(index)} index entries do not match the {len(offsets)} records' offsets")
    if [k for k, _ in index] != ids[: len(index)]:
        errors.append(f"{idx}: keys differ from the record ids")
    return result


def _state_files(output: Path) -> list[Path]:
    name = glob.escape(output.name)
    found = [*output.parent.glob(name + ".state.json"), *output.parent.glob(name + "-m[0-9][0-9][0-9].state.json")]
    return sorted(p for p in found if p.is_file())


def unfinished(output: str | Path) -> list[str]:
    """What keeps the conversion at `output` from being finished: a run still writing it,
    resume states of runs that stopped part-way, machines of a split that have not run here."""
    out = Path(output)
    if out.suffix in (".rec", ".idx"):
        out = out.with_suffix("")
    problems: list[str] = []
    states = _state_files(out)
    machines: set[int] = set()
    expected = 1
    for path in states:
        prefix = path.with_name(path.name[: -len(".state.json")])
        holder = held_by(lock_path(prefix))
        if holder is not None:
            problems.append(f"{prefix} is still being written by {describe(holder)}")
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            fingerprint = state["fingerprint"]
            if path.name != out.name + ".state.json":  # a machine's part of the split `out`
                expected = max(expected, int(fingerprint["num_machines"]))
                machines.add(int(fingerprint["machine_id"]))
        except (OSError, ValueError, KeyError, TypeError):
            problems.append(f"{path}: unreadable resume state; rerun the conversion command to finish it")
            continue
        if state.get("complete"):
            continue
        mine = [i for i in range(len(state["counts"])) if i % fingerprint["num_machines"] == fingerprint["machine_id"]]
        slot, _ = state["next"]
        total = sum(state["counts"][i] for i in mine)
        done = (state.get("report") or {}).get("seen", 0)
        left = [fingerprint["units"][i][0] for i in mine[slot:]]
        where = f"; next input: {left[0]}" if left else ""
        temps = sorted(p.name for p in prefix.parent.glob(glob.escape(prefix.name) + "*.tmp"))
        problems.append(
            f"{prefix}: conversion unfinished: {done} of {total} input rows done in {len(state['shards'])} "
            f"finished shard(s), {len(left)} of {len(mine)} input unit(s) not finished{where}"
            + (f"; unfinished files: {', '.join(temps)}" if temps else "")
            + "; rerun the same data2rec command to finish it"
        )
    missing = sorted(set(range(expected)) - machines) if expected > 1 else []
    if missing:
        parts = ", ".join(f"{out.name}-m{m:03d}" for m in missing)
        problems.append(
            f"{out}: split over {expected} machines, but the parts of machine(s) {', '.join(map(str, missing))} "
            f"({parts}) are not here; copy them here, or verify one part with --verify {out}-mIII"
        )
    return problems


def verify(output: str | Path, decode: bool = False, progress: bool = False) -> dict:
    """Check every shard of `output`, and that the conversion finished; `ok` is True when
    nothing is wrong. `records_by_caption_count` counts records by their number of captions."""
    pending = unfinished(output)
    shards = find_shards(output)
    if not shards:
        return {"output": str(output), "ok": False, "shards": [], "records": 0, "unfinished": pending,
                "records_by_caption_count": {}, "errors": [*pending, f"no .rec shards found at {output}"]}
    from tqdm import tqdm

    results = [verify_shard(rec, decode) for rec in tqdm(shards, disable=not progress, unit="shard")]
    all_ids = [i for r in results for i in r.pop("ids")]
    by_captions: Counter = sum((r.pop("captions") for r in results), Counter())
    errors = [*pending, *(e for r in results for e in r["errors"])]
    if len(set(all_ids)) != len(all_ids):
        errors.append(f"{len(all_ids) - len(set(all_ids))} duplicate record ids across shards")
    return {
        "output": str(output), "ok": not errors, "shards": results, "unfinished": pending,
        "records": sum(r["records"] for r in results), "errors": errors,
        "records_by_caption_count": {str(k): by_captions[k] for k in sorted(by_captions)},
    }
