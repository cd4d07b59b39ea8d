"""Id routing for the row layout (each table shard sees only the ids it owns); the column layout's exchange.

Inside ``jax.shard_map`` (batch split over every mesh axis), a device

1. dedupes its own tokens' ids (static size ``ctx.local_unique``, sorted);
2. buckets them by owning shard (``owner = id // shard_rows``; sorted ids make each bucket a contiguous
   run) into ``[shards, C]`` slots, ``C = ctx.route_slots``; ids that do not fit are counted (overflow),
   never silently dropped. With ``ctx.route_overflow="reroute"`` (the default) a step where any device
   overflows routes the rest in further rounds of the same slots (a ``lax.fori_loop`` that runs zero times
   on a usual step; every device runs as many rounds as the most crowded one needs, read from one
   all-gather of the counts), so only that step pays, and no buffer grows; with ``"stop"`` ids without a
   slot read zeros, the update refuses itself and the runner stops the run;
3. ``all_to_all`` over the table axis sends every shard the ids it owns (as local row numbers);

the owner gathers those rows (lookup) or segment-sums the gradients it received and updates only its own
rows (``optimizers.fused``); a second ``all_to_all`` brings looked-up rows back, and each device expands
its unique rows to its tokens. Work and traffic per device grow with its own distinct ids, not with the
data group's batch.

The column layout (``column_lookup_local``; its update is ``optimizers.fused._apply_columns``) has no owners
to route to: every shard needs every id. It exchanges the first ``C = ctx.slots_for(n)`` of a device's sorted
distinct ids (the sampled peak of distinct ids one device holds times ``route_capacity``) instead of its
whole unique buffer, with the same overflow policy: ``reroute`` exchanges every device's whole buffer on a
step where any device has more (``lax.cond`` on the overflow summed over the mesh), ``stop`` reads zeros for
the ids past C and refuses the update.
"""
from __future__ import annotations

from typing import NamedTuple

from ._lazy import jax, jnp, lax
from .context import AsyncEmbContext


class Buckets(NamedTuple):
    send: jax.Array  # int32 [shards, C]: local row numbers at each owner; shard_rows (out of range) = empty
    slot: jax.Array  # int32 [U]: each unique id's flat slot (shards * C when it has none)
    overflow: jax.Array  # int32: valid unique ids that did not fit their owner's slots
    peak: jax.Array  # int32: the most ids bound for one shard (the capacity this batch needed)


def bucket(ctx: AsyncEmbContext, unique: jax.Array, slots: int | None = None, offset: jax.Array | int = 0) -> Buckets:
    """Bucket sorted unique ids (padded with ``ctx.vocab``) by owning row shard, ``slots`` (default
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
    send = jnp.where(filled, unique.at[index].get(mode="fill", fill_value=ctx.vocab) - bounds[:-1, None], rows)
    owner = jnp.minimum(unique // rows, shards)
    pos = jnp.arange(unique.shape[0], dtype=jnp.int32) - starts[jnp.minimum(owner, shards - 1)] - offset
    slot = jnp.where((owner < shards) & (pos >= 0) & (pos < slots), owner * slots + pos, shards * slots)
    return Buckets(send, slot, overflow, jnp.max(counts).astype(jnp.int32))


def rounds_needed(ctx: AsyncEmbContext, b: Buckets, slots: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(rounds, overflow, peak)`` over the whole mesh (one all-gather): the rounds of ``slots`` per shard
    that route every id of the most crowded (device, shard) pair (1 when nothing overflows), the ids past
    the first round summed over devices, and the most ids one device has for one shard."""
    stats = lax.all_gather(jnp.stack([b.overflow, b.peak]), ctx.batch_axes)  # [devices, 2]
    overflow, peak = jnp.sum(stats[:, 0]), jnp.max(stats[:, 1])
    return jnp.maximum(-(-peak // slots), 1), overflow, peak


def exchange(ctx: AsyncEmbContext, x: jax.Array) -> jax.Array:
    """``[shards, C, ...]`` -> ``[shards, C, ...]``: slot block k goes to table shard k; block k of the
    result came from table shard k (all-to-all over the table axis)."""
    return lax.all_to_all(x, ctx.table_axis, split_axis=0, concat_axis=0, tiled=True)


def data_axes(ctx: AsyncEmbContext) -> tuple[str, ...]:
    """The mesh axes besides the table axis that hold more than one device."""
    return tuple(a for a in ctx.batch_axes if a != ctx.table_axis and ctx.mesh.shape[a] > 1)


def gather_over_data(ctx: AsyncEmbContext, x: jax.Array) -> jax.Array:
    """An owner's received slots from every data group (the table is replicated over the data axes)."""
    axes = data_axes(ctx)
    return lax.all_gather(x, axes, axis=0, tiled=True) if axes else x


def token_ids(ctx: AsyncEmbContext, unique: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """Per-token ids from an update record's (unique ids, segment ids); padding tokens get ``ctx.vocab``."""
    return jnp.where(segment_ids < 0, ctx.vocab, unique.at[jnp.maximum(segment_ids, 0)].get(
        mode="fill", fill_value=ctx.vocab))


def without_padding_id(unique: jax.Array, seg: jax.Array, vocab: int, pad_id: int = 0):
    """A dedupe that kept ``pad_id`` (the smallest id: the first entry when present) -> the same dedupe
    without it (``dedupe(..., pad_id=pad_id)``): it is dropped, the rest shift down, padding tokens get -1."""
    has = unique[0] == pad_id
    unique = jnp.where(has, jnp.concatenate([unique[1:], jnp.full((1,), vocab, unique.dtype)]), unique)
    seg = jnp.where((seg < 0) | (has & (seg == 0)), -1, seg - has.astype(seg.dtype))
    return unique, seg


def to_tokens(urows: jax.Array, seg: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """A device's unique rows ``[U, width]`` expanded to its tokens ``[*shape, width]`` (segment id -1: zeros)."""
    out = jnp.where((seg >= 0)[:, None], urows.at[jnp.maximum(seg, 0)].get(mode="fill", fill_value=0), 0)
    return out.reshape(*shape, urows.shape[1])


def routed_lookup_local(ctx: AsyncEmbContext, table_shard: jax.Array, ids: jax.Array, exact: bool = False,
                        with_dedupe: bool = False):
    """Per-device body of the routed lookup: ids [...] -> (rows [..., width] float32, ``Buckets``, whose
    ``overflow`` and ``peak`` are over the whole mesh unless ``exact``). Sizes follow ``ids`` (an evaluation
    batch may differ from the train batch); ``exact``: room for every id. ``with_dedupe``: also this
    device's (unique ids, segment ids) without the padding id 0, what a per-device update record of these
    tokens holds (``make_update``), so the train step dedupes once.

    With ``route_overflow="reroute"`` the routing runs in rounds of the same slots until every id is
    fetched: the first round as usual, then (a ``lax.fori_loop`` that runs zero times unless some device has
    more ids for one shard than its slots) each round sends each shard the next slots of the ids it owns.
    Every device runs as many rounds as the most crowded one needs (``rounds_needed``), so their collectives
    match."""
    from .fused import dedupe  # noqa: PLC0415 - fused imports this module
    from .context import num_unique_for  # noqa: PLC0415

    flat = ids.reshape(-1)
    n = flat.shape[0]
    unique, seg = dedupe(flat, ctx.vocab, num_unique_for(n, ctx.vocab), pad_id=None)  # bad ids: -1
    slots = ctx.slots_for(n, exact)
    b = bucket(ctx, unique, slots)
    width = table_shard.shape[1]

    def fetch(b: Buckets) -> jax.Array:  # [U, width]: the rows of the unique ids in b's slots; others zeros
        wanted = exchange(ctx, b.send)  # [shards, C]: rows other devices want from me
        rows = table_shard.at[wanted].get(mode="fill", fill_value=0).astype(jnp.float32)
        got = exchange(ctx, rows).reshape(-1, width)  # [shards * C, width]: my ids' rows
        return got.at[b.slot].get(mode="fill", fill_value=0)

    if exact:
        urows = fetch(b)
    else:
        rounds, overflow, peak = rounds_needed(ctx, b, slots)
        b = b._replace(overflow=overflow, peak=peak)
        urows = fetch(b)  # ids past the slots read zeros: with "stop" the step reports them, the update refuses
        if ctx.reroutes:  # the next slots of each shard's run, round after round, only when some device needs it
            urows = lax.fori_loop(1, rounds, lambda r, acc: acc + fetch(bucket(ctx, unique, slots, r * slots)), urows)
    out = to_tokens(urows, seg, ids.shape)
    if with_dedupe:
        return out, b, without_padding_id(unique, seg, ctx.vocab)
    return out, b


def past_exchange(ctx: AsyncEmbContext, unique: jax.Array, slots: int) -> tuple[jax.Array, jax.Array]:
    """Column layout: ``(distinct, overflow)``, a device's distinct ids in its sorted unique buffer (padded with
    ``ctx.vocab``) and how many of them are past the first ``slots`` it exchanges."""
    distinct = jnp.sum(unique < ctx.vocab).astype(jnp.int32)
    return distinct, jnp.maximum(distinct - slots, 0)


def column_lookup_local(ctx: AsyncEmbContext, table_shard: jax.Array, ids: jax.Array, exact: bool = False,
                        with_dedupe: bool = False):
    """Per-device body of the column layout's lookup: ids [...] -> rows [..., width] float32. The device dedupes
    its ids (sorted, distinct ids first, padding ``ctx.vocab`` after them); every shard of its table group gets
    the first C of them (all-gather, ``C = ctx.slots_for(n)``) and gathers its width slice of each, and an
    all-to-all returns each device the slices of its own rows. Ids past C (``overflow``) are counted: with
    ``ctx.route_overflow="reroute"`` a step where any device has some exchanges every device's whole buffer
    instead (``lax.cond`` on the overflow summed over the mesh, so every device takes the same branch); with
    ``"stop"`` they read zeros. ``exact``: the whole buffer, nothing can overflow.

    Returns ``(rows, (overflow, peak))`` (this device's ids past C, and its distinct ids: the C this batch
    needed), and with ``with_dedupe`` ``(rows, (overflow, peak), (unique ids, segment ids))``: the device's
    dedupe without the padding id 0, its update record's (``make_update``)."""
    from .fused import dedupe  # noqa: PLC0415 - fused imports this module
    from .context import num_unique_for  # noqa: PLC0415

    flat = ids.reshape(-1)
    n = flat.shape[0]
    unique, seg = dedupe(flat, ctx.vocab, num_unique_for(n, ctx.vocab), pad_id=None)  # bad ids: -1
    size = unique.shape[0]
    slots = ctx.slots_for(n, exact)
    distinct, overflow = past_exchange(ctx, unique, slots)

    def fetch(c: int) -> jax.Array:  # [U, width]: the first c unique ids' rows; the rest zeros
        wanted = lax.all_gather(unique[:c], ctx.table_axis, axis=0)  # [shards, c]: every table-group device's ids
        part = table_shard.at[wanted].get(mode="fill", fill_value=0).astype(jnp.float32)  # [shards, c, width / shards]
        got = exchange(ctx, part)  # [shards, c, width / shards]: block k is shard k's slice of my rows
        urows = jnp.moveaxis(got, 0, 1).reshape(c, -1)  # [c, width]: slices in column order
        return jnp.pad(urows, ((0, size - c), (0, 0)))

    if exact or not ctx.column_capped_for(n):  # room for every distinct id: the whole buffer, as it is
        urows = fetch(size)
    elif ctx.reroutes:  # every device takes the same branch: the test is on the overflow summed over the mesh
        rerouted = lax.psum(overflow, ctx.batch_axes) > 0
        urows = lax.cond(rerouted, lambda: fetch(size), lambda: fetch(slots))
    else:
        urows = fetch(slots)  # ids past the exchange read zeros (counted: the runner stops)
    out = to_tokens(urows, seg, ids.shape)
    if with_dedupe:
        return out, (overflow, distinct), without_padding_id(unique, seg, ctx.vocab)
    return out, (overflow, distinct)


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
    """
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
