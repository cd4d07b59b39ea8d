"""Host-side evaluation metrics (pure numpy)."""
from __future__ import annotations

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC by the Mann-Whitney rank statistic, tied scores getting their average rank.

    Equals P(score of a random positive > score of a random negative) + 0.5 * P(tie). ``labels`` holds 0/1
    (bool, int or float) and ``scores`` any real values, same number of elements (both are flattened).
    Returns nan when there are no positives or no negatives. O(n log n).

    NaN scores are the lowest score, below every number (``-inf`` included) and tied with each other: a
    positive scored NaN loses to every negative with a number, so a model emitting NaN scores is ranked
    as badly as its NaNs deserve instead of failing the evaluation.
    """
    labels = np.asarray(labels).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if labels.shape != scores.shape:
        raise ValueError(f"labels and scores differ in size: {labels.size} vs {scores.size}")
    if labels.dtype != np.bool_:
        if not np.all((labels == 0) | (labels == 1)):
            raise ValueError("labels must be 0/1")
        labels = labels.astype(bool)
    n = labels.size
    n_pos = int(np.count_nonzero(labels))
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    nan = np.isnan(scores)
    key = np.where(nan, -np.inf, scores)
    order = np.lexsort((key, ~nan))  # NaNs first (lowest), then the numbers in increasing order
    s, s_nan = key[order], nan[order]
    # Tie groups in the sorted scores: group g spans [starts[g], ends[g]); its members all get the mean of
    # the 1-based ranks starts[g]+1 .. ends[g], i.e. (starts[g] + 1 + ends[g]) / 2.
    boundary = np.flatnonzero((s[1:] != s[:-1]) | (s_nan[1:] != s_nan[:-1])) + 1
    starts = np.concatenate(([0], boundary))
    ends = np.concatenate((boundary, [n]))
    group_rank = (starts + 1 + ends) / 2.0
    ranks = np.repeat(group_rank, ends - starts)
    rank_sum_pos = ranks[labels[order]].sum()
    u = rank_sum_pos - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))
