"""Re-read finished shards: index consistency, every record parses, optionally every image decodes."""

from __future__ import annotations

import glob
import re
from pathlib import Path

import numpy as np

from ..recordio import RecordIOError, iter_records, read_index, unpack
from .captions import CONTEXT_LENGTH, VOCAB_SIZE
from .images import sniff

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
    header, payload = unpack(record)
    if header.flag <= 0 or header.flag % CONTEXT_LENGTH:
        return f"label length {header.flag} is not a positive multiple of {CONTEXT_LENGTH}"
    label = np.asarray(header.label)
    if np.any(label < 0) or np.any(label >= VOCAB_SIZE) or np.any(label != np.floor(label)):
        return "label holds values that are not token ids"
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
    result = {"rec": str(rec), "records": 0, "errors": errors, "ids": ids}
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
                ids.append(int(unpack(record)[0].id))
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


def verify(output: str | Path, decode: bool = False, progress: bool = False) -> dict:
    """Check every shard of `output`; `ok` is True when nothing is wrong."""
    shards = find_shards(output)
    if not shards:
        return {"output": str(output), "ok": False, "shards": [], "records": 0,
                "errors": [f"no .rec shards found at {output}"]}
    from tqdm import tqdm

    results = [verify_shard(rec, decode) for rec in tqdm(shards, disable=not progress, unit="shard")]
    all_ids = [i for r in results for i in r.pop("ids")]
    errors = [e for r in results for e in r["errors"]]
    if len(set(all_ids)) != len(all_ids):
        errors.append(f"{len(all_ids) - len(set(all_ids))} duplicate record ids across shards")
    return {
        "output": str(output), "ok": not errors, "shards": results,
        "records": sum(r["records"] for r in results), "errors": errors,
    }
