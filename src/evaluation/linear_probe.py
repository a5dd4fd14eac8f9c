"""One dataset's linear probe (linear_probe.py): frozen image features of its splits (cached,
src/evaluation/feature_cache.py), a classifier fitted on them, its scores on the test split.

Two protocols (docs/evaluation.md says which choice is whose):
- `paper` (the default): L2-regularised logistic regression fitted by full-batch L-BFGS, its
  strength searched coarse-to-fine on a validation split as CLIP describes, then refitted on
  train + validation (src/evaluation/logistic.py);
- `clip_benchmark`: CLIP_benchmark 1.6.2's mini-batch AdamW probe and weight-decay search
  (src/evaluation/cb_probe.py), on the same features.
The validation split is the dataset's own (Flowers102, DTD, FGVC Aircraft, an own `val/`) or
`val_fraction` of the training split held out by a seeded draw. Metrics are in percent.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from src.evaluation.cb_probe import clip_benchmark_probe
from src.evaluation.datasets import ClassificationData, EvalDataError
from src.evaluation.feature_cache import SplitFeatures, split_features
from src.evaluation.images import PIL_PREPROCESSING
from src.evaluation.logistic import (
    LAMBDA_GRID,
    Rows,
    coarse_to_fine,
    fit_logistic,
    log_lambda,
    place,
    score,
    sweep_key,
)
from src.evaluation.probe_data import ProbeDataset, check_same_classes, held_out_mask
from src.evaluation.probe_settings import ProbeSettings


@dataclass(frozen=True)
class Extraction:
    """How to get features: the model, what identifies it, and the loader settings."""

    model: torch.nn.Module
    weights: str  # feature_cache.weights_digest
    config: dict
    cache_dir: Path
    input_size: int
    device: torch.device
    batch_size: int
    workers: int
    progress: bool


def _features(extraction: Extraction, data: ClassificationData, split: str) -> SplitFeatures:
    e = extraction
    return split_features(
        e.model,
        data,
        split,
        weights=e.weights,
        config=e.config,
        cache_dir=e.cache_dir,
        input_size=e.input_size,
        device=e.device,
        batch_size=e.batch_size,
        workers=e.workers,
        progress=e.progress,
    )


def _check_labels(name: str, split: str, rows: Rows, num_classes: int) -> None:
    if len(rows.labels) and not 0 <= int(rows.labels.min()) <= int(rows.labels.max()) < num_classes:
        raise EvalDataError(f"dataset {name} ({split}): a stored label is outside 0..{num_classes - 1}")


def evaluate_linear_probe(
    dataset: ProbeDataset,
    extraction: Extraction,
    settings: ProbeSettings = ProbeSettings(),
    log: Callable[[str], None] = print,
) -> dict:
    """The probe of one dataset: {"dataset", "task": "linear_probe", "protocol", "metric", "score",
    "metrics": {"top1", "top5", "mean_per_class_recall"}, "num_classes", "images": {split: rows},
    "validation", the protocol's search ("regularization" or "clip_benchmark"), "feature_cache",
    "seconds": {"features", "probe"}, "skipped_images" where any}."""
    splits = [s for s in ("train", "val", "test") if s in dataset.splits]
    data = {split: dataset.read(split) for split in splits}
    classnames = check_same_classes(dataset.name, data)
    num_classes = len(classnames)
    features: dict[str, SplitFeatures] = {}
    for split in splits:
        features[split] = f = _features(extraction, data[split], split)
        _check_labels(dataset.name, split, f.rows, num_classes)
        how = "read from the cache" if f.reused else f"extracted in {f.seconds:.1f} s"
        log(f"{split}: {len(f.rows.labels):,} x {f.rows.features.shape[1]} features {how} ({f.folder})")
    train = features["train"].rows
    if "val" in features:
        validation = "the dataset's val split"
        fit_parts, val_parts, refit_parts = [train], [features["val"].rows], [train, features["val"].rows]
    else:
        mask = held_out_mask(len(train.labels), settings.val_fraction, settings.seed)
        validation = f"{settings.val_fraction:g} of train held out (seed {settings.seed})"
        fit_parts, val_parts, refit_parts = [train.masked(~mask)], [train.masked(mask)], [train]
    test = features["test"].rows
    result: dict = {
        "dataset": dataset.name,
        "task": "linear_probe",
        "protocol": settings.protocol,
        "num_classes": num_classes,
        "images": {
            "train": sum(p.count for p in fit_parts),
            "val": sum(p.count for p in val_parts),
            "test": len(test.labels),
        },
        "validation": validation,
        "preprocessing": PIL_PREPROCESSING,
        "feature_cache": {
            split: {"folder": str(f.folder), "reused": f.reused} for split, f in features.items()
        },
    }
    if settings.protocol == "clip_benchmark":
        probe = _clip_benchmark(fit_parts, val_parts, test, extraction.device, settings, log)
        result["metric"] = "top1"  # CLIP_benchmark ranks by acc1
        result["clip_benchmark"] = {k: probe[k] for k in ("weight_decay", "sweep")}
        result["clip_benchmark_metrics"] = probe["clip_benchmark_metrics"]
    else:
        probe = _paper(
            fit_parts,
            val_parts,
            refit_parts,
            test,
            num_classes,
            dataset.metric,
            extraction.device,
            settings,
            log,
        )
        result["metric"] = dataset.metric
        result["regularization"] = probe["regularization"]
    result.update(
        score=probe["metrics"][result["metric"]],
        metrics=probe["metrics"],
        seconds={"features": sum(f.seconds for f in features.values()), "probe": probe["seconds"]},
    )
    skipped = [{**s, "split": split} for split, f in features.items() for s in f.skipped]
    if skipped:
        result["skipped_images"] = skipped
    return result


def _paper(
    fit_parts: list[Rows],
    val_parts: list[Rows],
    refit_parts: list[Rows],
    test: Rows,
    num_classes: int,
    metric: str,
    device: torch.device,
    settings: ProbeSettings,
    log: Callable[[str], None],
) -> dict:
    placed: dict[int, Rows] = {}

    def on_device(part: Rows) -> Rows:
        key = id(part.features)  # masked views of one split share its placed copy
        if key not in placed:
            placed[key] = place(Rows(part.features, part.labels), device)
        return placed[key].masked(None if part.mask is None else part.mask.to(placed[key].labels.device))

    fit_parts, val_parts = [on_device(p) for p in fit_parts], [on_device(p) for p in val_parts]
    refit_parts, test_parts = [on_device(p) for p in refit_parts], [on_device(test)]
    sweep: list[dict] = []

    def evaluate(index: int) -> tuple:
        lam = LAMBDA_GRID[index]
        fit = fit_logistic(fit_parts, num_classes, lam, device, settings.max_iter)
        val = score(val_parts, fit, num_classes, device)
        sweep.append(
            {
                "lambda": lam,
                "val": {k: val[k] for k in (metric, "loss")},
                "iterations": fit.iterations,
                "converged": fit.converged,
                "seconds": fit.seconds,
            }
        )
        log(
            f"fit {len(sweep)}: lambda {log_lambda(lam)}, val {metric} {val[metric]:.2f}% (loss "
            f"{val['loss']:.4f}), {fit.iterations} L-BFGS iterations, {fit.seconds:.2f} s"
            + ("" if fit.converged else ", not converged")
        )
        return sweep_key(val, metric)

    peak = coarse_to_fine(evaluate)
    lam = LAMBDA_GRID[peak]
    final = fit_logistic(refit_parts, num_classes, lam, device, settings.max_iter)
    metrics = score(test_parts, final, num_classes, device)
    metrics.pop("loss")
    log(
        f"final fit on train + val: lambda {log_lambda(lam)}, {final.iterations} L-BFGS iterations, "
        f"{final.seconds:.2f} s"
    )
    seconds = sum(s["seconds"] for s in sweep) + final.seconds
    return {
        "metrics": metrics,
        "seconds": seconds,
        "regularization": {
            "lambda": lam,
            "C": 1.0 / lam,
            "log10_lambda": math.log10(lam),
            "fits": len(sweep) + 1,
            "final_iterations": final.iterations,
            "final_converged": final.converged,
            "sweep": sweep,
        },
    }


def _gather(parts: list[Rows]) -> tuple[torch.Tensor, torch.Tensor]:
    """The counted rows of `parts` as two in-memory tensors (CLIP_benchmark trains from memory)."""
    xs, ys = [], []
    for part in parts:
        keep = part.mask if part.mask is not None else slice(None)
        xs.append(torch.as_tensor(part.features)[keep].clone())
        ys.append(torch.as_tensor(part.labels)[keep].clone())
    return torch.cat(xs), torch.cat(ys)


def _clip_benchmark(
    fit_parts: list[Rows],
    val_parts: list[Rows],
    test: Rows,
    device: torch.device,
    settings: ProbeSettings,
    log: Callable[[str], None],
) -> dict:
    return clip_benchmark_probe(
        _gather(fit_parts),
        _gather(val_parts),
        _gather([test]),
        device,
        lr=settings.cb_lr,
        epochs=settings.cb_epochs,
        batch_size=settings.cb_batch_size,
        seed=settings.seed,
        log=log,
    )
