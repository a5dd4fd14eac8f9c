"""The text side of zero-shot classification as a user gives it: prompt templates read from a file
(--templates, --label-templates), zero_shot.py's --labels, and the check of class names that repeat."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from src.evaluation.datasets import EvalDataError

# Templates for labels given on the command line: CLIP's 80 ImageNet prompts.
LABEL_TEMPLATES_FROM = "imagenet"


def read_templates(path: Path | str) -> list[str]:
    """Templates from a JSON list (or {"templates": [...]}) or a text file, one per line, with `{}`."""
    path = Path(path)
    if not path.is_file():
        raise EvalDataError(f"template file {path} does not exist")
    if path.suffix.lower() == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        templates = data["templates"] if isinstance(data, dict) else data
    else:
        templates = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    bad = [t for t in templates if "{}" not in t]
    if not templates or bad:
        raise EvalDataError(
            f"template file {path}: every template needs a '{{}}' placeholder (bad: {bad[:3]})"
        )
    return list(templates)


def read_labels(value: str) -> list[str]:
    """zero_shot.py --labels: comma-separated labels, or `@FILE` with one label per line (blank lines
    and lines starting with # left out). Two or more distinct, non-empty labels, else EvalDataError:
    a softmax over one label gives every image probability 1.0, and a path given as a label is one."""
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise EvalDataError(
                f"--labels {value}: cannot read the label file ({why}); give a UTF-8 file "
                "with one label per line"
            ) from None
        labels = [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    else:
        labels = [label.strip() for label in value.split(",")]
    if len([label for label in labels if label]) < 2:
        hint = (
            f" (to read labels from the file {value}, pass --labels @{value})"
            if Path(value).is_file()
            else ""
        )
        raise EvalDataError(
            f"--labels {value!r} gives {len([la for la in labels if la])} label{hint}; give two or more, "
            "comma-separated (--labels 'cat,dog,car') or one per line in a file (--labels @labels.txt)"
        )
    if len(set(labels)) != len(labels) or not all(labels):
        raise EvalDataError("--labels: give distinct, non-empty labels, e.g. --labels 'cat,dog,car'")
    return labels


def repeated_names(names: Sequence[str]) -> str | None:
    """A warning when class names repeat (a --classnames file with one name ten times, say): classes of
    one name get the same text embedding, so the model cannot tell them apart and the score means little."""
    counts = Counter(" ".join(str(n).split()).lower() for n in names)
    repeats = [(name, n) for name, n in counts.items() if n > 1]
    if not repeats:
        return None
    shown = ", ".join(f"{name!r} x{n}" for name, n in sorted(repeats, key=lambda r: -r[1])[:3])
    return (
        f"class names repeat ({shown}{', ...' if len(repeats) > 3 else ''}): classes of one name get the "
        "same text embedding, so the model cannot tell them apart; check the class names"
    )
