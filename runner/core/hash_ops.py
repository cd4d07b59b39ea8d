"""Array building blocks of the hash tables' step (``hash_tables.py``), apart from its policy: reading windows
of slots, the first lexicographic minimum of a row, and a branch whose arms update large arrays in place."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from optimizers.indexing import take_rows


def windows(win: jax.Array, used: jax.Array, *arrays: jax.Array) -> tuple[jax.Array, ...]:
    """Each array's values at the window slots ``win`` [N, window] (indices into the arrays; out of range:
    zeros): [N, window, ...], exact for the ids ``used`` [N] (bool) says are read.

    On a CPU a window that does not wrap is one contiguous slice, read as such (a slice per id, not an index
    per slot: about half the time of the per-slot gather); when a window of the batch wraps around its partition
    (rare with many slots, every step with few), every window is read slot by slot instead. Elsewhere every
    window is read slot by slot: a TPU runs a gather of slices as a loop of one dynamic slice per id (16,384
    windows of 1M slots' keys: 25 ms, against 1.1 ms slot by slot on a TPU v5e). Both read the same values for
    every used id, whose window lies in the arrays."""
    w = win.shape[1]

    def sliced(arrays):
        start = win[:, :1]
        dn = lambda a: lax.GatherDimensionNumbers(  # noqa: E731
            offset_dims=tuple(range(1, a.ndim + 1)), collapsed_slice_dims=(), start_index_map=(0,))
        return tuple(lax.gather(a, start, dn(a), (w, *a.shape[1:]), mode=lax.GatherScatterMode.CLIP)
                     for a in arrays)

    def by_slot(arrays):
        return tuple(take_rows(a, win) for a in arrays)

    def on_cpu(*arrays):
        wraps = jnp.any(used & (win[:, -1] - win[:, 0] != w - 1))
        return lax.cond(wraps, by_slot, sliced, arrays)

    return lax.platform_dependent(*arrays, cpu=on_cpu, default=lambda *arrays: by_slot(arrays))


def first_min(keys: list[jax.Array]) -> jax.Array:
    """Per row, the first index of the lexicographically smallest tuple of the given [N, P] int32 keys (one
    min per key and one for the index: no variadic argmax, which XLA:CPU does not vectorise)."""
    keep = jnp.ones(keys[0].shape, bool)
    big = jnp.iinfo(jnp.int32).max
    for k in keys:
        v = jnp.where(keep, k, big)
        keep &= v == jnp.min(v, axis=1, keepdims=True)
    iota = lax.broadcasted_iota(jnp.int32, keep.shape, 1)
    return jnp.min(jnp.where(keep, iota, keep.shape[1]), axis=1)


def either(pred: jax.Array, then: Any, otherwise: Any, ops: tuple) -> tuple:
    """``lax.cond(pred, then, otherwise, ops)`` for branches that update the large arrays ``ops`` (the slots'
    keys and metadata) in place and return them first, then other values: as two loops that run at most once
    each. XLA updates a loop's carried buffers in place, where a conditional's branches copy each buffer they
    update (XLA:CPU: three slot-sized copies a call, about 0.3 ms a step at a million slots)."""
    out = jax.eval_shape(then, ops)
    init = tuple(ops) + tuple(jnp.zeros(o.shape, o.dtype) for o in out[len(ops):])

    def once(go, fn, carry):
        return lax.while_loop(lambda c: c[0], lambda c: (jnp.bool_(False), fn(c[1][:len(ops)])), (go, carry))[1]

    return once(~pred, otherwise, once(pred, then, init))
