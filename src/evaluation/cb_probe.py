"""CLIP_benchmark 1.6.2's linear probe (`clip_benchmark eval --task linear_probe`), step for step, on
features already extracted: linear_probe.py `--protocol clip_benchmark`.

It is not the paper's protocol (src/evaluation/logistic.py): CLIP_benchmark trains a torch
`nn.Linear` by mini-batch AdamW (learning rate 0.1 on a cosine schedule without warm-up, 10 epochs,
batch 64, cross-entropy) and searches the weight decay instead of an L2 strength: on a grid of 97
values from 1e-6 to 1e2, it starts from those that equal one of 7 values spread over the same range
and moves to the best of (peak - step, peak, peak + step) for steps 8, 4, 2 and 1, keeping a peak
unless a neighbour's validation top-1 is strictly higher; it then trains once more on train + val
with the chosen decay and reports top-1, top-5 (NaN, here None, when the test labels stop below 5)
and mean per-class recall of the test split.

What decides its numbers, and is done the same way here: the global torch RNG seeded with `seed`
before its shuffle of the training rows (a `randperm`, its few-shot sampler with every row kept);
`torch.manual_seed(seed)` before each training run (the layer's initial weights, then each epoch's
DataLoader shuffle, `shuffle=True`); the output width, the training labels' maximum + 1; its
learning-rate formula evaluated in numpy. Its command line seeds the RNG when it starts, so its run
gives the same numbers when nothing draws from the RNG in between, as with `--skip_load` and
`--val_split`; the cross-check (tests/evaluation/test_linear_probe_cb.py) runs its `evaluate` on
features cached in its layout and compares. Precision is float32 (its `--no_amp`; its default
autocast is what clip_benchmark_eval.py turns off too).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from src.evaluation.probe_settings import CB_BATCH_SIZE, CB_EPOCHS, CB_LEARNING_RATE, SEED
from src.open_alip.zero_shot import prediction_metrics, top_predictions

WEIGHT_DECAYS = np.logspace(-6, 2, num=97).tolist()
# Its starting points are the grid's values equal to one of these: compared as floats, as it does.
_COARSE = np.logspace(-6, 2, num=7).tolist()
STARTING_INDICES = [i for i, value in enumerate(WEIGHT_DECAYS) if value in _COARSE]


def _cosine_lr(optimizer: torch.optim.Optimizer, base_lr: float, steps: int) -> Callable[[int], None]:
    def adjust(step: int) -> None:
        for group in optimizer.param_groups:
            group["lr"] = 0.5 * (1 + np.cos(np.pi * step / steps)) * base_lr

    return adjust


def _train(
    features: torch.Tensor,
    labels: torch.Tensor,
    outputs: int,
    weight_decay: float,
    lr: float,
    epochs: int,
    batch_size: int,
    seed: int,
    device: torch.device,
) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = torch.nn.Linear(features.shape[1], outputs).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    criterion = torch.nn.CrossEntropyLoss()
    loader = DataLoader(TensorDataset(features, labels), batch_size=batch_size, shuffle=True)
    schedule = _cosine_lr(optimizer, lr, epochs * len(loader))
    for epoch in range(epochs):
        for i, (x, y) in enumerate(loader):
            schedule(i + epoch * len(loader))
            optimizer.zero_grad()
            loss = criterion(model(x.to(device)), y.to(device))
            loss.backward()
            optimizer.step()
    return model


@torch.no_grad()
def _logits(
    model: torch.nn.Module, features: torch.Tensor, batch_size: int, device: torch.device
) -> torch.Tensor:
    return torch.cat(
        [
            model(features[i : i + batch_size].to(device)).float().cpu()
            for i in range(0, len(features), batch_size)
        ]
    )


def _top1(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return logits.topk(1, dim=1).indices[:, 0].eq(labels).float().sum().item() / len(labels)


def clip_benchmark_probe(
    train: tuple[torch.Tensor, torch.Tensor],
    val: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    device: torch.device | str,
    *,
    lr: float = CB_LEARNING_RATE,
    epochs: int = CB_EPOCHS,
    batch_size: int = CB_BATCH_SIZE,
    seed: int = SEED,
    log: Callable[[str], None] = lambda line: None,
) -> dict:
    """CLIP_benchmark's probe on (features, labels) pairs held in memory: its search on train/val, its
    final fit on both, scored on test. Returns {"weight_decay", "metrics" (%, top5 None below 5
    classes), "clip_benchmark_metrics" (its result keys), "sweep", "seconds"}. The global CPU RNG is
    restored afterwards."""
    device = torch.device(device)
    (train_x, train_y), (val_x, val_y), (test_x, test_y) = train, val, test
    outputs = int(train_y.max()) + 1
    start = time.perf_counter()
    sweep: list[dict] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        order = torch.randperm(len(train_x))
        train_x, train_y = train_x[order], train_y[order]

        def accuracy_at(index: int) -> float:
            began = time.perf_counter()
            model = _train(
                train_x, train_y, outputs, WEIGHT_DECAYS[index], lr, epochs, batch_size, seed, device
            )
            acc = _top1(_logits(model, val_x, batch_size, device), val_y)
            sweep.append(
                {
                    "weight_decay": WEIGHT_DECAYS[index],
                    "val_acc1": acc,
                    "seconds": time.perf_counter() - began,
                }
            )
            log(
                f"weight decay {WEIGHT_DECAYS[index]:.3g}: val top-1 {100 * acc:.2f}% "
                f"({time.perf_counter() - began:.1f} s)"
            )
            return acc

        def find_peak(indices: list[int]) -> int:
            best, best_acc = 0, 0.0  # as its find_peak: a neighbour must beat the best strictly
            for index in indices:
                acc = accuracy_at(index)
                if best_acc < acc:
                    best, best_acc = index, acc
            return best

        peak = find_peak(STARTING_INDICES)
        step = 8
        while step > 0:
            peak = find_peak([max(peak - step, 0), peak, min(peak + step, len(WEIGHT_DECAYS) - 1)])
            step //= 2
        weight_decay = WEIGHT_DECAYS[peak]
        began = time.perf_counter()
        model = _train(
            torch.cat([train_x, val_x]),
            torch.cat([train_y, val_y]),
            outputs,
            weight_decay,
            lr,
            epochs,
            batch_size,
            seed,
            device,
        )
        log(
            f"final fit on train + val, weight decay {weight_decay:.3g} ({time.perf_counter() - began:.1f} s)"
        )
        logits = _logits(model, test_x, batch_size, device)
    top1, topk = top_predictions(logits)
    metrics = prediction_metrics(top1, topk, test_y, max(outputs, int(test_y.max()) + 1))
    if int(test_y.max()) < 5:
        metrics["top5"] = None
    ours = {
        "lp_acc1": metrics["top1"] / 100,
        "lp_acc5": None if metrics["top5"] is None else metrics["top5"] / 100,
        "lp_mean_per_class_recall": metrics["mean_per_class_recall"] / 100,
        "weight_decay": weight_decay,
        "epochs": epochs,
        "seed": seed,
        "fewshot_k": -1,
        "normalized": True,
    }
    return {
        "weight_decay": weight_decay,
        "metrics": metrics,
        "clip_benchmark_metrics": ours,
        "sweep": sweep,
        "seconds": time.perf_counter() - start,
    }
