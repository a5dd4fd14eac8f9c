"""The paper protocol's solver and search (src/evaluation/logistic.py) on small generated features:
a linearly separable set is classified perfectly, CLIP's coarse-to-fine search lands where a
brute-force search over the same grid does, a fit is a pure function of its data and strength
(reruns, masks and chunking change nothing). Its agreement with scikit-learn's LogisticRegression
is checked in the CLIP_benchmark venv (tests/evaluation/test_linear_probe_cb.py)."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from src.evaluation import logistic
from src.evaluation.logistic import (
    COARSE_STEP,
    LAMBDA_GRID,
    Rows,
    coarse_to_fine,
    fit_logistic,
    place,
    score,
    sweep_key,
)


def _blobs(n: int, classes: int, dim: int, spread: float, seed: int) -> Rows:
    """L2-normalised Gaussian blobs around one random centre per class (the kind of features a probe gets)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=g)
    labels = torch.arange(n) % classes
    features = F.normalize(centres[labels] + spread * torch.randn(n, dim, generator=g), dim=-1)
    return Rows(features, labels)


def test_the_grid_is_clips():
    assert (
        len(LAMBDA_GRID) == 97
        and LAMBDA_GRID[0] == pytest.approx(1e-6)
        and LAMBDA_GRID[-1] == pytest.approx(1e6)
    )
    steps = [math.log10(b / a) for a, b in zip(LAMBDA_GRID, LAMBDA_GRID[1:])]
    assert all(s == pytest.approx(1 / 8) for s in steps)  # 8 per decade, 96 steps
    assert [round(math.log10(LAMBDA_GRID[i])) for i in range(0, 97, COARSE_STEP)] == [-6, -4, -2, 0, 2, 4, 6]


def test_a_linearly_separable_set_is_classified_perfectly():
    train, test = _blobs(120, 4, 16, 0.3, seed=1), _blobs(80, 4, 16, 0.3, seed=1)
    # the same centres (same seed), other noise draws for the test rows
    test = Rows(F.normalize(test.features + 0.01 * torch.randn(test.features.shape), dim=-1), test.labels)
    for lam in (1e-6, 1e-2, 1.0):
        fit = fit_logistic([train], 4, lam, "cpu")
        assert fit.converged and score([train], fit, 4, "cpu")["top1"] == 100.0
        assert score([test], fit, 4, "cpu")["top1"] == 100.0
    heavy = fit_logistic([train], 4, 1e6, "cpu")  # the penalty wins: weights near zero
    assert heavy.converged and heavy.weight.abs().max() < 1e-3


@settings(max_examples=200, deadline=None)
@given(size=st.integers(2, 120), peak=st.floats(0, 1), data=st.data())
def test_coarse_to_fine_finds_the_peak_of_a_unimodal_key(size, peak, data):
    """On any key that rises strictly to one peak and falls strictly after it, the search returns
    the brute-force argmax."""
    top = round(peak * (size - 1))
    rises = data.draw(st.lists(st.floats(0.01, 10), min_size=size, max_size=size))
    values = [0.0] * size
    for i in range(top - 1, -1, -1):
        values[i] = values[i + 1] - rises[i]
    for i in range(top + 1, size):
        values[i] = values[i - 1] - rises[i]
    calls = []

    def key(i):
        calls.append(i)
        return (values[i],)

    assert coarse_to_fine(key, size, coarse=16) == max(range(size), key=lambda i: values[i]) == top
    assert len(calls) == len(set(calls))  # each index evaluated once


def test_coarse_to_fine_evaluates_clips_points_first():
    calls = []
    coarse_to_fine(lambda i: calls.append(i) or (-abs(i - 37),))
    assert calls[:7] == [0, 16, 32, 48, 64, 80, 96]
    assert calls[7:] == [40, 36, 38, 37] or sorted(calls[7:]) == sorted(
        set(calls[7:])
    )  # then around the peak
    assert len(calls) <= 7 + 2 * 4


def test_the_sweep_picks_what_a_brute_force_search_picks():
    # overlapping classes whose validation top-1 rises to one plateau and falls (94, 96, then 94 to 90%),
    # the best strength inside the grid
    data = _blobs(200, 3, 8, 0.8, seed=5)
    val_mask = torch.arange(200) % 4 == 0
    train, val = data.masked(~val_mask), data.masked(val_mask)
    keys = {}

    def key(i):
        if i not in keys:
            fit = fit_logistic([train], 3, LAMBDA_GRID[i], "cpu", max_iter=200)
            keys[i] = sweep_key(score([val], fit, 3, "cpu"), "top1")
        return keys[i]

    chosen = coarse_to_fine(key)
    evaluated = len(keys)
    brute = max(range(len(LAMBDA_GRID)), key=lambda i: (key(i), -i))
    assert chosen == brute
    assert 0 < chosen < 96 and evaluated < 20  # an inner peak, found with a fraction of the fits


def test_a_fit_is_a_pure_function_of_its_rows_and_strength(monkeypatch):
    data = _blobs(150, 5, 12, 1.0, seed=2)
    mask = torch.arange(150) % 3 != 0
    first = fit_logistic([data.masked(mask)], 5, 1e-2, "cpu")
    again = fit_logistic([data.masked(mask)], 5, 1e-2, "cpu")
    assert torch.equal(first.weight, again.weight) and torch.equal(first.bias, again.bias)
    # the rows a mask leaves out play no part: the same fit as on the kept rows alone
    subset = fit_logistic([Rows(data.features[mask], data.labels[mask])], 5, 1e-2, "cpu")
    torch.testing.assert_close(subset.weight, first.weight, rtol=1e-4, atol=1e-5)
    # several parts, walked in chunks of a few rows, give the same minimiser as one piece
    monkeypatch.setattr(logistic, "_CHUNK_ELEMENTS", 16 * 12)
    halves = [
        Rows(data.features[:70], data.labels[:70], mask[:70]),
        Rows(data.features[70:], data.labels[70:], mask[70:]),
    ]
    chunked = fit_logistic(halves, 5, 1e-2, "cpu")
    torch.testing.assert_close(chunked.weight, first.weight, rtol=1e-3, atol=1e-4)
    assert score(halves, chunked, 5, "cpu")["top1"] == score([data.masked(mask)], first, 5, "cpu")["top1"]
    assert place(data, "cpu") is data  # on the CPU the rows (a memory map) stay where they are
