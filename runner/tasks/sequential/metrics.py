"""Full-ranking metrics (numpy): the target is ranked against every item 1..N.

Column 0 of the score matrix is the padding item and never takes part. Ranks are 0-based: rank 0
means no candidate item outranks the target.

Ties (``ties=``): ``"pessimistic"`` (default) counts every other candidate with the target's score
as ranked above it, so a model that scores everything equally gets the worst rank rather than the
best; ``"optimistic"`` counts only strictly higher scores; ``"average"`` is the mean of the two
(a float rank, the expected rank under a random tie-break).

Exclusion: items with ``exclude[b, i] = True`` (e.g. already-seen history) never outrank the
target. The target itself is never excluded, even if it is set in the mask.

NaN scores: NaN is the worst score, below every number (``-inf`` included), so a broken score can
never help an item. A NaN candidate never outranks a target with a number; a NaN target is outranked
by every candidate with a number and ties with the other NaN candidates, so under the default
``"pessimistic"`` ties it gets the worst rank (the number of other non-excluded candidates), under
``"optimistic"`` the number of candidates with a number, under ``"average"`` the mean of the two.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

__all__ = ["rank_of_target", "hit_rate", "ndcg", "mrr", "ranking_report"]


def rank_of_target(scores, target, exclude=None, *, ties: str = "pessimistic") -> np.ndarray:
    """0-based rank of ``target[b]`` among items 1..N of ``scores[b]`` ([B, N+1]).

    Returns int64 [B] (float64 for ``ties="average"``). Accepts anything ``np.asarray`` takes
    (numpy or JAX arrays).
    """
    if ties not in ("pessimistic", "optimistic", "average"):
        raise ValueError(f"ties must be 'pessimistic', 'optimistic' or 'average', got {ties!r}")
    scores = np.asarray(scores)
    target = np.asarray(target).astype(np.int64).reshape(-1)
    if scores.ndim != 2:
        raise ValueError(f"scores must be [B, N+1], got shape {scores.shape}")
    b, n1 = scores.shape
    if target.shape[0] != b:
        raise ValueError(f"target has {target.shape[0]} rows, scores {b}")
    if n1 < 2:
        raise ValueError("scores need at least one real item column besides padding column 0")
    if b and (target.min() < 1 or target.max() >= n1):
        raise ValueError(f"targets must be item ids in 1..{n1 - 1}, got range "
                         f"[{target.min()}, {target.max()}]")
    rows = np.arange(b)
    cand = np.ones((b, n1), bool)
    cand[:, 0] = False
    if exclude is not None:
        exclude = np.asarray(exclude, bool)
        if exclude.shape != scores.shape:
            raise ValueError(f"exclude must have the scores' shape {scores.shape}, got {exclude.shape}")
        cand &= ~exclude
    cand[rows, target] = False  # the target is not its own competitor (and is never excluded)
    t = scores[rows, target][:, None]
    # NaN is the worst score: below every number, equal to another NaN.
    nan = np.isnan(scores) if np.issubdtype(scores.dtype, np.floating) else np.zeros(scores.shape, bool)
    target_nan = nan[rows, target][:, None]
    higher = np.count_nonzero(cand & ~nan & ((scores > t) | target_nan), axis=1)
    equal = np.count_nonzero(cand & np.where(target_nan, nan, scores == t), axis=1)
    if ties == "pessimistic":
        ranks = higher + equal
    elif ties == "optimistic":
        ranks = higher
    else:
        ranks = higher + equal / 2.0
    return ranks.astype(np.float64 if ties == "average" else np.int64)


def _ranks(ranks) -> np.ndarray:
    r = np.asarray(ranks, np.float64).reshape(-1)
    if r.size == 0:
        raise ValueError("no ranks to average")
    return r


def hit_rate(ranks, k: int) -> float:
    """Fraction of targets ranked in the top k (rank < k)."""
    return float(np.mean(_ranks(ranks) < k))


def ndcg(ranks, k: int) -> float:
    """Mean of 1/log2(rank+2) for rank < k, else 0 (one relevant item, so IDCG = 1)."""
    r = _ranks(ranks)
    return float(np.mean(np.where(r < k, 1.0 / np.log2(r + 2.0), 0.0)))


def mrr(ranks) -> float:
    """Mean of 1/(rank+1) over all targets (no cutoff)."""
    return float(np.mean(1.0 / (_ranks(ranks) + 1.0)))


def ranking_report(ranks, ks: Iterable[int] = (10,)) -> dict:
    """``{'hr@k': ..., 'ndcg@k': ... for k in ks, 'mrr': ...}`` as Python floats."""
    r = _ranks(ranks)
    out = {}
    for k in ks:
        out[f"hr@{k}"] = hit_rate(r, k)
        out[f"ndcg@{k}"] = ndcg(r, k)
    out["mrr"] = mrr(r)
    return out
