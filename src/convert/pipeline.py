"""The conversion run: plan units and ids, feed workers, write shards in order, resume, report.

Data flow: source.items -> (workers) validate/transform/tokenise/pack -> ShardWriter,
one process writing in input order. A shard's boundaries depend only on the inputs and
options (every `shard_size` written records), so a resumed run and an uninterrupted
one produce the same files.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from src.caption_record import CONTEXT_LENGTH, caption_record_head
from src.errors import UserError
from src.fsutil import DEFAULT_MAX_FILE_BYTES, TMP_SUFFIX, json_safe, printable, remove_stale_temp_files
from src.lock import OutputLock
from src.shard_names import (
    LOCK,
    PROBE,
    REPORT,
    SHARD_SUFFIXES,
    STATE,
    is_output_name,
    output_prefix,
    output_shards,
    shard_paths,
    side_file,
    temp_path,
)

from .distributor import chunked, ordered_map, prefetch
from .images import VALIDATE_ALIASES, ImageOptions
from .items import MAX_CAPTIONS, Item, Result, Unit
from .report import Report, percent
from .sources import InputError, Source, SourceOptions, make_source
from .sources.base import UnreadableUnit
from .state import load_state, new_state, write_json_atomic, write_report
from .worker import WorkerConfig, check_chunk_tokens
from .writer import ShardWriter, discard_temps

MAX_ID = 2**64 - 1  # record ids are uint64 (docs/formats.md, section 1)
MAX_WORKERS_PER_CORE = 4  # past this, more workers only add memory and start-up time
DEFAULT_MAX_SKIP_FRACTION = 0.05


class OutputError(UserError):
    """The output cannot be written, or holds another run's files."""


class TooManySkipped(UserError):
    """More rows were skipped than --max-skip-fraction allows: a wrong column, a wrong
    format or a broken download must not look like success. Raised after every valid row
    and the report were written; `report` is the final report."""

    exit_code = 4

    def __init__(self, report: dict, limit: float) -> None:
        skipped, seen = report["skipped"], report["seen"]
        super().__init__(
            f"{skipped} of {seen} rows ({percent(skipped, seen)}) skipped, more than "
            f"--max-skip-fraction {limit:g} ({percent(round(limit * 10000), 10000)}) allows"
        )
        self.report = report
        self.limit = limit


class UnreadableInputs(UserError):
    """Input files that could not be read at all, so that how many rows they hold is unknown
    (UnreadableUnit): their rows are lost whatever --max-skip-fraction says. Raised after every
    other row and the report were written; `report` is the final report."""

    exit_code = 4

    def __init__(self, report: dict) -> None:
        failed = report["unreadable_inputs"]
        first = failed[0]
        more = f" and {len(failed) - 1} more (see the report)" if len(failed) > 1 else ""
        super().__init__(
            f"{len(failed)} input file(s) could not be read at all, so none of their rows is converted: "
            f"{first['input']} ({first['detail']}){more}; every other row is written. Replace the file(s) "
            "(download them again) and rerun with --overwrite"
        )
        self.report = report


def check_skips(report: dict, limit: float | None) -> None:
    """Raise UnreadableInputs if an input file could not be read at all, else TooManySkipped if
    `report` skipped more than `limit` (a fraction) of its rows."""
    if report.get("unreadable_inputs"):
        raise UnreadableInputs(report)
    if limit is not None and report["seen"] and report["skipped"] > limit * report["seen"]:
        raise TooManySkipped(report, limit)


@dataclass
class ConvertOptions:
    kind: str = "auto"
    source: SourceOptions = field(default_factory=SourceOptions)
    image: ImageOptions = field(default_factory=ImageOptions)
    shard_size: int = 0  # records per shard; 0: one OUT.rec
    num_machines: int = 1
    machine_id: int = 0
    id_offset: int = 0
    workers: int = 0  # 0: every core
    max_captions: int = MAX_CAPTIONS  # rows with more captions are skipped
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES  # image and caption files larger are skipped; 0: no cap
    max_skip_fraction: float | None = DEFAULT_MAX_SKIP_FRACTION  # None: any share of skips is fine
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


def is_output_file(path: Path, output: str | Path) -> bool:
    """True for a file a run with --output `output` writes (any machine's part): shards,
    their indexes, the report, the resume state, the lock and their temporaries."""
    base = output_prefix(output)
    if not is_output_name(path.name, base):
        return False
    try:
        return path.parent.resolve() == base.parent.resolve()
    except OSError:
        return False


def _fingerprint(source: Source, units: list[Unit], opts: ConvertOptions) -> dict:
    # Through JSON and back, so it compares equal to the copy read from the state file.
    return json.loads(
        json.dumps(
            {
                "kind": source.kind,
                "units": [[u.path, u.start, u.stop, source.signature(u)] for u in units],
                "source": asdict(opts.source),
                "image": asdict(opts.image),
                # No longer an option, kept so that a run begun when it was one still resumes.
                "context_length": CONTEXT_LENGTH,
                "shard_size": opts.shard_size,
                "num_machines": opts.num_machines,
                "machine_id": opts.machine_id,
                "id_offset": opts.id_offset,
                "max_captions": opts.max_captions,
                # Only when changed: a run begun before the cap existed (at its default) still resumes.
                **(
                    {"max_file_bytes": opts.max_file_bytes}
                    if opts.max_file_bytes != DEFAULT_MAX_FILE_BYTES
                    else {}
                ),
            }
        )
    )


def _check_output_names(prefix: Path, sharded: bool) -> None:
    """Refuse an output name that exists as something other than a file (a folder named
    OUT.rec, say) before anything is written: the run would fail half-way, leaving an
    orphan .idx, and no rerun could succeed."""
    names = [side_file(prefix, s) for s in (REPORT, STATE, LOCK, PROBE)]
    if sharded:
        numbered = prefix.parent.glob(glob.escape(prefix.name) + "-*")
        names += [p for p in numbered if is_output_name(p.name, prefix, machines=False)]
    else:
        names += shard_paths(prefix, None)
    names += [temp_path(n) for n in names if not n.name.endswith(TMP_SUFFIX)]
    for path in names:
        if path.exists() and not path.is_file():
            what = "a folder" if path.is_dir() else "not a regular file"
            raise OutputError(
                f"{path} is {what}, but data2rec writes a file of that name; move it away or "
                "choose another --output"
            )


def _check_writable(prefix: Path) -> None:
    try:
        prefix.parent.mkdir(parents=True, exist_ok=True)
        probe = side_file(prefix, PROBE)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise OutputError(f"{prefix.parent}: output folder is not writable ({exc.strerror or exc})") from None


def _remove_outputs(prefix: Path) -> None:
    for path in output_shards(prefix, suffixes=SHARD_SUFFIXES):
        path.unlink()
    side_file(prefix, REPORT).unlink(missing_ok=True)


def remove_output_temps(prefix: Path) -> list[Path]:
    """The temporary files that a killed run's atomic writes of this output's report and state left
    (`.OUT.report.json.PID.tmp`: hidden, named after their dead writer); call under the output's lock."""
    return remove_stale_temp_files(prefix.parent, glob.escape(prefix.name) + ".*")


def _clean_temps(prefix: Path) -> None:
    for tmp in prefix.parent.glob(glob.escape(prefix.name) + "*" + TMP_SUFFIX):
        if is_output_name(tmp.name, prefix, machines=False):
            tmp.unlink(missing_ok=True)


def _progress(total: int, initial: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total,
        initial=initial,
        unit="img",
        smoothing=0.05,
        dynamic_ncols=True,
        disable=not enabled,
        file=sys.stderr,
        desc="data2rec",
    )


def check_options(opts: ConvertOptions) -> None:
    """Refuse option values no run can use, before anything is read or written."""
    cores = available_cores()
    checks = [
        (opts.num_machines >= 1, f"--num-machines {opts.num_machines} must be >= 1"),
        (
            0 <= opts.machine_id < opts.num_machines,
            f"--machine-id {opts.machine_id} must be between 0 and {opts.num_machines - 1}",
        ),
        (opts.shard_size >= 0, f"--shard-size {opts.shard_size} must be >= 0"),
        (
            0 <= opts.id_offset <= MAX_ID,
            f"--id-offset {opts.id_offset} must be between 0 and 2^64-1 = {MAX_ID}",
        ),
        (
            0 <= opts.workers <= MAX_WORKERS_PER_CORE * cores,
            f"--workers {opts.workers} must be between 0 (all cores) and {MAX_WORKERS_PER_CORE * cores} "
            f"({MAX_WORKERS_PER_CORE} per usable core; this machine lets us use {cores})",
        ),
        (opts.max_captions >= 1, f"--max-captions {opts.max_captions} must be >= 1"),
        (opts.max_file_bytes >= 0, f"--max-file-bytes {opts.max_file_bytes} must be >= 0 (0: no limit)"),
        (
            opts.max_skip_fraction is None or 0 <= opts.max_skip_fraction <= 1,
            f"--max-skip-fraction {opts.max_skip_fraction} must be between 0 and 1",
        ),
    ]
    problem = next((msg for ok, msg in checks if not ok), None)
    if problem:
        raise InputError(problem)


def convert(inputs: list[str | Path], output: str | Path, opts: ConvertOptions | None = None) -> dict:
    """Convert `inputs` into RecordIO shards at `output`; returns the final report.

    Raises InputError / OutputError / OutputLocked for problems that stop a run before it
    starts, and TooManySkipped (after writing every valid row and the report) when more
    than `opts.max_skip_fraction` of the rows were skipped. With workers > 1 the caller's
    main module is imported by the worker processes, so scripts must call this under
    `if __name__ == "__main__":`.
    """
    opts = opts or ConvertOptions()
    check_options(opts)
    started = time.monotonic()
    prefix = output_prefix(output, opts.num_machines, opts.machine_id)
    source = make_source(
        [Path(p) for p in inputs], opts.kind, opts.source, exclude=lambda path: is_output_file(path, output)
    )
    units = source.units()
    if not units:
        raise InputError("the inputs hold nothing to convert")
    for note in source.notes:
        print(f"data2rec: note: {printable(note)}", file=sys.stderr)
    _check_output_names(prefix, opts.shard_size > 0)
    _check_writable(prefix)
    with OutputLock(prefix) as lock:
        remove_output_temps(prefix)
        if lock.took_over:
            from src.lock import describe

            print(
                f"data2rec: {lock.path} was left by {describe(lock.took_over)}, which is no longer running; "
                "taking it over",
                file=sys.stderr,
            )
        final = _convert_locked(source, units, prefix, opts, started)
    check_skips(final, opts.max_skip_fraction)
    return final


def _upgraded(fingerprint: dict) -> dict:
    """A state's fingerprint with a level's old name (`quick`) in its current form, so that a run
    begun under the old name resumes."""
    image = fingerprint.get("image")
    level = image.get("validate") if isinstance(image, dict) else None
    if isinstance(level, str) and level in VALIDATE_ALIASES:
        return {**fingerprint, "image": {**image, "validate": VALIDATE_ALIASES[level]}}
    return fingerprint


def _validate_hint(old: dict, new: dict) -> str:
    """The flag to add when the runs differ only in --validate (the default changed from a
    decode to the structure check: a run begun before that needs its level named)."""
    old = _upgraded(old)
    level = old.get("image", {}).get("validate")
    if level != new["image"]["validate"] and {**old, "image": new["image"]} == new:
        return f" (it was started with --validate {level})"
    return ""


@dataclass
class _Plan:
    """Where this run starts: its resume state (loaded, or new) and this machine's share."""

    state: dict
    state_path: Path
    mine: list[Unit]  # this machine's units, in input order
    bases: list[int]  # the first sample id of each unit of the whole input

    def items(self, source: Source) -> Iterator[Item]:
        """This machine's items from where the state says the next shard starts, with their ids."""
        next_slot, next_pos = self.state["next"]
        # Units that cannot be read at all (by index, as text: the state is JSON): counted as none.
        unreadable: dict[str, str] = self.state.setdefault("unreadable", {})
        for slot in range(next_slot, len(self.mine)):
            unit = self.mine[slot]
            if str(unit.index) in unreadable:
                continue
            try:
                for item in source.items(unit, next_pos if slot == next_slot else 0):
                    item.sample_id = self.bases[unit.index] + item.pos
                    item.slot = slot
                    yield item
            except UnreadableUnit as exc:  # counted, then changed: what is left of it is lost
                unreadable[str(unit.index)] = exc.detail

    def rows(self) -> tuple[int, int]:
        """(rows of this machine done before this run, rows of this machine in all)."""
        counts, (next_slot, next_pos) = self.state["counts"], self.state["next"]
        done = sum(counts[u.index] for u in self.mine[:next_slot]) + next_pos
        return done, sum(counts[u.index] for u in self.mine)


def _plan(source: Source, units: list[Unit], prefix: Path, opts: ConvertOptions) -> _Plan:
    """Resume the run at `prefix` when its state matches these inputs and options, else start one
    (refusing to replace another run's shards without --overwrite)."""
    state_path = side_file(prefix, STATE)
    fingerprint = _fingerprint(source, units, opts)
    state = load_state(state_path) if opts.resume and not opts.overwrite else None
    if state is not None and _upgraded(state["fingerprint"]) != fingerprint:
        raise OutputError(
            f"{state_path} belongs to a run with other inputs or options; rerun with the same "
            f"arguments{_validate_hint(state['fingerprint'], fingerprint)} to resume it, or pass --overwrite "
            "to start over"
        )
    if state is None:
        state = _new_run(source, units, prefix, opts, fingerprint)
        write_json_atomic(state_path, state)
    else:
        for shard in state["shards"]:
            if not (prefix.parent / shard["rec"]).is_file() or not (prefix.parent / shard["idx"]).is_file():
                raise OutputError(
                    f"{prefix.parent / shard['rec']} is recorded as finished in {state_path} but is gone; "
                    "pass --overwrite to convert everything again"
                )
    bases = list(itertools.accumulate(state["counts"], initial=opts.id_offset))[:-1]
    mine = [u for u in units if u.index % opts.num_machines == opts.machine_id]
    state["units"] = {"all": len(units), "this_machine": len(mine)}
    return _Plan(state, state_path, mine, bases)


def _new_run(
    source: Source, units: list[Unit], prefix: Path, opts: ConvertOptions, fingerprint: dict
) -> dict:
    """The state of a run that starts from the beginning: every unit counted (the basis of the
    sample ids), and the shards of an earlier run at `prefix` removed (--overwrite)."""
    if output_shards(prefix) and not opts.overwrite:
        raise OutputError(
            f"{output_shards(prefix)[0]} already exists and no matching resume state was found; "
            "pass --overwrite to replace it or choose another --output"
        )
    from tqdm import tqdm

    slow = source.kind in ("manifest", "webdataset")  # counting reads them; parquet has metadata
    counts, unreadable = [], {}
    for u in tqdm(
        units, desc="counting items", unit="file", disable=not (opts.progress and slow), file=sys.stderr
    ):
        try:
            counts.append(source.count(u))
        except UnreadableUnit as exc:  # no rows of it get ids; the run fails at its end, naming it
            counts.append(0)
            unreadable[str(u.index)] = exc.detail
    if counts and opts.id_offset + sum(counts) - 1 > MAX_ID:
        raise InputError(
            f"--id-offset {opts.id_offset} plus the {sum(counts)} input rows passes the largest record id "
            f"2^64-1; use an --id-offset of at most {MAX_ID - sum(counts) + 1}"
        )
    _remove_outputs(prefix)
    state = new_state(fingerprint, counts)
    state["unreadable"] = unreadable
    return state


class _Committer:
    """Makes a full shard durable (fsync), publishes it and records it in the resume state, on a
    thread of its own while the next shard is written; at most one at a time, so the state's
    order holds. An error there is raised on the run's thread by the next `wait()`."""

    def __init__(self, state: dict, state_path: Path) -> None:
        self.state, self.state_path = state, state_path
        self._thread: threading.Thread | None = None
        self._errors: list[BaseException] = []

    def start(self, full: ShardWriter, resume_at: list[int], reported: dict) -> None:
        self.wait()  # the shard before: it had this whole shard's time
        self._thread = threading.Thread(
            target=self._commit, args=(full, resume_at, reported), name="data2rec-commit", daemon=True
        )
        self._thread.start()

    def _commit(self, full: ShardWriter, resume_at: list[int], reported: dict) -> None:
        try:
            try:
                summary = full.commit()
            except BaseException:
                full.abort()
                raise
            self.state["shards"].append(summary)
            self.state["next"], self.state["report"] = resume_at, reported
            write_json_atomic(self.state_path, self.state)
        except BaseException as exc:
            self._errors.append(exc)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._errors:
            raise self._errors.pop()


class _ShardOutput:
    """The shards this run writes, in order: each opened when its first record comes and, once
    full (every `shard_size` records; 0: one shard), handed to the committer."""

    def __init__(self, prefix: Path, shard_size: int, plan: _Plan) -> None:
        self.prefix, self.shard_size = prefix, shard_size
        self.committer = _Committer(plan.state, plan.state_path)
        self.next_shard = len(plan.state["shards"])
        self.writer: ShardWriter | None = None
        self.opening: tuple[Path, Path] | None = None  # a shard whose writer is being made

    def write(self, item: Item, r: Result, report: Report) -> None:
        if self.writer is None:
            self.opening = shard_paths(self.prefix, self.next_shard if self.shard_size else None)
            self.writer = ShardWriter(*self.opening)
            self.next_shard += 1
        head = caption_record_head(r.tokens, r.sample_id, item.row)
        if r.payload is None:  # the item's own image, passed through
            self.writer.write(r.sample_id, head, item.image, item.image_magic)
        else:
            self.writer.write(r.sample_id, head, r.payload)
        if self.shard_size and self.writer.records == self.shard_size:
            self.committer.start(self.writer, [r.slot, r.pos + 1], report.to_dict())
            self.writer = None

    def finish(self) -> None:
        """Commit the last shard, a part-filled one included, on this thread."""
        self.committer.wait()
        if self.writer is not None:
            self.committer.state["shards"].append(self.writer.commit())
            self.writer = None

    def abort(self) -> None:
        """Keep a full shard already written; drop the unfinished one."""
        try:
            self.committer.wait()
        except BaseException:
            pass  # that shard was discarded; the first error is the one to report
        if self.writer is not None:
            self.writer.abort()
        elif self.opening is not None:
            discard_temps(*self.opening)


def _write_shards(source: Source, plan: _Plan, prefix: Path, opts: ConvertOptions, report: Report) -> None:
    """Convert this machine's items from where the plan starts, in input order, into shards."""
    done_before, my_total = plan.rows()
    config = WorkerConfig(opts.image, opts.max_captions, opts.max_file_bytes)
    output = _ShardOutput(prefix, opts.shard_size, plan)
    bar = _progress(my_total, done_before, opts.progress)
    try:
        # The tokens are checked on the reading thread (see check_chunk_tokens).
        chunks = prefetch(map(check_chunk_tokens, chunked(plan.items(source), opts.chunk)))
        for chunk, results in ordered_map(chunks, config, opts.workers or available_cores()):
            for item, r in zip(chunk, results):
                bar.update(1)
                report.add(r)
                if r.reason is None:
                    output.write(item, r, report)
            bar.set_postfix(written=report.written, skipped=report.seen - report.written, refresh=False)
        output.finish()
    except BaseException:
        output.abort()
        raise
    finally:
        bar.close()


def _convert_locked(
    source: Source, units: list[Unit], prefix: Path, opts: ConvertOptions, started: float
) -> dict:
    """The run, once it holds the output's lock: plan it (resume or start), write the shards,
    then mark the state complete and write the report."""
    plan = _plan(source, units, prefix, opts)
    state, report_path = plan.state, side_file(prefix, REPORT)
    if state["complete"]:
        final = _final(state, state["report"], prefix, started, source.notes, units)
        write_report(report_path, final)
        return {**final, "resumed": "already complete"}
    _clean_temps(prefix)
    saved = state["report"]
    report = Report(opts.max_examples) if saved is None else Report.from_dict(saved, opts.max_examples)
    _write_shards(source, plan, prefix, opts, report)
    state["next"] = [len(plan.mine), 0]
    state["report"] = report.to_dict()
    state["complete"] = True
    write_json_atomic(plan.state_path, state)
    final = _final(state, state["report"], prefix, started, source.notes, units)
    write_report(report_path, final)
    return final


def _final(
    state: dict, report: dict, prefix: Path, started: float, notes: list[str], units: list[Unit]
) -> dict:
    """The report as written and returned: json_safe, so that names that are not UTF-8 can be
    written and printed. `unreadable_inputs`: this machine's input files that could not be read."""
    elapsed = time.monotonic() - started
    num_machines, machine_id = state["fingerprint"]["num_machines"], state["fingerprint"]["machine_id"]
    unreadable = [
        {"input": units[int(i)].path, "detail": detail}
        for i, detail in sorted(state.get("unreadable", {}).items(), key=lambda kv: int(kv[0]))
        if int(i) % num_machines == machine_id
    ]
    return json_safe(
        {
            "output": str(prefix),
            "complete": state["complete"],
            "units": state.get("units"),
            **report,
            "unreadable_inputs": unreadable,
            "shards": state["shards"],
            "notes": notes,
            "elapsed_s": round(elapsed, 3),
        }
    )
