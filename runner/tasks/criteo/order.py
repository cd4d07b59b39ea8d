"""The training order: which example each position of each epoch reads, without storing a permutation.

Position ``g`` of the run (``step * batch_size + i``) reads example ``shuffled(g mod N)`` of epoch ``g // N``,
``shuffled`` being a keyed Feistel permutation of ``[0, N)`` (cycle-walking on the next power of 4): O(batch)
work and no memory however large N is, a pure function of (seed, epoch, position). So the reader's position is
the step itself: a run resumed from a checkpoint (on any mesh) or relaunched after a kill reads exactly the
examples an uninterrupted run would, and each process computes only its own rows of each batch.
"""
from __future__ import annotations

import numpy as np

from .ids import mix64

ROUNDS = 4


def _feistel(x: np.ndarray, half: int, keys: np.ndarray) -> np.ndarray:
    mask = np.uint64((1 << half) - 1)
    left, right = x >> np.uint64(half), x & mask
    for k in keys:
        left, right = right, left ^ (mix64(right ^ k) & mask)
    return (left << np.uint64(half)) | right


def shuffled(index: np.ndarray, n: int, seed: int, epoch: np.ndarray) -> np.ndarray:
    """The example at each ``index`` (in ``[0, n)``) of a seeded permutation of ``[0, n)`` per ``epoch``."""
    index = np.asarray(index, np.uint64)
    half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    epoch = np.broadcast_to(np.asarray(epoch, np.uint64), index.shape)
    out = np.empty(index.shape, np.uint64)
    for e in np.unique(epoch):  # a batch spans at most two epochs
        sel = epoch == e
        keys = mix64(np.uint64(seed) * np.uint64(0x100000001B3) + e * np.uint64(ROUNDS) + np.arange(ROUNDS, dtype=np.uint64))
        y = _feistel(index[sel], half, keys)
        while True:  # cycle-walk back into [0, n): a permutation of [0, 4^half) restricted to [0, n)
            out_of_range = y >= np.uint64(n)
            if not out_of_range.any():
                break
            y[out_of_range] = _feistel(y[out_of_range], half, keys)
        out[sel] = y
    return out.astype(np.int64)


def positions(step: int, batch_size: int, shard: int, num_shards: int) -> np.ndarray:
    """The run positions of rows ``[shard*B/n, (shard+1)*B/n)`` of step ``step``'s global batch."""
    per = batch_size // num_shards
    return np.int64(step) * batch_size + shard * per + np.arange(per, dtype=np.int64)


def examples(step: int, batch_size: int, n: int, seed: int, shard: int = 0, num_shards: int = 1) -> np.ndarray:
    """The training examples of this process's rows of step ``step``'s global batch."""
    g = positions(step, batch_size, shard, num_shards)
    return shuffled(g % n, n, seed, g // n)
