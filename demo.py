"""The README's first command: the whole pipeline on a small generated corpus, CPU only, offline.

python demo.py --output demo_out          # about 4 minutes on 2 cores (its last line says how long)
python demo.py --output /tmp/d --quick    # reduced sizes, for CI (~2-3 minutes)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    from src.demo.pipeline import DemoSettings

    p = argparse.ArgumentParser(
        prog="demo.py",
        description="End-to-end demo with no GPU and no internet: generate a captioned synthetic-scene "
        "corpus in the hub's parquet format, serve it from a local hub and download it with data/hfd.sh, "
        "convert it with data2rec.py, smoke-test the DALI loader, train a small RWKV-CLIP with torchrun on 2 "
        "CPU processes, then evaluate zero-shot classification and retrieval on held-out scenes against "
        "chance. Everything goes under --output: summary.json, loss_curve.png, predictions.png, logs/.",
        allow_abbrev=False,
    )
    p.add_argument("--output", type=Path, default=Path("demo_out"), help="output folder (default: demo_out)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="reduced sizes for CI: every step runs but the model barely trains",
    )
    p.add_argument(
        "--train-samples",
        type=int,
        default=None,
        help=f"training pairs to generate (default {DemoSettings.train_samples})",
    )
    p.add_argument(
        "--epochs", type=int, default=None, help=f"training epochs (default {DemoSettings.epochs})"
    )
    p.add_argument(
        "--processes", type=int, default=None, help=f"torchrun processes (default {DemoSettings.processes})"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the corpus and of training (default 0)")
    return p


def _unwritable(output: Path) -> str | None:
    """Why nothing can be written under `output` (None if it can): checked before the first
    step, which would otherwise fail deep inside with a traceback."""
    import tempfile

    try:
        output.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=output, prefix=".probe-"):
            pass
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from src.demo.pipeline import Demo, DemoSettings, format_summary
    from src.errors import UserError, flag_of

    settings = DemoSettings.quick(args.output) if args.quick else DemoSettings(output=args.output)
    settings.seed = args.seed
    for name in ("train_samples", "epochs", "processes"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                print(f"demo.py: error: {flag_of(name)} must be at least 1", file=sys.stderr)
                return 2
            setattr(settings, name, value)
    if settings.train_samples < settings.batch_size * settings.processes:
        print(
            f"demo.py: error: --train-samples must be at least {settings.batch_size * settings.processes} "
            "(one global batch)",
            file=sys.stderr,
        )
        return 2
    unwritable = _unwritable(args.output)
    if unwritable:
        print(
            f"demo.py: error: --output {args.output}: cannot write there ({unwritable}); pass a folder you "
            "can write",
            file=sys.stderr,
        )
        return 2
    try:
        summary = Demo(settings).run()
    except UserError as exc:  # a DemoError names the failed step and its log
        print(f"demo.py: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo.py: interrupted", file=sys.stderr)
        return 130
    print()
    print(format_summary(summary))
    out = args.output
    print(
        f"\nWrote {out / 'summary.json'}, {out / 'loss_curve.png'}, {out / 'predictions.png'} "
        f"and {out / 'loader_batch.png'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
