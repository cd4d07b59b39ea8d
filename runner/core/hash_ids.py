"""Raw ids on the host: ``fingerprint`` turns a batch of raw ids (64-bit integers, strings or bytes) into the
uint32 (high, low) halves a hash table's step takes (``hash_tables.keys_of``).

One id has one fingerprint whatever array holds it: an integer is its own 64 bits in an int64, a uint64 or an
object array (a pandas column of Python ints); a string is an 8-byte blake2b of its UTF-8 bytes, and bytes are
hashed as they are, so ``"abc"`` and ``b"abc"`` are one id. Id 0, the empty string and empty bytes are padding.
Anything else (floats, booleans, None, an integer outside 64 bits) is refused with a ``TypeError`` naming it
and where it is, rather than hashed by its printed form.
"""
from __future__ import annotations

import hashlib
from typing import Any

import numpy as np

_LOW, _HIGH = -(1 << 63), (1 << 64) - 1  # the integers a 64-bit id can be: int64's and uint64's together


def _digest(b: bytes) -> int:
    """The 64-bit hash of a string's (UTF-8) or bytes id's bytes; 0 (padding) for empty ones."""
    return int.from_bytes(hashlib.blake2b(b, digest_size=8).digest(), "little") if b else 0


def _one(v: Any, i: int) -> tuple[int, bool]:
    """(64 bits, hashed) of the element at flat index ``i`` of an object array."""
    if isinstance(v, (bool, np.bool_)) or v is None or not isinstance(v, (int, np.integer, str, bytes)):
        raise TypeError(f"raw ids must be integers or strings, not {type(v).__name__} ({v!r} at index {i})")
    if isinstance(v, str):
        return _digest(v.encode()), bool(v)
    if isinstance(v, bytes):
        return _digest(v), bool(v)
    if not _LOW <= int(v) <= _HIGH:
        raise TypeError(f"raw id {int(v)} at index {i} does not fit in 64 bits (ids are int64 or uint64 values)")
    return int(v) & _HIGH, False


def fingerprint(ids: Any) -> np.ndarray:
    """uint32 [..., 2] (high, low) of raw ids (module docstring): int64 ids as their own 64 bits, strings and
    bytes by an 8-byte blake2b. Id 0 and the empty string are padding (0, 0); an id that would fingerprint to
    (0, 0) otherwise (string hashes only) becomes 1."""
    a = np.asarray(ids)
    if a.dtype.kind in "iu":
        u = a.astype(np.int64).view(np.uint64)
    elif a.dtype.kind in "USO":
        if a.dtype.kind == "O":
            pairs = [_one(v, i) for i, v in enumerate(a.reshape(-1))]
        else:
            pairs = [((_digest(v.encode()) if isinstance(v, str) else _digest(v)), bool(v)) for v in a.reshape(-1)]
        u = np.asarray([p for p, _ in pairs], np.uint64).reshape(a.shape)
        hashed = np.asarray([h for _, h in pairs], bool).reshape(a.shape)
        u = np.where(hashed & (u == 0), np.uint64(1), u)
    else:
        raise TypeError(f"raw ids must be integers or strings, not {a.dtype}")
    return np.stack([(u >> np.uint64(32)).astype(np.uint32), (u & np.uint64(0xFFFFFFFF)).astype(np.uint32)], -1)
