"""The resume state of a conversion: which shards are complete and where the next one starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from src.fsutil import atomic_write_json, json_safe

STATE_VERSION = 1


def write_json_atomic(path: Path, data: Any) -> None:
    """For files only data2rec reads back (the resume state): ASCII escapes keep every string
    exact, a non-UTF-8 file name's lone surrogates included, so names and fingerprints compare
    equal when read back."""
    atomic_write_json(path, data, durable=True, indent=1, ensure_ascii=True)


def write_report(path: Path, report: dict) -> None:
    """For files people and other tools read: UTF-8 text, a non-UTF-8 file name shown with `\\xNN`
    for its odd bytes (src/fsutil.py's json_safe)."""
    atomic_write_json(path, json_safe(report), durable=True, indent=1, ensure_ascii=False)


def load_state(path: Path) -> dict | None:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except ValueError:
        return None  # written atomically, so unreadable means foreign: treated as no state
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        return None
    return state


def new_state(fingerprint: dict, counts: list[int]) -> dict:
    return {
        "version": STATE_VERSION,
        "fingerprint": fingerprint,
        "counts": counts,  # items per unit of the full input, the basis of sample ids
        "shards": [],  # summaries of completed shards, in order
        "next": [0, 0],  # (slot in this machine's unit list, item position) where the next shard starts
        "report": None,  # counts up to the end of the last completed shard
        "complete": False,
    }
