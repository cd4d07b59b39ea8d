"""Checkpoint digests: one uint32 per array, written with a checkpoint and checked after every restore.

The digest of an array is ``sum(bits * (pos * K + 1)) mod 2**32`` over its elements: ``bits`` is the
element's bit pattern as an unsigned integer, ``pos`` its row-major position in the *logical* array (the
first ``rows`` rows of a row-padded table; padding rows are left out). Integer sums are exact in any order,
so the value is the same for any sharding, padding or layout the array is held in, and any changed, moved
or lost element changes it with probability about 1 - 2**-32.

Large arrays are digested one shard at a time, a chunk of rows at a time: XLA:CPU materialises the
bit-cast of whatever it reduces, so a whole-table digest would need a second table's worth of memory.
"""
from __future__ import annotations

from functools import partial
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

K = 2654435761  # Knuth's multiplicative hash constant: spreads positions over the 32 bits
CHUNK_BYTES = 32 << 20  # arrays larger than this are digested per shard, this many bytes at a time


def _bits(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.bool_:
        return x.astype(jnp.uint32)
    if x.dtype.itemsize == 8:  # two uint32 words per element: a trailing axis of 2
        return lax.bitcast_convert_type(x, jnp.uint32)
    unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}[x.dtype.itemsize]
    return lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


def _weighted(bits: jax.Array, start: Sequence[Any], shape: tuple[int, ...], rows: int | None) -> jax.Array:
    """The digest's sum over a block of ``bits`` whose first element sits at ``start`` in an array of
    ``shape`` (``start`` entries may be traced)."""
    if bits.ndim == 0:
        return bits
    shape = tuple(shape) + (2,) * (bits.ndim - len(shape))
    start = list(start) + [0] * (bits.ndim - len(start))
    pos = jnp.zeros(bits.shape, jnp.uint32)
    for d in range(bits.ndim):
        idx = lax.broadcasted_iota(jnp.uint32, bits.shape, d) + jnp.asarray(start[d]).astype(jnp.uint32)
        pos = pos * jnp.uint32(shape[d] % 2**32) + idx
    weight = pos * jnp.uint32(K) + jnp.uint32(1)
    if rows is not None:
        row = lax.broadcasted_iota(jnp.int32, bits.shape, 0) + jnp.asarray(start[0], jnp.int32)
        weight = jnp.where(row < rows, weight, jnp.uint32(0))
    return jnp.sum(bits * weight, dtype=jnp.uint32)


def digest(x: jax.Array, rows: int | None = None) -> jax.Array:
    """The digest of a whole array (its first ``rows`` rows when given), as a uint32 scalar."""
    x = jnp.asarray(x)
    return _weighted(_bits(x), (0,) * x.ndim, tuple(x.shape), rows)


@partial(jax.jit, static_argnames=("shape", "rows", "chunk"))
def _block_digest(block: jax.Array, start: jax.Array, *, shape: tuple, rows: int | None, chunk: int):
    """One shard's share, ``chunk`` rows at a time (only a chunk is ever bit-cast)."""
    n = block.shape[0]

    def body(i, acc):
        s = jnp.minimum(i * chunk, n - chunk)  # the last chunk overlaps its predecessor...
        bits = _bits(lax.dynamic_slice_in_dim(block, s, chunk, 0))
        fresh = lax.broadcasted_iota(jnp.int32, bits.shape, 0) + s >= i * chunk  # ...whose rows count once
        bits = jnp.where(fresh, bits, jnp.uint32(0))
        return acc + _weighted(bits, [start[0] + s, *[start[d] for d in range(1, block.ndim)]], shape, rows)

    return lax.fori_loop(0, -(-n // chunk), body, jnp.uint32(0))


_SMALL_FNS: dict[tuple, Any] = {}


def digests(info: Sequence[tuple[str, jax.Array, int | None]]) -> dict[str, int]:
    """{key: digest} for ``(key, array, logical rows or None)`` entries: small arrays in one jitted call,
    large ones shard by shard (summed over the processes when there are several)."""
    small = [(k, x, r) for k, x, r in info if x.ndim == 0 or x.nbytes <= CHUNK_BYTES]
    big = [(k, x, r) for k, x, r in info if not (x.ndim == 0 or x.nbytes <= CHUNK_BYTES)]
    limits = tuple(r for _, _, r in small)
    if limits not in _SMALL_FNS:
        _SMALL_FNS[limits] = jax.jit(lambda xs: [digest(x, r) for x, r in zip(xs, limits)])
    out = dict(zip([k for k, _, _ in small], map(int, jax.device_get(_SMALL_FNS[limits]([x for _, x, _ in small])))))
    parts = []
    for _, x, r in big:
        row_bytes = x.dtype.itemsize * int(np.prod(x.shape[1:]))
        shards = [s for s in x.addressable_shards if s.replica_id == 0]
        parts.append([_block_digest(s.data, np.array([i.start or 0 for i in s.index], np.int32), shape=tuple(x.shape),
                                    rows=r, chunk=max(1, min(CHUNK_BYTES // max(row_bytes, 1), s.data.shape[0])))
                      for s in shards])
    sums = np.array([sum(int(v) for v in jax.device_get(p)) % 2**32 for p in parts], np.uint64)
    if jax.process_count() > 1 and len(sums):
        from jax.experimental import multihost_utils

        sums = np.asarray(multihost_utils.process_allgather(sums)).sum(axis=0) % 2**32
    out.update({k: int(v) for (k, _, _), v in zip(big, sums)})
    return out
