"""Exact duplicate rows of an interaction file: the same user, item and timestamp as an earlier row
(``data.duplicates``: drop them, or refuse the file)."""
from __future__ import annotations

import dataclasses

import numpy as np

from .records import Interactions

_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9))


def duplicate_rows(inter: Interactions) -> np.ndarray:
    """Increasing indices of the rows equal in user, item and timestamp to an earlier row (int64).

    A file without a timestamp column has none by this rule: its rows are ordered by their position, so a
    repeated (user, item) there is a repeat, not a copy. One sort of a 64-bit hash of every row finds the
    candidates (rows whose hash occurs twice); only those are compared exactly, so a file without
    duplicates costs one hash and one sort."""
    n = len(inter)
    if not inter.has_timestamp or n < 2:
        return np.zeros(0, np.int64)
    with np.errstate(over="ignore"):
        h = (inter.user.astype(np.uint64) * _MIX[0]) ^ (inter.item.astype(np.uint64) * _MIX[1]) \
            ^ (inter.timestamp.astype(np.uint64) * _MIX[2])
    s = np.sort(h)
    repeated = s[1:][s[1:] == s[:-1]]
    if repeated.size == 0:
        return np.zeros(0, np.int64)
    rows = np.flatnonzero(np.isin(h, repeated))
    u, i, t = inter.user[rows], inter.item[rows], inter.timestamp[rows]
    order = np.lexsort((rows, t, i, u))  # equal rows together, each group in file order
    same = (u[order][1:] == u[order][:-1]) & (i[order][1:] == i[order][:-1]) & (t[order][1:] == t[order][:-1])
    return np.sort(rows[order][1:][same])


def drop_duplicates(inter: Interactions) -> tuple[Interactions, np.ndarray]:
    """(``inter`` without the rows ``duplicate_rows`` finds, those rows' indices); the first of each kept."""
    dup = duplicate_rows(inter)
    if dup.size == 0:
        return inter, dup
    keep = np.ones(len(inter), bool)
    keep[dup] = False
    return dataclasses.replace(inter, user=inter.user[keep], item=inter.item[keep],
                               timestamp=inter.timestamp[keep],
                               rating=None if inter.rating is None else inter.rating[keep]), dup
