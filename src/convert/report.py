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
    by_captions: Counter = field(default_factory=Counter)  # records written, by their caption count K

    def add(self, result: Result) -> None:
        self.seen += 1
        if result.reason is None:
            self.written += 1
            self.converted += int(result.converted)
            self.by_captions[result.captions] += 1
        else:
            self.skip(result.reason, result.ref, result.detail)

    def skip(self, reason: str, ref: str, detail: str) -> None:
        self.skipped[reason] += 1
        bucket = self.examples.setdefault(reason, [])
        if len(bucket) < self.max_examples:
            bucket.append({"input": ref, "detail": detail})

    def to_dict(self) -> dict:
        return {
            "seen": self.seen,
            "written": self.written,
            "converted": self.converted,
            "skipped": sum(self.skipped.values()),
            "skipped_by_reason": dict(sorted(self.skipped.items())),
            "examples": {k: self.examples[k] for k in sorted(self.examples)},
            "records_by_caption_count": {str(k): self.by_captions[k] for k in sorted(self.by_captions)},
        }

    @classmethod
    def from_dict(cls, d: dict, max_examples: int = 20) -> Report:
        return cls(
            max_examples=max_examples,
            seen=d["seen"],
            written=d["written"],
            converted=d["converted"],
            skipped=Counter(d["skipped_by_reason"]),
            examples={k: list(v) for k, v in d["examples"].items()},
            by_captions=Counter({int(k): n for k, n in d.get("records_by_caption_count", {}).items()}),
        )

    def reason_lines(self, most: int | None = None) -> list[str]:
        """One line per skip reason, most frequent first, each with its first example."""
        lines = []
        for reason, n in sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0]))[:most]:
            example = self.examples.get(reason, [{}])[0]
            lines.append(f"  {reason}: {n}  (e.g. {example.get('input', '?')}: {example.get('detail', '')})")
        return lines

    def caption_counts(self) -> str:
        """ "1 caption: 5 records, 3 captions: 2 records"."""
        return (
            ", ".join(
                f"{k} caption{'s' if k != 1 else ''}: {n} record{'s' if n != 1 else ''}"
                for k, n in sorted(self.by_captions.items())
            )
            or "no records"
        )

    def summary(self) -> str:
        lines = [
            f"{self.written} written ({self.converted} re-encoded), "
            f"{sum(self.skipped.values())} skipped of {self.seen}"
        ]
        return "\n".join([*lines, *self.reason_lines()])


def percent(part: int, whole: int) -> str:
    """60%, 33.3%, 0.01%: three significant digits, never a wrong 100%."""
    share = 100 * part / whole if whole else 0.0
    text = f"{share:.3g}"
    if part != whole and float(text) >= 100:
        text = f"{share:.6g}"
    return f"{text}%"
