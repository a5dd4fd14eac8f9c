"""What a run leaves its user at the end: loss_curve.png beside metrics.jsonl (also drawn at each
epoch's end, so a killed run has one), and a summary of the run in the log: steps, samples, wall
time, samples/s, the final and best loss, where the checkpoints are, and the command that
evaluates the last one."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from src.training.observe import LOG, format_duration

LOSS_CURVE = "loss_curve.png"
METRICS = "metrics.jsonl"
# The evaluation command the summary names: the repository's, as the user can run it from here.
_ZERO_SHOT = Path(__file__).resolve().parents[2] / "zero_shot.py"


def draw_loss_curve(output: Path, global_batch: int) -> Path | None:
    """OUTPUT/loss_curve.png from OUTPUT/metrics.jsonl: the mean loss between log lines, against
    chance (ln of the global batch). A figure that cannot be drawn is a warning, never the run's end."""
    from src.figures import plot_loss_curve, read_loss_points

    try:
        points = read_loss_points(output / METRICS, key="loss_avg")
        if not points:
            return None
        return plot_loss_curve(
            points,
            output / LOSS_CURVE,
            title="training loss (mean between log lines)",
            reference=math.log(global_batch) if global_batch > 1 else None,
            reference_label=f"chance, ln {global_batch}",
        )
    except (OSError, ValueError) as exc:
        LOG.warning("could not draw %s: %s", output / LOSS_CURVE, exc)
        return None


def _losses(output: Path) -> list[tuple[int, float]]:
    from src.figures import read_loss_points

    try:
        return read_loss_points(output / METRICS, key="loss_avg")
    except OSError:
        return []


def evaluate_command(checkpoint: Path) -> str:
    """The zero-shot command for `checkpoint`, spelled to run from the current folder."""
    script = "zero_shot.py" if Path.cwd() == _ZERO_SHOT.parent else str(_ZERO_SHOT)
    return (
        f"python {shlex.quote(script)} --model-weight {shlex.quote(str(checkpoint))} "
        "--images YOUR_IMAGES/ --labels 'label one,label two' (or --datasets NAME=DIR)"
    )


def log_summary(
    output: Path,
    *,
    first_step: int,
    last_step: int,
    global_batch: int,
    seconds: float,
    last_checkpoint: Path | None,
) -> None:
    """The summary lines (rank 0), after the curve is drawn."""
    steps = last_step - first_step
    samples = steps * global_batch
    rate = samples / seconds if seconds > 0 else float("nan")
    LOG.info(
        "finished at step %d: %d steps, %s samples in %s (%.1f samples/s)%s",
        last_step,
        steps,
        f"{samples:,}",
        format_duration(seconds),
        rate,
        f", resumed at step {first_step}" if first_step else "",
    )
    losses = _losses(output)
    if losses:
        best_step, best = min(losses, key=lambda p: p[1])
        LOG.info(
            "loss (mean between log lines): %.4f at the end, best %.4f at step %d, %.4f at the start%s",
            losses[-1][1],
            best,
            best_step,
            losses[0][1],
            f" (chance: ln {global_batch} = {math.log(global_batch):.4f})" if global_batch > 1 else "",
        )
    curve = output / LOSS_CURVE
    LOG.info("metrics: %s%s", output / METRICS, f", loss curve: {curve}" if curve.is_file() else "")
    if last_checkpoint is not None:
        LOG.info("checkpoints: %s (last: %s)", last_checkpoint.parent, last_checkpoint.name)
        LOG.info("evaluate the last one: %s", evaluate_command(last_checkpoint))
