"""The conversion run: plan units and ids, feed workers, write shards in order, resume, report.

Data flow: source.items -> (workers) validate/transform/tokenise/pack -> ShardWriter,
one process writing in input order. A shard's boundaries depend only on the inputs and
options (every `shard_size` written records), so a resumed run and an uninterrupted
one produce the same files.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from src.errors import UserError

from .distributor import chunked, ordered_map, prefetch
from .images import ImageOptions
from .items import CAPTION_COUNT, Item, Unit
from .report import Report
from .sources import InputError, Source, SourceOptions, make_source
from .state import load_state, new_state, write_json_atomic
from .worker import WorkerConfig
from .writer import TMP_SUFFIX, ShardWriter, pack_record


class OutputError(UserError):
    """The output cannot be written, or holds another run's files."""


@dataclass
class ConvertOptions:
    kind: str = "auto"
    source: SourceOptions = field(default_factory=SourceOptions)
    image: ImageOptions = field(default_factory=ImageOptions)
    context_length: int = 77
    shard_size: int = 0  # records per shard; 0: one OUT.rec
    num_machines: int = 1
    machine_id: int = 0
    id_offset: int = 0
    workers: int = 0  # 0: every core
    resume: bool = True
    overwrite: bool = False
    chunk: int = 32
    max_examples: int = 20
    progress: bool = True


def available_cores() -> int:
    """Cores this process may run on (a container's CPU set, not the host's core count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def output_prefix(output: str | Path, num_machines: int = 1, machine_id: int = 0) -> Path:
    """The path every output name starts with; machines of a split get distinct prefixes."""
    out = Path(output)
    if out.suffix in (".rec", ".idx"):
        out = out.with_suffix("")
    if num_machines > 1:
        out = out.with_name(f"{out.name}-m{machine_id:03d}")
    return out


def shard_paths(prefix: Path, shard: int | None) -> tuple[Path, Path]:
    stem = prefix.name if shard is None else f"{prefix.name}-{shard:05d}"
    return prefix.with_name(stem + ".rec"), prefix.with_name(stem + ".idx")


def _fingerprint(source: Source, units: list[Unit], opts: ConvertOptions) -> dict:
    # Through JSON and back, so it compares equal to the copy read from the state file.
    return json.loads(json.dumps({
        "kind": source.kind,
        "units": [[u.path, u.start, u.stop, source.signature(u)] for u in units],
        "source": asdict(opts.source),
        "image": asdict(opts.image),
        "context_length": opts.context_length,
        "shard_size": opts.shard_size,
        "num_machines": opts.num_machines,
        "machine_id": opts.machine_id,
        "id_offset": opts.id_offset,
    }))


def _check_writable(prefix: Path) -> None:
    try:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        probe = prefix.with_name(prefix.name + ".probe" + TMP_SUFFIX)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"{prefix.parent}: output folder is not writable ({exc.strerror or exc})") from None


def _existing_outputs(prefix: Path) -> list[Path]:
    name = glob.escape(prefix.name)
    names = [*prefix.parent.glob(name + ".rec"), *prefix.parent.glob(name + "-[0-9]*.rec")]
    return sorted(p for p in names if p.is_file())


def _remove_outputs(prefix: Path) -> None:
    for rec in _existing_outputs(prefix):
        rec.unlink()
        rec.with_suffix(".idx").unlink(missing_ok=True)
    prefix.with_name(prefix.name + ".report.json").unlink(missing_ok=True)


def _clean_temps(prefix: Path) -> None:
    name = glob.escape(prefix.name)
    for pattern in (name + ".*" + TMP_SUFFIX, name + "-[0-9]*" + TMP_SUFFIX):
        for tmp in prefix.parent.glob(pattern):
            tmp.unlink(missing_ok=True)


def _progress(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total, initial=initial, unit="img", smoothing=0.05, dynamic_ncols=True,
        disable=not enabled, file=sys.stderr, desc="data2rec",
    )


def convert(inputs: list[str | Path], output: str | Path, opts: ConvertOptions | None = None) -> dict:
    """Convert `inputs` into RecordIO shards at `output`; returns the final report.

    Raises InputError / OutputError for problems that stop a run before it starts. With
    workers > 1 the caller's main module is imported by the worker processes, so scripts
    must call this under `if __name__ == "__main__":`.
    """
    opts = opts or ConvertOptions()
    if opts.num_machines < 1 or not 0 <= opts.machine_id < opts.num_machines:
        raise InputError(f"--machine-id {opts.machine_id} must be in [0, {opts.num_machines}) ")
    if opts.shard_size < 0:
        raise InputError(f"--shard-size {opts.shard_size} must be >= 0")
    started = time.monotonic()
    source = make_source([Path(p) for p in inputs], opts.kind, opts.source)
    units = source.units()
    if not units:
        raise InputError("the inputs hold nothing to convert")
    prefix = output_prefix(output, opts.num_machines, opts.machine_id)
    _check_writable(prefix)
    state_path = prefix.with_name(prefix.name + ".state.json")
    report_path = prefix.with_name(prefix.name + ".report.json")
    fingerprint = _fingerprint(source, units, opts)

    state = load_state(state_path) if opts.resume and not opts.overwrite else None
    if state is not None and state["fingerprint"] != fingerprint:
        raise OutputError(
            f"{state_path} belongs to a run with other inputs or options; rerun with the same "
            "arguments to resume it, or pass --overwrite to start over"
        )
    if state is None:
        if _existing_outputs(prefix) and not opts.overwrite:
            raise OutputError(
                f"{_existing_outputs(prefix)[0]} already exists and no matching resume state was found; "
                "pass --overwrite to replace it or choose another --output"
            )
        _remove_outputs(prefix)
        from tqdm import tqdm

        slow = source.kind in ("manifest", "webdataset")  # counting reads them; parquet has metadata
        counts = [source.count(u) for u in tqdm(
            units, desc="counting items", unit="file", disable=not (opts.progress and slow), file=sys.stderr)]
        state = new_state(fingerprint, counts)
        write_json_atomic(state_path, state)
    else:
        for shard in state["shards"]:
            if not (prefix.parent / shard["rec"]).is_file() or not (prefix.parent / shard["idx"]).is_file():
                raise OutputError(
                    f"{prefix.parent / shard['rec']} is recorded as finished in {state_path} but is gone; "
                    "pass --overwrite to convert everything again"
                )
        if state["complete"]:
            final = _final(state, state["report"], prefix, started)
            write_json_atomic(report_path, final)
            return {**final, "resumed": "already complete"}
    _clean_temps(prefix)

    counts: list[int] = state["counts"]
    bases, total = [], opts.id_offset
    for n in counts:
        bases.append(total)
        total += n
    mine = [u for u in units if u.index % opts.num_machines == opts.machine_id]
    state["units"] = {"all": len(units), "this_machine": len(mine)}
    report = Report(opts.max_examples) if state["report"] is None else Report.from_dict(state["report"], opts.max_examples)
    next_slot, next_pos = state["next"]

    def items() -> Iterator[Item]:
        for slot in range(next_slot, len(mine)):
            unit = mine[slot]
            for item in source.items(unit, next_pos if slot == next_slot else 0):
                item.sample_id = bases[unit.index] + item.pos
                item.slot = slot
                yield item

    done_before = sum(counts[u.index] for u in mine[:next_slot]) + next_pos
    my_total = sum(counts[u.index] for u in mine)
    config = WorkerConfig(opts.image, opts.context_length)
    workers = opts.workers or available_cores()
    sharded = opts.shard_size > 0
    writer: ShardWriter | None = None
    bar = _progress(my_total, done_before, opts.progress)
    try:
        for chunk, results in ordered_map(prefetch(chunked(items(), opts.chunk)), config, workers):
            for item, r in zip(chunk, results):
                bar.update(1)
                if r.reason is None:
                    k = state["captions_per_record"]
                    if k is None:
                        state["captions_per_record"] = k = r.captions
                    if r.captions != k:
                        r.reason = CAPTION_COUNT
                        r.detail = f"{r.captions} captions, the run's records have {k}"
                report.add(r)
                if r.reason is not None:
                    continue
                if writer is None:
                    writer = ShardWriter(*shard_paths(prefix, len(state["shards"]) if sharded else None))
                payload = r.payload if r.payload is not None else item.image
                writer.write(r.sample_id, pack_record(r.tokens, r.sample_id, item.row, payload))
                if sharded and writer.records == opts.shard_size:
                    state["shards"].append(writer.commit())
                    writer = None
                    state["next"] = [r.slot, r.pos + 1]
                    state["report"] = report.to_dict()
                    write_json_atomic(state_path, state)
            bar.set_postfix(written=report.written, skipped=report.seen - report.written, refresh=False)
        if writer is not None:
            state["shards"].append(writer.commit())
            writer = None
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    finally:
        bar.close()
    state["next"] = [len(mine), 0]
    state["report"] = report.to_dict()
    state["complete"] = True
    write_json_atomic(state_path, state)
    final = _final(state, state["report"], prefix, started)
    write_json_atomic(report_path, final)
    return final


def _final(state: dict, report: dict, prefix: Path, started: float) -> dict:
    elapsed = time.monotonic() - started
    return {
        "output": str(prefix),
        "complete": state["complete"],
        "captions_per_record": state["captions_per_record"],
        "units": state.get("units"),
        **report,
        "shards": state["shards"],
        "elapsed_s": round(elapsed, 3),
    }
