"""Full-ranking metrics against hand-computed values."""
from __future__ import annotations

import math

import numpy as np
import pytest

from runner.tasks.sequential.metrics import hit_rate, mrr, ndcg, rank_of_target, ranking_report


def test_metrics_hand_computed():
    ranks = np.array([0, 3, 12])
    assert hit_rate(ranks, 10) == pytest.approx(2 / 3)
    assert ndcg(ranks, 10) == pytest.approx((1 + 1 / math.log2(5) + 0) / 3)
    assert mrr(ranks) == pytest.approx((1 + 1 / 4 + 1 / 13) / 3)
    assert hit_rate(ranks, 3) == pytest.approx(1 / 3)
    assert ndcg(ranks, 13) == pytest.approx((1 + 1 / math.log2(5) + 1 / math.log2(14)) / 3)
    report = ranking_report(ranks, ks=(10, 20))
    assert list(report) == ["hr@10", "ndcg@10", "hr@20", "ndcg@20", "mrr"]
    assert report["hr@10"] == pytest.approx(2 / 3) and report["hr@20"] == 1.0
    assert report["ndcg@10"] == pytest.approx((1 + 1 / math.log2(5)) / 3)
    assert report["mrr"] == pytest.approx((1 + 1 / 4 + 1 / 13) / 3)
    assert all(type(v) is float for v in report.values())
    assert set(ranking_report(ranks)) == {"hr@10", "ndcg@10", "mrr"}
    with pytest.raises(ValueError):
        ranking_report([])


def test_rank_of_target_basic_and_padding():
    #                    pad   1    2    3    4    5
    scores = np.array([[9.0, 0.1, 0.5, 0.3, 0.5, 0.2],
                       [9.0, 0.9, 0.1, 0.2, 0.3, 0.4]])
    # row 0, target 3 (0.3): items 2 and 4 higher -> 2; row 1, target 1 is the best -> 0.
    # Column 0 (padding) scores 9.0 but never counts.
    assert rank_of_target(scores, np.array([3, 1])).tolist() == [2, 0]
    assert rank_of_target(scores, np.array([5, 2])).tolist() == [3, 4]
    assert rank_of_target(scores, [3, 1]).dtype == np.int64


def test_rank_ties():
    scores = np.array([[0.0, 0.1, 0.5, 0.3, 0.5, 0.5]])  # target 2 ties with items 4 and 5
    assert rank_of_target(scores, [2]).tolist() == [2]  # pessimistic (default)
    assert rank_of_target(scores, [2], ties="optimistic").tolist() == [0]
    assert rank_of_target(scores, [2], ties="average").tolist() == [1.0]
    constant = np.zeros((1, 101))  # a degenerate model must not look perfect
    assert rank_of_target(constant, [7]).tolist() == [99]
    with pytest.raises(ValueError, match="ties"):
        rank_of_target(scores, [2], ties="random")


def test_rank_exclusion():
    scores = np.array([[0.0, 0.9, 0.5, 0.3, 0.8, 0.2]])
    exclude = np.array([[False, True, False, False, True, False]])  # items 1 and 4 already seen
    assert rank_of_target(scores, [3]).tolist() == [3]
    assert rank_of_target(scores, [3], exclude=exclude).tolist() == [1]  # only item 2 left above
    # the target is ranked even when its own column is set in the mask
    assert rank_of_target(scores, [4], exclude=exclude).tolist() == [0]  # item 1 excluded
    assert rank_of_target(scores, [4], exclude=exclude & False).tolist() == [1]
    with pytest.raises(ValueError, match="shape"):
        rank_of_target(scores, [3], exclude=exclude[:, :3])


def test_rank_nan_and_validation():
    scores = np.array([[0.0, np.nan, 0.5, 0.3], [0.0, 0.2, np.nan, 0.1]])
    # NaN is the worst score: NaN candidates never outrank; a NaN target gets the worst rank
    assert rank_of_target(scores, [3, 2]).tolist() == [1, 2]
    with pytest.raises(ValueError, match="1..3"):
        rank_of_target(scores, [0, 1])  # 0 is padding, not an item
    with pytest.raises(ValueError, match="1..3"):
        rank_of_target(scores, [4, 1])


def test_nan_is_the_worst_score_under_every_tie_rule():
    # item:            1       2       3     4     5
    scores = np.array([[0.0, np.nan, -np.inf, 0.5, np.nan, 0.1]])
    nan_target = {t: rank_of_target(scores, [1], ties=t).item() for t in ("pessimistic", "optimistic", "average")}
    # 3 candidates with a number outrank it; the other NaN (item 4) ties with it
    assert nan_target == {"pessimistic": 4, "optimistic": 3, "average": 3.5}
    # a -inf target: the numbers 0.5 and 0.1 outrank it, the NaNs rank below it
    assert rank_of_target(scores, [2], ties="pessimistic").item() == 2
    # excluded candidates take no part, NaN or not
    exclude = np.array([[False, False, False, True, True, False]])
    assert rank_of_target(scores, [1], exclude, ties="pessimistic").item() == 2
    # reference: NaN mapped below every number keeps the order of the numbers
    rng = np.random.default_rng(3)
    s = rng.integers(-3, 3, size=(32, 21)).astype(np.float64)
    s[rng.random(s.shape) < 0.3] = np.nan
    target = rng.integers(1, 21, 32)
    key = np.where(np.isnan(s), -1e9, s)
    for t in ("pessimistic", "optimistic", "average"):
        np.testing.assert_array_equal(rank_of_target(s, target, ties=t), rank_of_target(key, target, ties=t))


def test_rank_matches_argsort_on_random_scores():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=(16, 51))
    target = rng.integers(1, 51, 16)
    ranks = rank_of_target(scores, target)
    for b in range(16):
        order = np.argsort(-scores[b, 1:]) + 1
        assert ranks[b] == int(np.flatnonzero(order == target[b])[0])
