"""The paper's zero-shot table (and its linear-probe table) and the original's CSV line, from results.

The table has the paper's columns in its order (CIFAR10 ... ImageNet, then the average), one
headline score per dataset (src/evaluation/paper_datasets.py says which metric); a dataset not
evaluated shows "-" and leaves the average out. The original appended one line per run to its
output file: the scores (x100, full precision) joined by commas, in the order of its --dataset
list, which its script gives in the table's order.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from src.evaluation.datasets import EvalDataError
from src.evaluation.paper_datasets import PAPER_DATASETS, find_paper_dataset
from src.evaluation.results import format_rows


def paper_scores(results: Sequence[dict], task: str = "classification") -> dict[str, float]:
    """{paper dataset name: headline score} for the results of `task` that are paper datasets."""
    scores = {}
    for result in results:
        entry = find_paper_dataset(result["dataset"])
        if entry is not None and result.get("task") == task:
            scores[entry.name] = result["score"]
    return scores


def format_paper_table(
    results: Sequence[dict],
    label: str = "this model",
    task: str = "classification",
    columns: Sequence[str] | None = None,
) -> str:
    """The paper's row for `task`: one column per dataset of `columns` (default: the zero-shot
    table's 11), then their average when every one of them was evaluated."""
    names = list(columns or PAPER_DATASETS)
    scores = {name: value for name, value in paper_scores(results, task).items() if name in names}
    titles = [PAPER_DATASETS[name].title for name in names] + ["Average"]
    values = [f"{scores[name]:.1f}" if name in scores else "-" for name in names]
    complete = len(scores) == len(names)
    values.append(f"{sum(scores.values()) / len(scores):.1f}" if complete else "-")
    return format_rows(["Model", *titles], [[label, *values]], sep=" | ", rule=False, right=True)


def csv_line(results: Sequence[dict]) -> str:
    """The original's line: every classification score, in evaluation order, joined by commas."""
    return ",".join(repr(float(r["score"])) for r in results if r.get("task") == "classification")


def append_csv_line(path: Path | str, results: Sequence[dict]) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(csv_line(results) + "\n")
    except OSError as exc:
        raise EvalDataError(f"--csv {path}: cannot append ({exc.strerror or exc})") from None
    return path
