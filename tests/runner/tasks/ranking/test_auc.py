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
    with pytest.raises(ValueError):
        auc([0, 1], [0.1, float("nan")])


def test_random_scores_near_half_on_large_input():
    rng = np.random.default_rng(1)
    labels = rng.random(100_000) < 0.1
    assert abs(auc(labels, rng.random(100_000)) - 0.5) < 0.01
