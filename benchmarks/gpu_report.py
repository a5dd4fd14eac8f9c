"""benchmarks/gpu.py's bookkeeping, which runs anywhere: time budgets, the JSON report written
as results come, guarded sections run in order of value, the tables printed at the end."""

from __future__ import annotations

import contextlib
import json
import os
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
    run stopped at any point leaves every result it had."""

    def __init__(self, path: Path, header: dict[str, Any]):
        self.path = path
        self.data: dict[str, Any] = {**header, "status": "running", "sections": {}}
        self._lock = threading.RLock()
        self.save()

    def section(self, name: str) -> dict[str, Any]:
        return self.data["sections"].setdefault(name, {"status": "running", "cases": []})

    def add_case(self, section: str, case: dict[str, Any]) -> None:
        with self._lock:
            self.section(section)["cases"].append(dict(case))
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


@dataclass(frozen=True)
class Section:
    name: str
    run: Callable[[Results, Budget], None]
    needs_s: float  # the least time worth starting it with (a compile cannot be cut short)
    cap_s: float  # the most it may take, so that later sections keep some time


def run_section(name: str, fn: Callable[[Results, Budget], None], results: Results, budget: Budget) -> str:
    """Run one section; an exception is recorded, never raised. Returns its status."""
    started = budget.clock()
    results.set(name, status="running", budget_s=round(budget.seconds, 1))
    print(f"[{name}] up to {budget.seconds:.0f} s", flush=True)
    try:
        fn(results, budget)
        status = "done"
    except Exception as exc:
        status = "error"
        results.set(name, error=f"{type(exc).__name__}: {first_line(exc)}", traceback=traceback.format_exc())
        print(f"[{name}] failed: {type(exc).__name__}: {first_line(exc)}", flush=True)
    results.set(name, status=status, seconds=round(budget.clock() - started, 1))
    return status


def run_sections(sections: list[Section], results: Results, overall: Budget) -> None:
    """Each section in order while the overall budget lasts: it gets the rest of the budget up to
    its cap; one that would start with less than it needs is recorded as skipped."""
    for section in sections:
        left = overall.left()
        if left < section.needs_s:
            why = f"skipped: {max(left, 0):.0f} s of the time limit left, it needs about {section.needs_s:.0f}"
            results.set(section.name, status="skipped", note=why)
            print(f"[{section.name}] {why}", flush=True)
            continue
        run_section(section.name, section.run, results, Budget(min(left, section.cap_s), clock=overall.clock))


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
    for name, section in results.data["sections"].items():
        head = f"\n== {name}: {section.get('status')} in {section.get('seconds', 0)} s"
        print(head + (f" ({section['error']})" if section.get("error") else ""))
        if section.get("cases"):
            cols = columns.get(name) or sorted({k for case in section["cases"] for k in case})
            print(format_table(section["cases"], cols))
        for key in ("note", "shares"):
            if key in section:
                print(f"{key}: {json.dumps(section[key]) if isinstance(section[key], dict) else section[key]}")


def start_watchdog(results: Results, limit_s: float, columns: dict[str, list[str]]) -> threading.Timer:
    """Past `limit_s`, save what there is, print the tables and end the process (exit 0): a
    kernel that hangs or a compile that overruns must not take the machine's whole lease."""

    def fire() -> None:
        results.data["status"] = f"stopped at the {limit_s:g} s time limit"
        with contextlib.suppress(Exception):
            results.save()
        print(f"\ntime limit of {limit_s:g} s reached; stopping (results so far in {results.path})", flush=True)
        with contextlib.suppress(Exception):
            print_tables(results, columns)
        sys.stdout.flush()
        os._exit(0)

    timer = threading.Timer(limit_s, fire)
    timer.daemon = True
    timer.start()
    return timer
