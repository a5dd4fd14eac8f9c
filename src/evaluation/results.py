"""What an evaluation leaves behind: plain-text tables, result files, the output folder check."""

from __future__ import annotations

import csv
import io
import tempfile
from collections.abc import Sequence
from pathlib import Path

from src.evaluation.datasets import EvalDataError
from src.fsutil import atomic_write_json, atomic_write_text


def format_rows(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    sep: str = "  ",
    rule: bool = True,
    right: bool = False,
) -> str:
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
        values = [f"{r['metrics'][k]:.2f}" if r["metrics"].get(k) is not None else "-" for k in keys]
        values += [f"{r['chance_top1']:.2f}" if "chance_top1" in r else "-" for _ in extra]
        rows.append([r["dataset"], *values])
    return format_rows(["dataset", *keys, *extra], rows)


# What evaluate_classification returns for the files beside the JSON, not for the JSON itself.
_NOT_IN_JSON = ("data", "predictions", "top_k", "confusion_matrix")


def _path(result: dict, output_dir: Path, suffix: str) -> Path:
    """<output_dir>/<task>_<dataset><suffix>, the dataset's name made safe for a file name."""
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in result["dataset"]).strip("._")
    return output_dir / f"{result['task']}_{safe or 'dataset'}{suffix}"


def _write(path: Path, text: str) -> Path:
    try:
        return atomic_write_text(path, text)
    except OSError as exc:
        raise EvalDataError(
            f"cannot write {path} ({exc.strerror or exc}); free space or pass another --output-dir"
        ) from None


def write_result(result: dict, output_dir: Path | str) -> Path:
    """Write one dataset's result as ``<output_dir>/<task>_<dataset>.json`` (temp file, then rename)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = _path(result, output_dir, ".json")
    public = {k: v for k, v in result.items() if k not in _NOT_IN_JSON}
    try:
        return atomic_write_json(path, public)
    except OSError as exc:
        raise EvalDataError(
            f"cannot write {path} ({exc.strerror or exc}); free space or pass another --output-dir"
        ) from None


def tsv(rows: Sequence[Sequence[object]]) -> str:
    """Tab-separated rows, quoted where a cell holds a tab, newline or quote (a file name may)."""
    out = io.StringIO()
    csv.writer(out, delimiter="\t", lineterminator="\n").writerows(rows)
    return out.getvalue()


def write_classification_details(result: dict, output_dir: Path | str) -> dict[str, str]:
    """Beside the JSON of a classification that returned its predictions: every image's top-k
    classes (`.predictions.tsv`), the confusion matrix (`.confusion.csv`, rows the true class) and
    its picture (`.confusion.png`, up to figures.CONFUSION_MAX_CLASSES classes). Returns
    {what: path, or why there is none}."""
    from src.figures import CONFUSION_MAX_CLASSES, plot_confusion_matrix

    output_dir = Path(output_dir)
    data, names = result["data"], result["data"].classnames
    rows = [("image", "true class", "predicted", "correct", "top-k, best first")]
    for i, (top1, top_k) in enumerate(zip(result["predictions"], result["top_k"])):
        truth = names[int(data.labels[i])]
        if top1 < 0:
            rows.append((str(data.images[i]), truth, "", "", "(unreadable)"))
        else:
            rows.append(
                (
                    str(data.images[i]),
                    truth,
                    names[top1],
                    int(top1 == int(data.labels[i])),
                    "; ".join(names[k] for k in top_k),
                )
            )
    files = {"predictions": str(_write(_path(result, output_dir, ".predictions.tsv"), tsv(rows)))}
    matrix = result["confusion_matrix"]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(
        [["true \\ predicted", *names], *([name, *row] for name, row in zip(names, matrix))]
    )
    files["confusion_matrix"] = str(_write(_path(result, output_dir, ".confusion.csv"), out.getvalue()))
    if len(names) <= CONFUSION_MAX_CLASSES:
        title = (
            f"zero-shot {result['dataset']}: top-1 {result['metrics']['top1']:.1f}% over "
            f"{result['num_images']} images"
        )
        picture = _path(result, output_dir, ".confusion.png")
        try:
            files["confusion_png"] = str(plot_confusion_matrix(matrix, names, picture, title))
        except OSError as exc:
            raise EvalDataError(f"cannot write {picture} ({exc.strerror or exc})") from None
    else:
        files["confusion_png"] = (
            f"not drawn: {len(names)} classes, more than {CONFUSION_MAX_CLASSES} (see the CSV)"
        )
    return files


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
