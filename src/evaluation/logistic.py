"""L2-regularised multinomial logistic regression on frozen features, fitted with full-batch L-BFGS
on any device in float32, and the coarse-to-fine search for its regularisation strength that the
CLIP paper describes (its appendix A.3). linear_probe.py's default protocol (docs/evaluation.md).

The objective is scikit-learn's `LogisticRegression(C=1/lam)` (what CLIP used), divided by the
sample count as scikit-learn itself does:

    mean_i CE(x_i W^T + b, y_i) + lam / (2 n) * ||W||^2      (the bias is not penalised)

Features are rows of float32 tensors that stay where they are: a memory-mapped file on the CPU, or
copied once to the GPU. Every evaluation of the objective walks them in chunks of rows (two matrix
products per chunk, the gradient by hand), so memory is bounded by a chunk's logits whatever the
row count: ImageNet's 1.28M x 640 training features are 3.3 GB. Every fit starts from zero, so a
fit is a pure function of (data, lam): a rerun, or a brute-force search over the same grid, gives
the same weights.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch

from src.evaluation.probe_settings import MAX_ITER
from src.open_alip.zero_shot import prediction_metrics, top_predictions

# CLIP: "a hyperparameter sweep on the validation sets over the range between 10^-6 and 10^6, with 96
# logarithmically spaced steps", searched from [10^-6, 10^-4, ..., 10^6] by halving the interval
# around the peak down to 8 steps per decade. Index i is 10^(-6 + i/8).
LAMBDA_GRID: tuple[float, ...] = tuple(10.0 ** (-6 + i / 8) for i in range(97))
COARSE_STEP = 16  # 10^-6, 10^-4, ..., 10^6: every second decade
TOLERANCE = 1e-4  # scikit-learn's default tol: the largest gradient entry at which L-BFGS stops
HISTORY = 10  # scikit-learn's lbfgs (scipy's L-BFGS-B) keeps 10 correction pairs
_CHUNK_ELEMENTS = 1 << 24  # rows per chunk x max(classes, dim) <= this: 64 MB of float32 logits


@dataclass
class Rows:
    """Feature rows of one split: `features` [n, D] float32 and `labels` [n] int64 on one device;
    `mask` [n] bool picks the rows that count (a validation split held out of these), None: all."""

    features: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor | None = None

    @property
    def count(self) -> int:
        return int(self.mask.sum()) if self.mask is not None else len(self.labels)

    def masked(self, mask: torch.Tensor | None) -> Rows:
        return Rows(self.features, self.labels, mask)


def place(rows: Rows, device: torch.device | str) -> Rows:
    """`rows` for solving on `device`: copied there chunk by chunk (the source may be a memory-mapped
    file), or, where the device has no room for them, left on the host and streamed to the device
    chunk by chunk at every evaluation (slower, same numbers)."""
    device = torch.device(device)
    if rows.features.device == device:
        return rows
    try:
        features = torch.empty(rows.features.shape, dtype=torch.float32, device=device)
        for start, stop in _chunks(len(rows.labels), rows.features.shape[1]):
            features[start:stop] = rows.features[start:stop].to(device)
    except torch.OutOfMemoryError:
        return rows
    mask = rows.mask.to(device) if rows.mask is not None else None
    return Rows(features, rows.labels.to(device), mask)


def _chunks(count: int, width: int) -> Iterator[tuple[int, int]]:
    step = max(1024, _CHUNK_ELEMENTS // max(width, 1))
    for start in range(0, count, step):
        yield start, min(start + step, count)


def _batches(parts: Sequence[Rows], width: int, device: torch.device):
    """(features, labels, mask or None) chunks of every part, on `device`."""
    for part in parts:
        for start, stop in _chunks(len(part.labels), width):
            x = part.features[start:stop].to(device, non_blocking=True)
            y = part.labels[start:stop].to(device, non_blocking=True)
            m = part.mask[start:stop].to(device, non_blocking=True) if part.mask is not None else None
            yield x, y, m


@dataclass
class Fit:
    """A fitted classifier: `weight` [C, D], `bias` [C]; how the fit went."""

    lam: float
    weight: torch.Tensor
    bias: torch.Tensor
    loss: float  # the objective at the end
    iterations: int
    evaluations: int  # objective + gradient evaluations, line searches included
    seconds: float
    converged: bool  # the largest gradient entry reached the tolerance before max_iter

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight.t())


def fit_logistic(
    parts: Sequence[Rows],
    num_classes: int,
    lam: float,
    device: torch.device | str,
    max_iter: int = MAX_ITER,
    tolerance: float = TOLERANCE,
) -> Fit:
    """Minimise the objective (module doc) over the rows of `parts` with L-BFGS (strong-Wolfe line
    search), from zero weights, in float32 on `device`."""
    device = torch.device(device)
    width = parts[0].features.shape[1]
    n = sum(part.count for part in parts)
    if n == 0:
        raise ValueError("no rows to fit")
    # L-BFGS runs on v = weight / scale: the penalty's curvature lam / n would otherwise dwarf the
    # bias's (at most 1/4) by up to 10^5 at the top of the grid, more than float32 L-BFGS resolves;
    # scaled, both are near 1. The minimiser is the same.
    scale = 1.0 / math.sqrt(1.0 + lam / n)
    v = torch.zeros(num_classes, width, device=device, requires_grad=True)
    bias = torch.zeros(num_classes, device=device, requires_grad=True)
    optimizer = torch.optim.LBFGS(
        [v, bias],
        lr=1,
        max_iter=max_iter,
        tolerance_grad=tolerance,
        tolerance_change=1e-12,
        history_size=HISTORY,
        line_search_fn="strong_wolfe",
    )

    @torch.no_grad()
    def objective() -> torch.Tensor:
        weight = v * scale
        grad_w = torch.zeros_like(weight)
        grad_b = torch.zeros_like(bias)
        total = torch.zeros((), dtype=torch.float64, device=device)
        for x, y, m in _batches(parts, max(width, num_classes), device):
            logits = torch.addmm(bias, x, weight.t())
            lse = logits.logsumexp(dim=1)
            per_row = lse - logits.gather(1, y[:, None])[:, 0]
            # d CE / d logits = softmax - one_hot(y), per row
            delta = (logits - lse[:, None]).exp_()
            delta.scatter_add_(1, y[:, None], torch.full_like(per_row[:, None], -1.0))
            if m is not None:
                keep = m.to(torch.float32)
                per_row = per_row * keep
                delta.mul_(keep[:, None])
            total += per_row.sum(dtype=torch.float64)
            grad_w.addmm_(delta.t(), x)
            grad_b += delta.sum(dim=0)
        total = total / n + lam / (2 * n) * weight.double().square().sum()
        grad_w.div_(n).add_(weight, alpha=lam / n)
        v.grad = grad_w.mul_(scale)
        bias.grad = grad_b.div_(n)
        return total

    start = time.perf_counter()
    optimizer.step(objective)
    state = optimizer.state[v]
    final = objective()  # the objective and gradient where L-BFGS stopped
    converged = max(v.grad.abs().max().item(), bias.grad.abs().max().item()) <= tolerance
    return Fit(
        lam,
        (v * scale).detach(),
        bias.detach(),
        float(final),
        int(state.get("n_iter", 0)),
        int(state.get("func_evals", 0)),
        time.perf_counter() - start,
        converged,
    )


@torch.no_grad()
def score(parts: Sequence[Rows], fit: Fit, num_classes: int, device: torch.device | str) -> dict:
    """Top-1 / top-5 / mean per-class recall (%) of `fit` on the rows of `parts`, and their mean
    cross-entropy ("loss")."""
    device = torch.device(device)
    top1, topk, labels = [], [], []
    total = 0.0
    for x, y, m in _batches(parts, max(parts[0].features.shape[1], num_classes), device):
        if m is not None:
            x, y = x[m], y[m]
        logits = fit.logits(x)
        total += (
            (logits.logsumexp(dim=1) - logits.gather(1, y[:, None])[:, 0]).sum(dtype=torch.float64).item()
        )
        t1, tk = top_predictions(logits)
        top1.append(t1)
        topk.append(tk)
        labels.append(y.cpu())
    metrics = prediction_metrics(torch.cat(top1), torch.cat(topk), torch.cat(labels), num_classes)
    metrics["loss"] = total / max(1, sum(len(t) for t in top1))
    return metrics


def coarse_to_fine(
    evaluate: Callable[[int], tuple], size: int = len(LAMBDA_GRID), coarse: int = COARSE_STEP
) -> int:
    """The grid index CLIP's search settles on: the best of every `coarse`-th index (the last one
    included), then, with the step halved each round down to 1, the best of (peak - step, peak,
    peak + step). `evaluate(i)` returns a key to maximise; each index is evaluated once, and of
    equal keys the lower index wins. On a key that rises to one peak and then falls it finds that
    peak, as a brute-force search over every index does (tests/evaluation/test_logistic.py)."""
    seen: dict[int, tuple] = {}

    def best(indices: Sequence[int]) -> int:
        for i in indices:
            if i not in seen:
                seen[i] = evaluate(i)
        return max(sorted(set(indices)), key=lambda i: (seen[i], -i))

    peak = best(sorted({*range(0, size, coarse), size - 1}))
    step = coarse // 2
    while step >= 1:
        peak = best([max(peak - step, 0), peak, min(peak + step, size - 1)])
        step //= 2
    return peak


def sweep_key(metrics: dict, metric: str) -> tuple[float, float]:
    """What the search maximises: the dataset's metric on the validation rows, ties broken by the
    lower validation cross-entropy (a metric over a few hundred images ties often)."""
    return (round(metrics[metric], 9), -metrics["loss"])


def log_lambda(lam: float) -> str:
    return f"1e{math.log10(lam):+.3f}"
