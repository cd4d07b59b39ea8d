"""Parsed columns -> :class:`~runner.tasks.sequential.records.Interactions`: ids (integers kept as-is, strings
coded 0..K-1 in order of first appearance), timestamps (floored to int64 seconds; dates become epoch seconds)
and ratings. A value that cannot be used raises ``_RowError`` with its 0-based row, which the reader turns
into a message naming the file's line."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .formats import _NUMBER
from .records import Interactions

_ISO_DATE = r"^\d{4}-\d{2}-\d{2}([T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?)?(Z|[+-]\d{2}:?\d{2})?$"


class _RowError(Exception):
    def __init__(self, row: int, reason: str):
        super().__init__(reason)
        self.row, self.reason = row, reason


def _first_true(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _ids(col: pa.ChunkedArray, name: str) -> tuple[np.ndarray, np.ndarray | None]:
    t = col.type
    if pa.types.is_dictionary(t):
        col = col.cast(t.value_type)
        t = col.type
    if col.null_count:
        raise _RowError(_first_true(col.is_null().to_numpy(zero_copy_only=False)), f"{name} is missing")
    if pa.types.is_integer(t):
        return col.to_numpy().astype(np.int64, copy=False), None
    if pa.types.is_floating(t):
        x = col.to_numpy()
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(x) | (x != np.floor(x))
        if bad.any():
            r = _first_true(bad)
            raise _RowError(r, f"{name} id must be an integer, got {float(x[r])!r}")
        # A float64 holds every integer exactly only below 2**53: past it, distinct ids would become one.
        inexact = np.abs(x) >= 2.0 ** 53
        if inexact.any():
            raise _RowError(_first_true(inexact), (
                f"{name} id {x[_first_true(inexact)]:.0f} cannot be read exactly: the {name} column holds a value "
                f"that is not a plain integer (a decimal such as '1.0', or one outside int64), so the whole column "
                f"is read as 64-bit floats, which keep integers exact only below 2**53 and would merge distinct ids. "
                f"Write every {name} id as a plain integer within int64, or as text in a column that holds letters "
                f"too (Parquet: a string column)"))
        return x.astype(np.int64), None
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        empty = pc.equal(pc.utf8_trim_whitespace(col) if not pa.types.is_binary(t) else col,
                         "" if not pa.types.is_binary(t) else b"")
        empty = empty.to_numpy(zero_copy_only=False)
        if empty.any():
            raise _RowError(_first_true(empty), f"{name} id is empty")
        enc = pc.dictionary_encode(col.combine_chunks())
        codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        vocab = np.asarray(enc.dictionary.to_pylist(), dtype=object)
        return codes, vocab
    raise _RowError(0, f"{name} column has unsupported type {t}")


def _timestamps(col: pa.ChunkedArray) -> np.ndarray:
    t = col.type
    if col.null_count:
        raise _RowError(_first_true(col.is_null().to_numpy(zero_copy_only=False)), "timestamp is missing")
    if pa.types.is_integer(t):
        x = col.to_numpy()
        if x.dtype == np.uint64 and (x >= np.uint64(2**63)).any():  # would wrap to negative seconds as int64
            r = _first_true(x >= np.uint64(2**63))
            raise _RowError(r, f"timestamp must be a finite int64-range number, got {int(x[r])}")
        return x.astype(np.int64, copy=False)
    if pa.types.is_floating(t):
        x = col.to_numpy()
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(x) | (np.abs(x) >= 2.0 ** 63)
        if bad.any():
            r = _first_true(bad)
            raise _RowError(r, f"timestamp must be a finite int64-range number, got {float(x[r])!r}")
        return np.floor(x).astype(np.int64)
    if pa.types.is_timestamp(t):  # floored to seconds, as a float's: 0.5 s past a second is that second
        per_second = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[t.unit]
        return np.floor_divide(col.cast(pa.int64()).to_numpy(), per_second)
    if pa.types.is_date(t):
        return col.cast(pa.timestamp("s")).cast(pa.int64()).to_numpy()
    if pa.types.is_string(t) or pa.types.is_large_string(t):  # numbers or dates written as text (Parquet)
        text = pc.utf8_trim_whitespace(col)
        numeric = pc.match_substring_regex(text, _NUMBER.pattern).to_numpy(zero_copy_only=False)
        if numeric.all():
            return _timestamps(pc.cast(text, pa.float64()))
        dated = pc.match_substring_regex(text, _ISO_DATE).to_numpy(zero_copy_only=False)
        for zone in (None, "UTC") if dated.all() else ():  # without a zone, then with one (Z, +01:00)
            try:
                return _timestamps(pc.cast(text, pa.timestamp("s", tz=zone)).cast(pa.timestamp("s")))
            except pa.ArrowInvalid:
                pass  # an ISO-looking value that is no date (2020-13-45), or zones on some values: named below
        if numeric.any() and dated.any():
            r = _first_true(numeric != numeric[0])
            raise _RowError(r, f"timestamp column mixes numbers and dates (the first row holds "
                               f"{col[0].as_py()!r}, this one {col[r].as_py()!r}): write every timestamp one way")
        bad = ~numeric & ~dated
        r = _first_true(bad) if bad.any() else 0
        raise _RowError(r, f"timestamp must be a number (seconds) or an ISO 8601 date/time such as 2020-01-31 or "
                           f"2020-01-31T12:00:00, got {col[r].as_py()!r}")
    raise _RowError(0, f"timestamp column has non-numeric type {t}")


def _rating(col: pa.ChunkedArray) -> np.ndarray:
    if col.null_count:
        raise _RowError(_first_true(col.is_null().to_numpy(zero_copy_only=False)), "rating is missing")
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        raise _RowError(0, f"rating column has non-numeric type {col.type}")
    return col.to_numpy().astype(np.float32)


def _table_to_interactions(table: pa.Table, roles: dict, path: Path, fmt: str) -> Interactions:
    user, user_vocab = _ids(table.column(roles["user"]), "user")
    item, item_vocab = _ids(table.column(roles["item"]), "item")
    if "timestamp" in roles:
        ts = _timestamps(table.column(roles["timestamp"]))
    else:
        ts = np.zeros(len(user), np.int64)
    rating = _rating(table.column(roles["rating"])) if "rating" in roles else None
    return Interactions(user=user, item=item, timestamp=ts, rating=rating, source=str(path), fmt=fmt,
                        user_vocab=user_vocab, item_vocab=item_vocab, has_timestamp="timestamp" in roles)
