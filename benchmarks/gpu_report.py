"""benchmarks/gpu.py's bookkeeping, which runs anywhere: the sections and their time bounds, a
section run in a child process killed at its bound, the JSON report written as results come,
the tables printed at the end.

A section is one entry (`Section`): its name, its function, the most seconds it may take
(start-up and compiles included) and whether it runs in a child process. A compile cannot be
interrupted inside the process that runs it, so a section that compiles (torch.compile,
Triton's JIT and autotuning) runs in a child process of its own, which is killed when its bound
is up; the report then says so and in which phase it was, and the next section starts on time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from src.fsutil import atomic_write_json


class Budget:
    """Seconds left of a time allowance, by a monotonic clock."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.seconds = seconds
        self.start = clock()

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def allows(self, estimate_s: float) -> bool:
        return self.left() >= estimate_s


class Results:
    """The JSON report, rewritten (to a temporary name, then renamed) after every change, so a
    run stopped at any point leaves every result it had. A child process opens the same file
    (`Results.open`) while its parent waits, and the parent reads it back (`reload`)."""

    def __init__(self, path: Path, header: dict[str, Any] | None = None, data: dict[str, Any] | None = None):
        self.path = path
        self.data: dict[str, Any] = (
            data if data is not None else {**(header or {}), "status": "running", "sections": {}}
        )
        self._lock = threading.RLock()
        if data is None:
            self.save()

    @classmethod
    def open(cls, path: Path) -> Results:
        return cls(path, data=json.loads(path.read_text()))

    def reload(self) -> None:
        with self._lock:
            self.data = json.loads(self.path.read_text())

    def section(self, name: str) -> dict[str, Any]:
        return self.data["sections"].setdefault(name, {"status": "running", "cases": []})

    def add_case(self, section: str, case: dict[str, Any]) -> None:
        with self._lock:
            self.section(section).setdefault("cases", []).append(dict(case))
            self.save()

    def set(self, section: str, **values: Any) -> None:
        with self._lock:
            self.section(section).update(values)
            self.save()

    def finish(self, status: str) -> None:
        with self._lock:
            self.data["status"] = status
            self.save()

    def save(self) -> None:
        with self._lock:
            atomic_write_json(self.path, self.data, default=str)


@dataclass
class Check:
    """What every section is given: the command line, the device, and why fla cannot be
    imported (None: it can). A child process builds its own from the same command line."""

    args: Any  # argparse.Namespace of benchmarks.gpu
    device: Any  # torch.device
    fla_missing: str | None = None

    @property
    def cpu_test(self) -> bool:
        return bool(self.args.cpu_test)


SectionRun = Callable[[Check, Results, Budget], None]


@dataclass(frozen=True)
class Section:
    name: str
    run: SectionRun
    bound_s: float  # the most it may take, start-up and compiles included
    child: bool = True  # in a child process killed at the bound; False: in the check's process
    unavailable: Callable[[Check], str | None] | None = None  # why it cannot run here (then skipped)
    what: str = ""  # one line for the bounds table


# A section given less than this (a shortened --time-limit) is skipped, not started.
MIN_START_S = 5.0


def run_section(name: str, fn: SectionRun, check: Check, results: Results, budget: Budget) -> str:
    """Run one section in this process; an exception is recorded, never raised. Returns its status."""
    started = budget.clock()
    print(f"[{name}] up to {budget.seconds:.0f} s", flush=True)
    try:
        fn(check, results, budget)
        status = "done"
    except Exception as exc:
        status = "error"
        results.set(name, error=f"{type(exc).__name__}: {first_line(exc)}", traceback=traceback.format_exc())
        print(f"[{name}] failed: {type(exc).__name__}: {first_line(exc)}", flush=True)
    results.set(name, status=status, seconds=round(budget.clock() - started, 1))
    return status


class Children:
    """The child process running now, for the watchdog to end with its own."""

    current: subprocess.Popen | None = None

    @classmethod
    def kill(cls) -> None:
        proc = cls.current
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # its compile workers too
            proc.wait()


def run_child(name: str, command: list[str], bound_s: float, results: Results) -> str:
    """Run `command` (the check, told to run section `name` alone into the same report) and wait
    at most `bound_s`; past it the child and everything it started are killed. Returns the status."""
    started = time.monotonic()
    print(f"[{name}] child process, up to {bound_s:.0f} s", flush=True)
    # Its own process group: a kill reaches the compile workers it starts.
    proc = subprocess.Popen(command, start_new_session=True)
    Children.current = proc
    try:
        code = proc.wait(timeout=bound_s)
        killed = False
    except subprocess.TimeoutExpired:
        Children.kill()
        code, killed = proc.returncode, True
    except BaseException:  # Ctrl-C: the child's own session does not get it, so it would run on
        Children.kill()
        raise
    finally:
        Children.current = None
    seconds = round(time.monotonic() - started, 1)
    results.reload()  # what the child wrote
    record = results.section(name)
    if killed:
        phase = record.get("phase")
        status = "killed"
        note = f"killed at its bound of {bound_s:.0f} s" + (f", during: {phase}" if phase else "")
        results.set(name, note=note)
        print(f"[{name}] {note}", flush=True)
    elif code != 0 and record.get("status") in (None, "running", "pending"):
        status = "error"
        results.set(name, error=f"the child process ended with exit code {code}")
    else:
        status = record.get("status", "done")
    results.set(name, status=status, seconds=seconds)
    return status


def run_sections(
    sections: list[Section],
    check: Check,
    results: Results,
    overall: Budget,
    child_command: Callable[[Section, float], list[str]] | None,
) -> None:
    """Each section in order, each with its bound (or what is left of the overall budget, if
    less); one that cannot run here, or would start with less than MIN_START_S, is skipped
    with its reason. `child_command(section, bound)`: the command that runs a section alone in a
    child process; None runs every section in this process (a child runs its one section so)."""
    for section in sections:
        why = section.unavailable(check) if section.unavailable else None
        left = overall.left()
        if why is None and left < MIN_START_S:
            why = f"{max(left, 0):.0f} s of the time limit left"
        if why:
            results.set(section.name, status="skipped", note=why)
            print(f"[{section.name}] skipped: {why}", flush=True)
            continue
        bound = min(section.bound_s, left)
        results.set(section.name, status="running", bound_s=round(bound, 1))
        if check.fla_missing:
            results.set(section.name, fla=f"missing: {check.fla_missing}")
        if section.child and child_command is not None:
            run_child(section.name, child_command(section, bound), bound, results)
        else:
            run_section(section.name, section.run, check, results, Budget(bound, clock=overall.clock))


def bounds_table(sections: list[Section], startup_s: float) -> str:
    """The sections in the order they run with their bounds, and the most the whole run takes."""
    rows = [
        {
            "section": s.name,
            "bound_s": s.bound_s,
            "where": "child process" if s.child else "in process",
            "what": s.what,
        }
        for s in sections
    ]
    total = startup_s + sum(s.bound_s for s in sections)
    return (
        format_table(rows, ["section", "bound_s", "where", "what"])
        + f"\nat most {total:.0f} s in all ({startup_s:.0f} s start-up + the bounds)"
    )


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:300]


def format_table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain text table of `columns` (missing cells blank; floats to 4 significant digits)."""

    def cell(v: Any) -> str:
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    table = [columns] + [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def print_tables(results: Results, columns: dict[str, list[str]]) -> None:
    """Every section's table, then one line per section: its status, bound and time."""
    sections = results.data["sections"]
    for name, section in sections.items():
        head = f"\n== {name}: {section.get('status')} in {section.get('seconds', 0)} s"
        print(head + (f" ({section['error']})" if section.get("error") else ""))
        if section.get("cases"):
            cols = columns.get(name) or sorted({k for case in section["cases"] for k in case})
            print(format_table(section["cases"], cols))
        for table, rows in section.get("tables", {}).items():
            print(f"-- {table}")
            print(format_table(rows, columns.get(table) or sorted({k for row in rows for k in row})))
        for key in ("note", "shares", "fla"):
            if key in section:
                print(
                    f"{key}: {json.dumps(section[key]) if isinstance(section[key], dict) else section[key]}"
                )
    summary = [
        {
            "section": name,
            "status": s.get("status"),
            "bound_s": s.get("bound_s"),
            "seconds": s.get("seconds"),
            "note": "; ".join(
                filter(
                    None,
                    [
                        s.get("error"),
                        s.get("note") if s.get("status") in ("skipped", "killed") else None,
                        f"fla {s['fla']}" if s.get("fla") else None,
                    ],
                )
            ),
        }
        for name, s in sections.items()
    ]
    print("\n== summary")
    print(format_table(summary, ["section", "status", "bound_s", "seconds", "note"]))


def start_watchdog(results: Results, limit_s: float, columns: dict[str, list[str]]) -> threading.Timer:
    """Past `limit_s`, end the running child, save what there is, print the tables and end the
    process (exit 0): a section run in this process that hangs must not take the machine's lease."""

    def fire() -> None:
        with contextlib.suppress(Exception):
            Children.kill()
            results.reload()
        results.data["status"] = f"stopped at the {limit_s:g} s time limit"
        with contextlib.suppress(Exception):
            results.save()
        print(
            f"\ntime limit of {limit_s:g} s reached; stopping (results so far in {results.path})", flush=True
        )
        with contextlib.suppress(Exception):
            print_tables(results, columns)
        sys.stdout.flush()
        os._exit(0)

    timer = threading.Timer(limit_s, fire)
    timer.daemon = True
    timer.start()
    return timer
