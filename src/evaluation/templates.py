"""Prompt templates read from a user's file (--templates, --label-templates)."""

from __future__ import annotations

import json
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
        raise EvalDataError(f"template file {path}: every template needs a '{{}}' placeholder (bad: {bad[:3]})")
    return list(templates)
