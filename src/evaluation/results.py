"""What an evaluation leaves behind: plain-text tables, result files, the output folder check."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from src.evaluation.datasets import EvalDataError
from src.fsutil import atomic_write_json


def format_rows(header: Sequence[str], rows: Sequence[Sequence[object]], sep: str = "  ",
                rule: bool = True, right: bool = False) -> str:
    """The one table printer: columns as wide as their widest cell, joined by `sep`, a rule of
    dashes under the header when `rule`, cells right-aligned when `right`; no trailing spaces."""
    lines = [[str(cell) for cell in line] for line in [header, *rows]]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    if rule:
        lines.insert(1, ["-" * w for w in widths])
    pad = str.rjust if right else str.ljust
    return "\n".join(sep.join(pad(cell, w) for cell, w in zip(line, widths)).rstrip() for line in lines)


def format_table(results: Sequence[dict]) -> str:
    """One row per dataset, one column per metric."""
    if not results:
        return ""
    keys: list[str] = []
    for r in results:
        keys += [k for k in r["metrics"] if k not in keys]
    extra = ["chance_top1"] if any("chance_top1" in r for r in results) else []
    rows = []
    for r in results:
        values = [f"{r['metrics'][k]:.2f}" if k in r["metrics"] else "-" for k in keys]
        values += [f"{r['chance_top1']:.2f}" if "chance_top1" in r else "-" for _ in extra]
        rows.append([r["dataset"], *values])
    return format_rows(["dataset", *keys, *extra], rows)


def write_result(result: dict, output_dir: Path | str) -> Path:
    """Write one dataset's result as ``<output_dir>/<task>_<dataset>.json`` (temp file, then rename)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in result["dataset"]).strip("._")
    path = output_dir / f"{result['task']}_{safe or 'dataset'}.json"
    public = {k: v for k, v in result.items() if k not in ("data", "predictions")}
    try:
        return atomic_write_json(path, public)
    except OSError as exc:
        raise EvalDataError(f"cannot write {path} ({exc.strerror or exc}); free space or pass another --output-dir") from None


def check_output_dir(folder: Path | str) -> Path:
    """Create `folder` if needed and prove it writable, before any evaluation runs (results are
    written after each dataset; a folder that refuses them would lose the work)."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise EvalDataError(
            f"--output-dir {folder}: cannot write there ({exc.strerror or exc}); pass a writable folder"
        ) from None
    return folder
