"""The row layout with routed ids: each device's distinct ids go to the shard that owns their row.

Inside ``jax.shard_map`` (batch split over every mesh axis) a device dedupes its own tokens' ids, buckets them
by owning shard into ``[shards, C]`` slots (``optimizers.routing.bucket``, ``C = ctx.route_slots``) and an
all-to-all over the table axis sends every shard the ids it owns; the owner gathers those rows (lookup) or
sums the gradients it received and updates only its own rows (update), and a second all-to-all brings
looked-up rows back. Work and traffic per device grow with its own distinct ids, not with the data group's
batch. Ids past their slots are counted, never silently dropped: ``route_overflow="reroute"`` routes them in
further rounds of the same slots, ``"stop"`` reads zeros for them and refuses the update.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from .._lazy import jax, jnp, lax
from ..indexing import take_rows
from ..protocol import AsyncEmbGradientUpdate
from ..record import dedupe, device_record, num_unique_for, segment_rows, segment_sum, without_padding_id
from ..routing import Buckets, bucket, exchange, gather_over_data, route_peak, rounds_needed, to_tokens
from ..row_update import Touched, write_rows
from .base import ROUTE_METRICS, per_device_lookup, sharded_update
from .choices import Routing
from .row import RowLayout

if TYPE_CHECKING:
    from ..context import AsyncEmbContext

# Rows the routed owner's rule handles at a time: its owned rows come first in a static buffer sized for the
# capacity (every sender's slots), mostly padding at the default capacity; it skips chunks of padding only.
RULE_CHUNK = 1024


class RowRouted(RowLayout):
    """Rows split over the table axis, ids routed to their owner by all-to-all (the default row layout)."""

    name = "row_routed"
    routing = Routing.alltoall
    routes_to_owners = True
    per_device_record = True
    metrics = ROUTE_METRICS

    def sample_peak(self, ctx: AsyncEmbContext, rows: Any) -> int:
        """The most distinct ids one device sends one row shard for this batch of stored rows."""
        return route_peak(rows, ctx.mesh.size, ctx.shard_rows, ctx.table_shards)

    def lookup(self, ctx: AsyncEmbContext, table: jax.Array, ids: jax.Array, exact: bool = False,
               with_dedupe: bool = False) -> tuple:
        """Route each device's distinct ids to their owners and their rows back (``routed_lookup_local``);
        ``(overflow, peak)`` over the whole mesh (0 with ``exact``, which has room for every id)."""

        def per_device(table_shard, ids_local):
            rows, b, *dd = routed_lookup_local(ctx, table_shard, ids_local, exact, with_dedupe)
            if exact:  # room for every id: nothing overflows
                return rows, *dd, (jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
            return rows, *dd, (b.overflow, b.peak)  # already over the whole mesh

        return per_device_lookup(ctx, table, ids, per_device, with_dedupe)

    def update(self, opt: Any, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table: jax.Array,
               state: Any, gate: jax.Array) -> tuple:
        """Route each device's summed gradients to the owners of their rows; each owner updates its own rows.
        Records ``route_refused``: with ``"stop"`` the ids without a slot (summed over the senders), with
        ``"reroute"`` the rows past an owner's buffer (``ctx.owner_slots_for``, summed over the shards)."""
        return sharded_update(ctx, functools.partial(_kernel, opt, ctx), update, table, state, gate,
                              counts_refused=True)


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
    flat = ids.reshape(-1)
    n = flat.shape[0]
    unique, seg = dedupe(flat, ctx.stored_rows, num_unique_for(n, ctx.stored_rows), pad_id=None)  # bad ids: -1
    slots = ctx.slots_for(n, exact)
    b = bucket(ctx, unique, slots)
    width = ctx.emb_width

    def fetch(b: Buckets) -> jax.Array:  # [U, width]: the rows of the unique ids in b's slots; others zeros
        wanted = exchange(ctx, b.send)  # [shards, C]: rows other devices want from me
        rows = ctx.narrow(take_rows(table_shard, wanted)).astype(jnp.float32)
        got = exchange(ctx, rows).reshape(-1, width)  # [shards * C, width]: my ids' rows
        return take_rows(got, b.slot)

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
        return out, b, without_padding_id(unique, seg, ctx.stored_rows)
    return out, b


def _kernel(opt: Any, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table, state, gate, local: bool = True):
    """The routed per-device kernel: this device's unique ids and fp32 segment-summed gradients -> all-to-all
    to their owners -> the owner sums what every device sent for the same row -> rule on its own rows.

    ``local``: the record is per device (routed ``make_update``: this device's block of unique ids, its
    tokens' segment ids into it), used as it is. Otherwise it is a record of the whole batch (replicated
    ids): this device re-derives its tokens' ids and dedupes them first."""
    axis = ctx.table_axis
    n = update.segment_ids.shape[0]  # this device's tokens (ctx.local_tokens for a train batch's record)
    unique, seg = device_record(ctx, update, local)
    slots = ctx.slots_for(n)
    b = bucket(ctx, unique, slots)
    size = ctx.owner_slots_for(n)  # the owner's unique-row buffer

    def receive(b: Buckets, held=None):
        """-> the owner's (local rows [size], fp32 gradient sums [size, width], rows that did not fit, and under
        delay compensation the rows' w_then [size, width], else None). ``held``: what earlier rounds delivered
        (the same four); this round's rows are merged into it."""
        # Each token's gradient summed (fp32) straight into its unique id's send slot: one pass, no [U, width]
        # buffer to gather from. Padding tokens and ids without a slot this round land past the end: dropped.
        shards = b.send.shape[0]
        tok_slot = jnp.where(seg >= 0, take_rows(b.slot, jnp.maximum(seg, 0), shards * slots), -1)
        send_g = segment_sum(update.grads, tok_slot, shards * slots).reshape(shards, slots, -1)
        width = send_g.shape[-1]
        parts = [send_g]
        if ctx.compensates:  # each slot's w_then rides beside its gradient (one more row per sent id)
            parts.append(segment_rows(update.rows, tok_slot, shards * slots).reshape(shards, slots, -1))
        # One all-to-all carries them all: each slot's row number rides, bit for bit, as an extra float32 column.
        packed = jnp.concatenate([*parts, lax.bitcast_convert_type(b.send, jnp.float32)[..., None]], axis=-1)
        cols = len(parts) * width
        got = gather_over_data(ctx, exchange(ctx, packed)).reshape(-1, cols + 1)
        rows_in, g_in = lax.bitcast_convert_type(got[:, cols], jnp.int32), got[:, :width]
        w_in = got[:, width:cols] if ctx.compensates else None
        lost = jnp.zeros((), jnp.int32)
        if held is not None:
            rows_in, g_in = jnp.concatenate([held[0], rows_in]), jnp.concatenate([held[1], g_in])
            lost = held[2]
            if w_in is not None:
                w_in = jnp.concatenate([held[3], w_in])
        full = min(rows_in.shape[0], ctx.shard_rows) + 1  # every received slot, or every owned row
        local, oseg = dedupe(rows_in, ctx.shard_rows, full, pad_id=None)
        g_own = segment_sum(g_in, oseg, full)  # every sender's gradient for each owned row
        w_own = None if w_in is None else segment_rows(w_in, oseg, full)[:size]  # every sender read the same row
        # Owned rows come first (sorted, padding last): keep the first ``size``; any owned row past them is lost.
        lost = lost + jnp.sum(local[size:] < ctx.shard_rows).astype(jnp.int32)
        return local[:size], g_own[:size], lost, w_own

    if ctx.reroutes:
        # Rounds of the same slots until every id reached its owner: the first as usual, then (only when some
        # device has more ids for one shard than its slots; every device runs as many as the most crowded one
        # needs) the next slots of each run, merged into the owner's buffer. The table is written once, after
        # them (outside the loop: a scatter inside it would copy the table shard).
        rounds, _, _ = rounds_needed(ctx, b, slots)
        local, g_own, lost, then = lax.fori_loop(
            1, rounds, lambda r, held: receive(bucket(ctx, unique, slots, r * slots), held), receive(b))
    else:
        local, g_own, _, then = receive(b)
        refused = lax.psum(b.overflow, ctx.batch_axes)  # ids without a slot, counted at their senders
    owned = local < ctx.shard_rows
    gids = jnp.where(owned, local + lax.axis_index(axis) * ctx.shard_rows, ctx.stored_rows)
    if ctx.reroutes:  # rows an owner could not hold refuse the update whole: summed with the norm and the rule's check
        return write_rows(opt, ctx, Touched(gids, local, owned, g_own, then), table, state, gate, update.pending,
                          chunk=RULE_CHUNK, lost=lost)
    out = write_rows(opt, ctx, Touched(gids, local, owned, g_own, then), table, state, gate,
                     update.pending & (refused == 0), chunk=RULE_CHUNK)
    return (*out, refused)
