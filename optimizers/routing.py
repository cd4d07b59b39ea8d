"""The collectives and bucketing the sharded layouts build on, host-side route sizing, and id permutation.

``bucket`` sorts a device's distinct ids by owning row shard into ``[shards, C]`` slots (``owner = id //
shard_rows``; sorted ids make each bucket a contiguous run), counting the ids that do not fit (overflow, never
silently dropped); ``rounds_needed`` says how many rounds of those slots route every id of the most crowded
device (``route_overflow="reroute"``); ``exchange`` is the all-to-all over the table axis and
``gather_over_data`` brings an owner the slots of every data group. The layouts that use them are
``optimizers.layouts.row_routed`` (ids routed to their owners) and ``optimizers.layouts.column`` (every shard
needs every id: the first ``C = ctx.slots_for(n)`` of a device's sorted distinct ids are exchanged).

``route_peak`` measures, on the host, the peak a layout's slots are sized from; ``permute_ids`` relabels ids so
the hot ids of a Zipf distribution spread over the row shards.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, NamedTuple

from ._lazy import jax, jnp, lax
from .indexing import take_rows
from .scopes import in_phase

if TYPE_CHECKING:
    from .context import AsyncEmbContext


class Buckets(NamedTuple):
    """One device's distinct ids bucketed by owning row shard (``bucket``)."""

    send: jax.Array  # int32 [shards, C]: local row numbers at each owner; shard_rows (out of range) = empty
    slot: jax.Array  # int32 [U]: each unique id's flat slot (shards * C when it has none)
    overflow: jax.Array  # int32: valid unique ids that did not fit their owner's slots
    peak: jax.Array  # int32: the most ids bound for one shard (the capacity this batch needed)


@in_phase("routing")
def bucket(ctx: AsyncEmbContext, unique: jax.Array, slots: int | None = None, offset: jax.Array | int = 0) -> Buckets:
    """Bucket sorted unique ids (padded with ``ctx.stored_rows``) by owning row shard, ``slots`` (default
    ``ctx.route_slots``) per shard. ``offset`` (may be traced): the slots hold each shard's ids from that
    position of its run on (a later round of a rerouted step); ``overflow`` and ``peak`` do not depend on it."""
    shards, rows = ctx.table_shards, ctx.shard_rows
    slots = ctx.route_slots if slots is None else slots
    bounds = jnp.arange(shards + 1, dtype=jnp.int32) * rows
    starts = jnp.searchsorted(unique, bounds, side="left").astype(jnp.int32)  # [shards + 1]
    counts = starts[1:] - starts[:-1]
    overflow = jnp.sum(jnp.maximum(counts - slots, 0)).astype(jnp.int32)
    j = jnp.arange(slots, dtype=jnp.int32) + offset  # positions in each shard's run this round sends
    index = starts[:-1, None] + j[None, :]
    filled = j[None, :] < counts[:, None]
    send = jnp.where(filled, take_rows(unique, index, ctx.stored_rows) - bounds[:-1, None], rows)
    owner = jnp.minimum(unique // rows, shards)
    pos = jnp.arange(unique.shape[0], dtype=jnp.int32) - starts[jnp.minimum(owner, shards - 1)] - offset
    slot = jnp.where((owner < shards) & (pos >= 0) & (pos < slots), owner * slots + pos, shards * slots)
    return Buckets(send, slot, overflow, jnp.max(counts).astype(jnp.int32))


@in_phase("routing")
def rounds_needed(ctx: AsyncEmbContext, b: Buckets, slots: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(rounds, overflow, peak)`` over the whole mesh (one all-gather): the rounds of ``slots`` per shard
    that route every id of the most crowded (device, shard) pair (1 when nothing overflows), the ids past
    the first round summed over devices, and the most ids one device has for one shard."""
    stats = lax.all_gather(jnp.stack([b.overflow, b.peak]), ctx.batch_axes)  # [devices, 2]
    overflow, peak = jnp.sum(stats[:, 0]), jnp.max(stats[:, 1])
    return jnp.maximum(-(-peak // slots), 1), overflow, peak


@in_phase("routing")
def exchange(ctx: AsyncEmbContext, x: jax.Array) -> jax.Array:
    """``[shards, C, ...]`` -> ``[shards, C, ...]``: slot block k goes to table shard k; block k of the
    result came from table shard k (all-to-all over the table axis)."""
    return lax.all_to_all(x, ctx.table_axis, split_axis=0, concat_axis=0, tiled=True)


def data_axes(ctx: AsyncEmbContext) -> tuple[str, ...]:
    """The mesh axes besides the table axis that hold more than one device."""
    return tuple(a for a in ctx.batch_axes if a != ctx.table_axis and ctx.mesh.shape[a] > 1)


@in_phase("routing")
def gather_over_table(ctx: AsyncEmbContext, x: jax.Array) -> jax.Array:
    """``[C, ...]`` -> ``[shards, C, ...]``: every table shard's ``x`` (all-gather over the table axis)."""
    return lax.all_gather(x, ctx.table_axis, axis=0)


@in_phase("routing")
def gather_over_data(ctx: AsyncEmbContext, x: jax.Array) -> jax.Array:
    """An owner's received slots from every data group (the table is replicated over the data axes)."""
    axes = data_axes(ctx)
    return lax.all_gather(x, axes, axis=0, tiled=True) if axes else x


def to_tokens(urows: jax.Array, seg: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """A device's unique rows ``[U, width]`` expanded to its tokens ``[*shape, width]`` (segment id -1: zeros)."""
    out = jnp.where((seg >= 0)[:, None], take_rows(urows, jnp.maximum(seg, 0)), 0)
    return out.reshape(*shape, urows.shape[1])


def route_peak(ids, devices: int, shard_rows: int, shards: int) -> int:
    """Host-side (numpy): the most distinct ids one device sends one row shard for a batch of stored-row ids
    (``[batch, ...]``, split over ``devices`` in contiguous blocks of the leading dim, as the train step
    splits it; ids outside the ``shards * shard_rows`` rows go nowhere). ``AsyncEmbContext.route_peak``.
    For the column layout, one "shard" of every row (``shard_rows=vocab, shards=1``): the most distinct ids
    one device holds."""
    import numpy as np  # noqa: PLC0415

    ids = np.asarray(ids)
    peak = 0
    for block in np.split(ids.reshape(ids.shape[0], -1), devices):
        u = np.unique(block)
        u = u[(u >= 0) & (u < shards * shard_rows)]
        if u.size:
            peak = max(peak, int(np.bincount(u // shard_rows, minlength=shards).max()))
    return peak


_MUL = (0x9E3779B1, 0x85EBCA77)  # odd multipliers (bijections modulo any power of two)


def _mixer(vocab: int):
    """(n, bits, shift) of ``permute_ids``' mixing function over ``[0, 2**bits)``; None when it is the identity."""
    n = vocab - 1
    if n <= 2:
        return None
    bits = (n - 1).bit_length()
    return n, bits, max(1, bits // 2)


@functools.lru_cache(maxsize=None)
def _compiled(relabel, vocab: int):
    """``relabel`` (``_permute`` or ``_unpermute``) for ``vocab``, jitted."""
    return jax.jit(functools.partial(relabel, vocab=vocab))


def _walk(ids: jax.Array, vocab: int, step) -> jax.Array:
    """Cycle-walk ``ids`` in ``[1, vocab)`` (0 and ids outside stay): apply ``step`` to ``id - 1`` until it falls
    back into ``[0, vocab - 1)``."""
    n = vocab - 1
    ids = jnp.asarray(ids).astype(jnp.int32)
    inside = (ids >= 1) & (ids < vocab)
    y = step(jnp.where(inside, ids - 1, 0).astype(jnp.uint32))
    y = lax.while_loop(lambda y: jnp.any(y >= n), lambda y: jnp.where(y >= n, step(y), y), y)
    return jnp.where(inside, y.astype(jnp.int32) + 1, ids)


def permute_ids(ids: jax.Array, vocab: int) -> jax.Array:
    """A fixed bijection of the ids ``[1, vocab)`` onto themselves (0, the padding id, and ids outside stay).

    Zipf-distributed ids put the hottest rows (the smallest ids) in the first row shard; after this
    relabelling, neighbouring ids land far apart, so every shard owns about as many hot rows. It is a
    multiply-xorshift permutation of ``[0, 2**b)`` (``2**b >= vocab - 1``), cycle-walked until it falls back
    into ``[0, vocab - 1)`` (about two rounds), so the table keeps its size and no row is shared.
    ``unpermute_ids`` is its inverse. Its loop runs until every id of ``ids`` is placed: on ids split over a
    mesh, call it per device (inside ``jax.shard_map``; ``runner.core.embeddings.stored_rows`` does).
    One compiled program per vocabulary and shape (called outside a trace, as on the host's sampled batches,
    it is not dispatched op by op).
    """
    return _compiled(_permute, vocab)(ids)


def _permute(ids: jax.Array, vocab: int) -> jax.Array:
    mixer = _mixer(vocab)
    if mixer is None:
        return jnp.asarray(ids).astype(jnp.int32)
    _, bits, shift = mixer
    mask = jnp.uint32((1 << bits) - 1)

    def mix(x):
        for m in _MUL:
            x = (x * jnp.uint32(m)) & mask
            x = x ^ (x >> shift)
        return x

    return _walk(ids, vocab, mix)


def unpermute_ids(rows: jax.Array, vocab: int) -> jax.Array:
    """The inverse of ``permute_ids``: the id whose relabelled row is ``rows`` (0 and rows outside stay).

    Each round of the mixing function is undone in reverse order (the xorshift by re-applying it until every
    bit is recovered, the multiply by the multiplier's inverse modulo ``2**b``); walking the inverse cycle
    until it falls into ``[0, vocab - 1)`` undoes the cycle walk.
    """
    return _compiled(_unpermute, vocab)(rows)


def _unpermute(rows: jax.Array, vocab: int) -> jax.Array:
    mixer = _mixer(vocab)
    if mixer is None:
        return jnp.asarray(rows).astype(jnp.int32)
    _, bits, shift = mixer
    mask = jnp.uint32((1 << bits) - 1)
    inverses = [pow(m % (1 << bits), -1, 1 << bits) for m in _MUL]

    def unmix(y):
        for inv in reversed(inverses):
            x = y
            for _ in range(-(-bits // shift)):  # x = y ^ (x >> shift), recovered shift bits per round
                x = y ^ (x >> shift)
            y = (x * jnp.uint32(inv)) & mask
        return y

    return _walk(rows, vocab, unmix)
