import math

import numpy as np
import pytest

from runner.tasks.ranking.auc import auc


def _brute_auc(labels, scores):
    pos = scores[labels == 1]
    neg = scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(20))
def test_matches_pairwise_reference_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    labels = rng.integers(0, 2, n)
    labels[0], labels[1] = 0, 1  # both classes present
    scores = rng.integers(0, 5, n).astype(np.float64)  # heavy ties
    if seed % 2:
        scores = scores + rng.standard_normal(n) * (rng.random(n) < 0.5)  # mix of tied and distinct
    assert auc(labels, scores) == pytest.approx(_brute_auc(labels, scores), abs=1e-12)


def test_label_dtypes_and_shapes():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, (10, 3))
    scores = rng.standard_normal((10, 3)).astype(np.float32)
    ref = _brute_auc(labels.ravel(), scores.ravel().astype(np.float64))
    for lab in (labels, labels.astype(bool), labels.astype(np.float32)):
        assert auc(lab, scores) == pytest.approx(ref)


def test_edge_cases():
    assert auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert auc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 0.0
    assert auc([0, 1, 0, 1], [7, 7, 7, 7]) == 0.5
    assert math.isnan(auc([1, 1, 1], [0.1, 0.2, 0.3]))
    assert math.isnan(auc([0, 0], [0.1, 0.2]))
    assert math.isnan(auc([], []))
    with pytest.raises(ValueError):
        auc([0, 1], [0.1, 0.2, 0.3])
    with pytest.raises(ValueError):
        auc([0, 2], [0.1, 0.2])
    assert auc([0, 1], [0.1, float("nan")]) == 0.0  # NaN is the lowest score, not an error


def _brute_auc_nan_lowest(labels, scores):
    """Pairwise wins with NaN below every number and tied with NaN."""
    wins = 0.0
    pos, neg = scores[labels == 1], scores[labels == 0]
    for p in pos:
        for q in neg:
            if np.isnan(p) and np.isnan(q):
                wins += 0.5
            elif np.isnan(q) or (not np.isnan(p) and p > q):
                wins += 1.0
            elif not np.isnan(p) and p == q:
                wins += 0.5
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(10))
def test_nan_scores_rank_lowest(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 40))
    labels = rng.integers(0, 2, n)
    labels[0], labels[1] = 0, 1
    scores = rng.integers(-2, 3, n).astype(np.float64)
    scores[rng.random(n) < 0.3] = np.nan
    scores[rng.random(n) < 0.1] = -np.inf  # NaN is below -inf too
    assert auc(labels, scores) == pytest.approx(_brute_auc_nan_lowest(labels, scores), abs=1e-12)
    assert auc([1, 0, 0], [np.nan, -np.inf, np.nan]) == 0.25  # loses to -inf, ties the other NaN


def test_random_scores_near_half_on_large_input():
    rng = np.random.default_rng(1)
    labels = rng.random(100_000) < 0.1
    assert abs(auc(labels, rng.random(100_000)) - 0.5) < 0.01
