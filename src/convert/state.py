"""The resume state of a conversion: which shards are complete and where the next one starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from src.fsutil import atomic_write_json

STATE_VERSION = 1


def write_json_atomic(path: Path, data: Any) -> None:
    atomic_write_json(path, data, durable=True, indent=1, ensure_ascii=False)


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
