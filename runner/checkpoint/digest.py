"""Checkpoint digests: one uint32 per array, written with a checkpoint and checked after every restore.

The digest of an array (scheme 2, checkpoints of meta format 2) is ``sum(mix(bits ^ where(pos))) mod 2**32``
over its elements:

- ``bits``: the element's bit pattern as an unsigned 32-bit integer (1- and 2-byte dtypes zero-extended,
  8-byte dtypes as two 32-bit words, each an element of a trailing axis of 2);
- ``where(pos)``: a hash of the element's index in the *logical* array (the first ``rows`` rows of a
  row-padded table and the first ``cols`` columns of one stored wider than its rows, ``stored_width``; padding
  rows and columns are left out), one ``mix`` round per axis;
- ``mix``: the murmur3 finaliser (xor-shifts and multiplications by odd constants), a bijection of uint32.

What that guarantees, and what it does not:

- Any change confined to one 32-bit word (any bit or bits of one element of a dtype up to 4 bytes, e.g. a
  sign flip anywhere) always changes the digest: the word's term ``mix(bits ^ where)`` is a bijection of
  ``bits``, so it changes, and so does the sum mod 2**32 (``tests/runner/checkpoint/test_digest.py`` flips
  every bit of every element of small f32, bf16 and int32 arrays).
- Moved, swapped, lost or several changed elements change it unless the changes cancel in the sum, which
  for this hash-like mix happens about once in 2**32, as for any 32-bit checksum; it is a guard against
  corruption, not against an adversary.

Integer sums are exact in any order, so the value is the same for any sharding, padding or layout the array
is held in. Large arrays are digested one shard at a time, a chunk of rows at a time: XLA:CPU materialises the
bit-cast of whatever it reduces, so a whole-table digest would need a second table's worth of memory.

Scheme 1 (meta format 1, ``sum(bits * (pos * K + 1))``) is kept only to verify checkpoints written with it:
its weights are even at odd positions, so a flip of the top bit there left it unchanged.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

SCHEME = 2  # the digest new checkpoints are written with
SCHEMES = (1, 2)  # the digests checkpoints can be verified with
K = 2654435761  # Knuth's multiplicative hash constant (odd): spreads indices over the 32 bits
SEED = 0x9E3779B9
CHUNK_BYTES = 32 << 20  # arrays larger than this are digested per shard, this many bytes at a time


def _bits(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if x.dtype.itemsize == 8:  # two uint32 words per element: a trailing axis of 2
        return lax.bitcast_convert_type(x, jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    return lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def mix(h: jax.Array) -> jax.Array:
    """murmur3's 32-bit finaliser: invertible (each step is), so distinct inputs give distinct outputs."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _index(bits: jax.Array, start: Sequence[Any], d: int) -> jax.Array:
    """The global index along axis ``d`` of a block starting at ``start``, shaped to broadcast (1, .., n, .., 1)."""
    shape = [1] * bits.ndim
    shape[d] = bits.shape[d]
    return lax.broadcasted_iota(jnp.uint32, shape, d) + jnp.asarray(start[d]).astype(jnp.uint32)


def _terms(bits: jax.Array, start: Sequence[Any], shape: tuple[int, ...], scheme: int) -> jax.Array:
    """Each element's term of the digest, for a block of ``bits`` whose first element sits at ``start`` in an
    array of ``shape`` (``start`` entries may be traced)."""
    if scheme == 1:
        pos = jnp.zeros((1,) * bits.ndim, jnp.uint32)
        for d in range(bits.ndim):
            pos = pos * jnp.uint32(shape[d] % 2**32) + _index(bits, start, d)
        return bits * (pos * jnp.uint32(K) + jnp.uint32(1))
    where = jnp.full((1,) * bits.ndim, SEED, jnp.uint32)
    for d in range(bits.ndim):  # per axis (small arrays until the last axes): no 2**32 wrap of a flat position
        where = mix(where + _index(bits, start, d) * jnp.uint32(K))
    return mix(bits ^ where)


def _block_sum(bits: jax.Array, start: Sequence[Any], shape: tuple[int, ...], rows: int | None, scheme: int,
               keep: jax.Array | None = None, cols: int | None = None) -> jax.Array:
    """The digest's sum over a block (rows at or past ``rows``, columns at or past ``cols``, and where ``keep``
    is False, left out)."""
    if bits.ndim == 0:
        return bits if scheme == 1 else mix(bits ^ jnp.uint32(SEED))
    shape = tuple(shape) + (2,) * (bits.ndim - len(shape))
    start = list(start) + [0] * (bits.ndim - len(start))
    terms = _terms(bits, start, shape, scheme)
    if rows is not None:
        real = _index(bits, start, 0) < jnp.uint32(rows)
        keep = real if keep is None else keep & real
    if cols is not None:
        real = _index(bits, start, 1) < jnp.uint32(cols)
        keep = real if keep is None else keep & real
    if keep is not None:
        terms = jnp.where(keep, terms, jnp.uint32(0))
    return jnp.sum(terms, dtype=jnp.uint32)


def digest(x: jax.Array, rows: int | None = None, scheme: int = SCHEME, cols: int | None = None) -> jax.Array:
    """The digest of a whole array (its first ``rows`` rows and ``cols`` columns when given), as a uint32 scalar."""
    x = jnp.asarray(x)
    return _block_sum(_bits(x), (0,) * x.ndim, tuple(x.shape), rows, scheme, cols=cols)


@partial(jax.jit, static_argnames=("shape", "rows", "chunk", "scheme", "cols"))
def _block_digest(block: jax.Array, start: jax.Array, *, shape: tuple, rows: int | None, chunk: int, scheme: int,
                  cols: int | None = None):
    """One shard's share, ``chunk`` rows at a time (only a chunk is ever bit-cast)."""
    n = block.shape[0]

    def body(i, acc):
        s = jnp.minimum(i * chunk, n - chunk)  # the last chunk overlaps its predecessor...
        bits = _bits(lax.dynamic_slice_in_dim(block, s, chunk, 0))
        fresh = lax.broadcasted_iota(jnp.int32, (chunk,) + (1,) * (bits.ndim - 1), 0) + s >= i * chunk  # ...once
        return acc + _block_sum(bits, [start[0] + s, *[start[d] for d in range(1, block.ndim)]], shape, rows,
                                scheme, keep=fresh, cols=cols)

    return lax.fori_loop(0, -(-n // chunk), body, jnp.uint32(0))


_SMALL_FNS: dict[tuple, Any] = {}


def digests(info: Sequence[tuple], scheme: int = SCHEME) -> dict[str, int]:
    """{key: digest} for ``(key, array, logical rows or None[, logical columns or None])`` entries: small arrays
    in one jitted call, large ones shard by shard (summed over the processes when there are several)."""
    if scheme not in SCHEMES:
        raise ValueError(f"unknown digest scheme {scheme!r}; this runner knows {SCHEMES}")
    info = [(k, x, r, *(rest or (None,))) for k, x, r, *rest in info]
    small = [e for e in info if e[1].ndim == 0 or e[1].nbytes <= CHUNK_BYTES]
    big = [e for e in info if not (e[1].ndim == 0 or e[1].nbytes <= CHUNK_BYTES)]
    limits = tuple((r, c) for _, _, r, c in small)
    if (limits, scheme) not in _SMALL_FNS:
        _SMALL_FNS[limits, scheme] = jax.jit(lambda xs: [digest(x, r, scheme, c) for x, (r, c) in zip(xs, limits)])
    fn = _SMALL_FNS[limits, scheme]
    out = dict(zip([e[0] for e in small], map(int, jax.device_get(fn([e[1] for e in small])))))
    parts = []
    for _, x, r, c in big:
        row_bytes = x.dtype.itemsize * int(np.prod(x.shape[1:]))
        shards = [s for s in x.addressable_shards if s.replica_id == 0]
        parts.append([_block_digest(s.data, np.array([i.start or 0 for i in s.index], np.int32), shape=tuple(x.shape),
                                    rows=r, chunk=max(1, min(CHUNK_BYTES // max(row_bytes, 1), s.data.shape[0])),
                                    scheme=scheme, cols=c)
                      for s in shards])
    sums = np.array([sum(int(v) for v in jax.device_get(p)) % 2**32 for p in parts], np.uint64)
    if jax.process_count() > 1 and len(sums):
        from jax.experimental import multihost_utils

        sums = np.asarray(multihost_utils.process_allgather(sums)).sum(axis=0) % 2**32
    out.update({e[0]: int(v) for e, v in zip(big, sums)})
    return out
