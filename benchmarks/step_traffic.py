"""Memory traffic of one eager training step, per training pair, by op class and source line.

    python -m benchmarks.step_traffic --config RWKV_CLIP_B32 --batch 512 --precision bf16 --wkv-impl fla
    python -m benchmarks.step_traffic --save benchmarks/results/traffic_b32_before.json
    python -m benchmarks.step_traffic --baseline benchmarks/results/traffic_b32_before.json
    python -m benchmarks.step_traffic --mix-impl triton --baseline benchmarks/results/traffic_b32_before.json

Counted on this machine's CPU by src/perf/traffic.py (FakeTensors under CUDA autocast
rules: no GPU, no arithmetic). Bytes are read + written; MB are 10^6 bytes. Times are
the bytes at the H200's ~4.3 TB/s, a floor for a memory-bound step, not a measurement.

Three comparisons, each against a baseline:
* the WKV per layer: fla's two passes with flips and float32 copies against bi_triton,
  both counted from their launch shapes in this run;
* `--baseline`: a JSON this script saved earlier (`--save`) from the same command, e.g.
  before a change to the model, against this run: element-wise + cast + copy traffic
  and the total, with their ratios. `--mix-impl` may differ from the baseline's: the
  fused token-shift mixes (src/open_alip/mix.py) against the eager ones is such a change.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from src.errors import UserError
from src.errors import report as report_error
from src.open_alip.choices import MIX_IMPLS

PROG = "benchmarks.step_traffic"
FUSIBLE = ("elementwise", "cast", "copy")  # what fusion (eager cuts, torch.compile) can remove


def _mb(n: float) -> str:
    return f"{n / 1e6:9.2f} MB"


def _ms(nbytes: float, bandwidth: float) -> str:
    return f"{nbytes / bandwidth * 1e3:8.1f} ms"


def wkv_per_layer(report) -> list[tuple[str, float, float]]:
    """(tower, fla bytes, bi_triton bytes) per layer and training pair, from the recorded calls."""
    from src.perf.traffic import WKV_TRAFFIC

    out = []
    seen = set()
    for call in report.wkv_calls:
        if call.tower in seen:
            continue
        seen.add(call.tower)
        fla, ours = (sum(WKV_TRAFFIC[impl](call).values()) / call.batch for impl in ("fla", "bi_triton"))
        out.append((call.tower, fla, ours))
    return out


def render(report, top: int, baseline: dict | None) -> list[str]:
    from src.perf.traffic import CLASSES, H200_BANDWIDTH

    bw = H200_BANDWIDTH
    b = report.batch
    lines = [
        f"{report.config}, batch {b}, {report.precision}, wkv {report.wkv_impl}, mixes {report.mix_impl}: "
        "eager training step "
        "(forward, CLIP loss, backward, clipping, fused AdamW), bytes read + written",
        f"{'class':<12} {'per pair':>12} {'per step':>12} {'at 4.3 TB/s':>12}",
    ]
    for c in CLASSES:
        lines.append(
            f"{c:<12} {_mb(report.per_pair(c))} {report.per_pair(c) * b / 1e9:9.2f} GB "
            f"{_ms(report.per_pair(c) * b, bw)}"
        )
    fusible = report.per_pair(*FUSIBLE)
    lines.append(
        f"{'total':<12} {_mb(report.per_pair())} {report.per_pair() * b / 1e9:9.2f} GB "
        f"{_ms(report.per_pair() * b, bw)}"
    )
    lines.append(f"element-wise + cast + copy: {_mb(fusible)} per pair, {_ms(fusible * b, bw)} per step")
    lines.append("")
    lines.append(
        "largest contributors by source line (backward ops under the forward line that made them), per pair:"
    )
    for c, site, nbytes in report.top_lines(top):
        lines.append(f"  {_mb(nbytes / b)}  {c:<11} {site}")
    lines.append("")
    lines.append(
        "WKV per layer and pair, counted from the launch shapes (fla: two passes with flips and fp32 copies):"
    )
    for tower, fla, ours in wkv_per_layer(report):
        lines.append(
            f"  {tower:<5} fla {_mb(fla)}   bi_triton {_mb(ours)}   fla / bi_triton {fla / ours:5.2f}x"
        )
    if baseline is not None:
        lines.append("")
        lines.extend(compare(report, baseline))
    return lines


def compare(report, baseline: dict) -> list[str]:
    before = baseline["bytes_per_pair"]
    b_fusible = sum(before[c] for c in FUSIBLE)
    fusible = report.per_pair(*FUSIBLE)
    rows = [("element-wise + cast + copy", b_fusible, fusible), ("total", before["total"], report.per_pair())]
    rows += [(c, before[c], report.per_pair(c)) for c in FUSIBLE]
    out = [
        f"against the baseline {baseline.get('label', '')!s} (same config, batch, precision, wkv; mixes "
        f"{baseline.get('mix_impl', 'torch')}), per pair:"
    ]
    for name, old, new in rows:
        ratio = f"{old / new:5.2f}x lower" if new else "all gone"
        out.append(f"  {name:<27} before {_mb(old)}   after {_mb(new)}   {ratio}")
    return out


def _load_baseline(path: Path, args: argparse.Namespace) -> dict:
    """The saved count, checked to be of the same command before anything is counted."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(
            f"--baseline {path}: cannot read it as JSON ({exc}); give a file saved with --save"
        ) from None
    same = ("config", "batch", "precision", "wkv_impl")
    if any(data.get(k) != getattr(args, k) for k in same):
        raise UserError(
            f"--baseline {path} was counted for "
            + ", ".join(f"{k} {data.get(k)}" for k in same)
            + "; run with the same --config, --batch, --precision and --wkv-impl"
        )
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--config", default="RWKV_CLIP_B32", help="model config name or JSON file")
    parser.add_argument("--batch", type=int, default=512, help="pairs per GPU step (the micro-batch)")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--wkv-impl", default="fla", choices=("fla", "bi_triton", "chunked", "reference"))
    parser.add_argument(
        "--mix-impl",
        default="torch",
        choices=MIX_IMPLS,
        help="token-shift mixes: eager torch ops, or one fused Triton op per mix site",
    )
    parser.add_argument("--top", type=int, default=15, help="source lines to list")
    parser.add_argument("--save", type=Path, help="write the counts as JSON here (a baseline for later runs)")
    parser.add_argument("--label", default="", help="a name for this run, stored with --save")
    parser.add_argument("--baseline", type=Path, help="a JSON saved by --save to compare this run with")
    args = parser.parse_args(argv)

    from src.fsutil import atomic_write_json
    from src.perf.traffic import count_traffic

    try:
        baseline = _load_baseline(args.baseline, args) if args.baseline else None
        report = count_traffic(args.config, args.batch, args.precision, args.wkv_impl, mix_impl=args.mix_impl)
    except UserError as exc:
        return report_error(PROG, exc)
    print("\n".join(render(report, args.top, baseline)))
    if args.save:
        data = report.as_json() | {
            "label": args.label,
            "command": " ".join(["python -m", PROG, *(argv or sys.argv[1:])]),
        }
        data["wkv_per_layer"] = [
            {"tower": t, "fla_bytes_per_pair": f, "bi_triton_bytes_per_pair": o}
            for t, f, o in wkv_per_layer(report)
        ]
        atomic_write_json(args.save, data, indent=1)
        print(f"saved {args.save}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
