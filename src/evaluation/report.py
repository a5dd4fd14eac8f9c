"""The paper's zero-shot table and the original's CSV line, from classification results.

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


def paper_scores(results: Sequence[dict]) -> dict[str, float]:
    """{paper dataset name: headline score} for the results that are paper datasets."""
    scores = {}
    for result in results:
        entry = find_paper_dataset(result["dataset"])
        if entry is not None and result.get("task") == "classification":
            scores[entry.name] = result["score"]
    return scores


def format_paper_table(results: Sequence[dict], label: str = "this model") -> str:
    scores = paper_scores(results)
    titles = [d.title for d in PAPER_DATASETS.values()] + ["Average"]
    values = [f"{scores[name]:.1f}" if name in scores else "-" for name in PAPER_DATASETS]
    complete = len(scores) == len(PAPER_DATASETS)
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
