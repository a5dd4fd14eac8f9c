"""Counts of what a conversion wrote and skipped (by reason), with examples of bad inputs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from .items import Result


@dataclass
class Report:
    max_examples: int = 20
    seen: int = 0
    written: int = 0
    converted: int = 0  # images re-encoded rather than passed through
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, list[dict]] = field(default_factory=dict)

    def add(self, result: Result) -> None:
        self.seen += 1
        if result.reason is None:
            self.written += 1
            self.converted += int(result.converted)
        else:
            self.skip(result.reason, result.ref, result.detail)

    def skip(self, reason: str, ref: str, detail: str) -> None:
        self.skipped[reason] += 1
        bucket = self.examples.setdefault(reason, [])
        if len(bucket) < self.max_examples:
            bucket.append({"input": ref, "detail": detail})

    def to_dict(self) -> dict:
        return {
            "seen": self.seen, "written": self.written, "converted": self.converted,
            "skipped": sum(self.skipped.values()),
            "skipped_by_reason": dict(sorted(self.skipped.items())),
            "examples": {k: self.examples[k] for k in sorted(self.examples)},
        }

    @classmethod
    def from_dict(cls, d: dict, max_examples: int = 20) -> Report:
        return cls(
            max_examples=max_examples, seen=d["seen"], written=d["written"], converted=d["converted"],
            skipped=Counter(d["skipped_by_reason"]), examples={k: list(v) for k, v in d["examples"].items()},
        )

    def summary(self) -> str:
        lines = [f"{self.written} written ({self.converted} re-encoded), "
                 f"{sum(self.skipped.values())} skipped of {self.seen}"]
        for reason, n in sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0])):
            example = self.examples.get(reason, [{}])[0]
            lines.append(f"  {reason}: {n}  (e.g. {example.get('input', '?')}: {example.get('detail', '')})")
        return "\n".join(lines)
