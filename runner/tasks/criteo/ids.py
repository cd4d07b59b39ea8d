"""Categorical values -> embedding rows, the two ways the field uses.

Every table has the same three kinds of row: row 0 pads a bag (an empty slot of a multi-hot feature; a zero
row the fused update never touches, as a padding id everywhere in this runner), row 1 is the feature's
missing value (and, under a vocabulary, every rare or unseen value), learned like any other row, and rows 2
onwards hold values.

- **Hashing** (``HashIds(rows)``): ``row = 2 + mix(value) mod (rows - 2)`` per feature, each feature with its own
  row count. ``mix`` is SplitMix64's finaliser, a fixed 64-bit mixing function, so the same value lands on the
  same row in every process and every run; distinct values may share a row (a collision), as hashing does.
- **A vocabulary** (``VocabIds``): the values seen at least ``min_count`` times in the training split
  (``counts.npz``, written by the conversion) each get a row, 2..n+1 in value order; every other value shares
  row 1 with the missing value (one out-of-vocabulary row, as the MLPerf/TorchRec Criteo preprocessing maps
  rare values to one row). The vocabulary is saved beside the shards (``vocab_min<k>.npz``), so evaluation
  and a resumed run map exactly as training did; a folder that cannot be written gets it derived again at each
  start, the same rows.

Both map a record's ``cat`` slots and ``count`` (``prepare.record_dtype``) to int32 rows of the same shape:
feature ``j``'s slots past its count get row 0, and a missing feature's first slot row 1.
"""
from __future__ import annotations

import functools
import logging
import os
import secrets
from pathlib import Path
from typing import Sequence

import numpy as np

from .tsv import NUM_CAT, ONE_HOT, offsets

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser of ``x`` (as uint64): a bijective 64-bit mix, so nearby values land far apart."""
    z = np.asarray(x).astype(np.uint64)  # a copy (0-d for a scalar): array arithmetic wraps without a warning
    z += _GOLDEN
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def uniform(seed: int, stream: int, index: np.ndarray) -> np.ndarray:
    """A uniform [0, 1) number per ``index``, a pure function of (seed, stream, index) (the seeded split)."""
    key = mix64(np.uint64(seed) * np.uint64(1_000_003) + np.uint64(stream))
    return (mix64(np.asarray(index, np.uint64) ^ key) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


PADDING, MISSING, FIRST = 0, 1, 2  # the rows every table has (see the module's docstring)


@functools.lru_cache(maxsize=16)
def _slots(bags: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(the feature of each slot, its place in the feature's bag) for ``bags``."""
    start = offsets(bags)
    feature = np.repeat(np.arange(NUM_CAT), np.diff(start))
    return feature, np.arange(len(feature)) - start[feature]


def _place(rows: np.ndarray, count: np.ndarray, bags) -> np.ndarray:
    """Value rows ``[n, sum(bags)]`` -> the records' rows: 0 past each feature's count, 1 in a missing
    feature's first slot."""
    feature, slot = _slots(tuple(bags))
    count = np.asarray(count)
    if len(feature) == NUM_CAT:  # one value a feature (one-hot): count is 0 (missing) or 1
        return np.where(count > 0, rows, MISSING).astype(np.int32)
    count = count[:, feature]
    out = np.where(slot < count, rows, PADDING)
    return np.where((count == 0) & (slot == 0), MISSING, out).astype(np.int32)


class HashIds:
    """``rows`` per feature (26 counts, each >= 3): a record's values -> rows by hashing."""

    def __init__(self, rows: Sequence[int], bags=ONE_HOT):
        rows = [int(r) for r in rows]
        if len(rows) != NUM_CAT or min(rows) < FIRST + 1:
            raise ValueError(f"hash rows: {NUM_CAT} row counts >= {FIRST + 1}, one per categorical feature (rows 0 "
                             f"and 1 are padding and the missing value); got {rows}")
        self.rows, self.bags = np.asarray(rows, np.uint64), tuple(bags)
        self.slot_rows = np.repeat(self.rows, np.diff(offsets(self.bags)))

    def __call__(self, cat: np.ndarray, count: np.ndarray) -> np.ndarray:
        """int32 rows of the records' uint32 ``cat`` slots ``[n, sum(bags)]`` with their ``count`` ``[n, 26]``."""
        row = np.uint64(FIRST) + mix64(cat) % (self.slot_rows - np.uint64(FIRST))
        return _place(row.astype(np.int64), count, self.bags)

    def table_rows(self) -> list[int]:
        return [int(r) for r in self.rows]


class VocabIds:
    """A saved vocabulary (``vocabulary``): a record's values -> rows (1 for rare, unseen and missing)."""

    def __init__(self, values: Sequence[np.ndarray], min_count: int, bags=ONE_HOT):
        self.values, self.min_count = [np.asarray(v, np.uint32) for v in values], int(min_count)
        self.bags = tuple(bags)

    def __call__(self, cat: np.ndarray, count: np.ndarray) -> np.ndarray:
        start = offsets(self.bags)
        out = np.zeros(cat.shape, np.int64)
        for j, v in enumerate(self.values):
            c = cat[:, start[j]:start[j + 1]]
            pos = np.minimum(np.searchsorted(v, c), max(len(v) - 1, 0))
            hit = (v[pos] == c) if len(v) else np.zeros(c.shape, bool)
            out[:, start[j]:start[j + 1]] = np.where(hit, pos + FIRST, MISSING)
        return _place(out, count, self.bags)

    def table_rows(self) -> list[int]:
        """Each feature's table size: its vocabulary plus the padding and the shared out-of-vocabulary row."""
        return [len(v) + FIRST for v in self.values]


def vocabulary_path(folder: str | Path, min_count: int) -> Path:
    return Path(folder) / f"vocab_min{int(min_count)}.npz"


def derive_vocabulary(folder: str | Path, min_count: int) -> dict[str, np.ndarray]:
    """The vocabulary of ``min_count`` (``values_<j>``: feature j's values), from the folder's ``counts.npz``."""
    with np.load(Path(folder) / "counts.npz") as z:
        return {f"values_{j}": z[f"values_{j}"][z[f"counts_{j}"] >= min_count] for j in range(NUM_CAT)}


def save_vocabulary(folder: str | Path, min_count: int, values: dict[str, np.ndarray] | None = None) -> Path:
    """Save the vocabulary of ``min_count`` (derived from the folder's ``counts.npz`` unless given) beside the
    shards."""
    values = derive_vocabulary(folder, min_count) if values is None else values
    path = vocabulary_path(folder, min_count)
    # a name of its own: processes deriving it at once (a run's processes, two runs) write the same bytes apart,
    # and the last rename wins, where one shared name mixed their writes
    tmp = path.with_name(f"{path.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
    try:
        with open(tmp, "xb") as f:  # the user's umask, as the shards have
            np.savez(f, **values)
        tmp.replace(path)
    except BaseException:  # a full disk: no half file left beside the shards
        if tmp.exists():
            tmp.unlink()
        raise
    return path


def vocabulary(folder: str | Path, min_count: int, bags=ONE_HOT) -> VocabIds:
    """The saved vocabulary of ``min_count``, derived from ``counts.npz`` the first time and saved beside the
    shards; in a folder that cannot be written, derived at every start instead (the same rows: it is a pure
    function of ``counts.npz``)."""
    path = vocabulary_path(folder, min_count)
    if not path.exists():
        if not (Path(folder) / "counts.npz").exists():
            raise FileNotFoundError(f"{folder}: no counts.npz; convert the logs first (python -m runner.prepare)")
        values = derive_vocabulary(folder, min_count)
        try:
            save_vocabulary(folder, min_count, values)
        except OSError as e:  # a read-only folder (or disk): an intact one, so the run goes on
            logging.getLogger("runner").info(
                "the vocabulary of data.min_count=%d is not saved into %s (%s: %s): derived from counts.npz at each "
                "start instead", min_count, folder, type(e).__name__, e)
            return VocabIds([values[f"values_{j}"] for j in range(NUM_CAT)], min_count, bags)
    with np.load(path) as z:
        return VocabIds([z[f"values_{j}"] for j in range(NUM_CAT)], min_count, bags)
