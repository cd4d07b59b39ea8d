"""Categorical values -> embedding rows, the two ways the field uses.

- **Hashing** (``HashIds(rows)``): ``row = 1 + mix(value) mod (rows - 1)`` per feature, each feature with its own
  row count; row 0 is the feature's missing value. ``mix`` is SplitMix64's finaliser, a fixed 64-bit mixing
  function, so the same value lands on the same row in every process and every run.
- **A vocabulary** (``VocabIds``): the values seen at least ``min_count`` times in the training split
  (``counts.npz``, written by the conversion) each get a row, 1..n in value order; every other value and the
  missing value share row 0 (the out-of-vocabulary row, as the MLPerf/TorchRec Criteo preprocessing maps rare
  values to one row). The vocabulary is saved beside the shards (``vocab_min<k>.npz``), so evaluation and a
  resumed run map exactly as training did.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from .tsv import NUM_CAT

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser of ``x`` (as uint64): a bijective 64-bit mix, so nearby values land far apart."""
    z = np.asarray(x).astype(np.uint64) + _GOLDEN
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniform(seed: int, stream: int, index: np.ndarray) -> np.ndarray:
    """A uniform [0, 1) number per ``index``, a pure function of (seed, stream, index) (the seeded split)."""
    key = mix64(np.uint64(seed) * np.uint64(1_000_003) + np.uint64(stream))
    return (mix64(np.asarray(index, np.uint64) ^ key) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def _missing(mask: np.ndarray) -> np.ndarray:
    """The ``missing`` bitmask of records -> bool ``[n, 26]``."""
    return ((np.asarray(mask, np.uint32)[:, None] >> np.arange(NUM_CAT, dtype=np.uint32)) & 1).astype(bool)


class HashIds:
    """``rows`` per feature (26 counts, each >= 2): a record's values -> rows by hashing."""

    def __init__(self, rows: Sequence[int]):
        rows = [int(r) for r in rows]
        if len(rows) != NUM_CAT or min(rows) < 2:
            raise ValueError(f"hash rows: {NUM_CAT} row counts >= 2, one per categorical feature (row 0 is the "
                             f"missing value); got {rows}")
        self.rows = np.asarray(rows, np.uint64)

    def __call__(self, cat: np.ndarray, missing: np.ndarray) -> np.ndarray:
        """int32 ``[n, 26]`` rows of uint32 values ``cat`` with the records' ``missing`` bitmask."""
        row = np.uint64(1) + mix64(cat) % (self.rows - np.uint64(1))
        return np.where(_missing(missing), 0, row).astype(np.int32)

    def table_rows(self) -> list[int]:
        return [int(r) for r in self.rows]


class VocabIds:
    """A saved vocabulary (``vocabulary``): a record's values -> rows (0 for rare, unseen and missing)."""

    def __init__(self, values: Sequence[np.ndarray], min_count: int):
        self.values, self.min_count = [np.asarray(v, np.uint32) for v in values], int(min_count)

    def __call__(self, cat: np.ndarray, missing: np.ndarray) -> np.ndarray:
        out = np.zeros(cat.shape, np.int32)
        for j, v in enumerate(self.values):
            pos = np.minimum(np.searchsorted(v, cat[:, j]), max(len(v) - 1, 0))
            hit = (v[pos] == cat[:, j]) if len(v) else np.zeros(len(cat), bool)
            out[:, j] = np.where(hit, pos + 1, 0)
        return np.where(_missing(missing), 0, out).astype(np.int32)

    def table_rows(self) -> list[int]:
        """Each feature's table size: its vocabulary plus the shared row 0."""
        return [len(v) + 1 for v in self.values]


def vocabulary_path(folder: str | Path, min_count: int) -> Path:
    return Path(folder) / f"vocab_min{int(min_count)}.npz"


def save_vocabulary(folder: str | Path, min_count: int) -> Path:
    """Derive the vocabulary of ``min_count`` from the folder's ``counts.npz`` and save it beside the shards."""
    folder = Path(folder)
    with np.load(folder / "counts.npz") as z:
        values = {f"values_{j}": z[f"values_{j}"][z[f"counts_{j}"] >= min_count] for j in range(NUM_CAT)}
    path = vocabulary_path(folder, min_count)
    tmp = path.with_name(path.name + ".partial")
    with open(tmp, "wb") as f:
        np.savez(f, **values)
    tmp.replace(path)
    return path


def vocabulary(folder: str | Path, min_count: int) -> VocabIds:
    """The saved vocabulary of ``min_count`` (derived from ``counts.npz`` and saved the first time)."""
    path = vocabulary_path(folder, min_count)
    if not path.exists():
        if not (Path(folder) / "counts.npz").exists():
            raise FileNotFoundError(f"{folder}: no counts.npz; convert the logs first (python -m runner.prepare)")
        save_vocabulary(folder, min_count)
    with np.load(path) as z:
        return VocabIds([z[f"values_{j}"] for j in range(NUM_CAT)], min_count)
