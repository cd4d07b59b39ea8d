"""The interaction records a file reader returns, and the error it raises for data it cannot use."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SUPPORTED_FORMATS = (
    "MovieLens u.data (ml-100k), ratings.dat (ml-1m/ml-10m), ratings.csv (ml-20m/25m/32m/latest), "
    "RecBole atomic .inter, or a Parquet/CSV/TSV file with a header naming user and item "
    "[, timestamp, rating] columns"
)


class DataError(ValueError):
    """Unreadable interaction data; the message is one line naming the file (and line)."""


@dataclass(frozen=True, eq=False)
class Interactions:
    """One row per interaction, in file order."""

    user: np.ndarray  # int64 raw ids (or codes into user_vocab)
    item: np.ndarray  # int64 raw ids (or codes into item_vocab)
    timestamp: np.ndarray  # int64 (seconds for MovieLens)
    rating: np.ndarray | None  # float32, None when the file has no rating column
    source: str  # the file that was read
    fmt: str  # one of: ml-100k, ml-dat, ml-csv, recbole, csv, parquet
    user_vocab: np.ndarray | None = None  # object array of the original string ids, if not integer
    item_vocab: np.ndarray | None = None
    has_timestamp: bool = True  # False: the file has no timestamp column (every timestamp is 0)

    def __len__(self) -> int:
        return int(self.user.shape[0])
