"""The column layout: each table shard owns ``width // shards`` columns of every row (``P(None, table_axis)``).

As TorchRec's column-wise sharding (``cw_sharding.py``). Each device dedupes its own tokens; the ids go to
every shard of its table group (all-gather) and each shard returns (lookup) or receives (update) only its
width slice of those rows (all-to-all), so nothing per token crosses devices. Only the first
``ctx.slots_for(n)`` of a device's sorted distinct ids are exchanged: ``route_capacity`` times ``route_peak``,
the most distinct ids one device held in sampled train batches; without a ``route_peak`` the whole buffer. A
device with more distinct ids follows ``route_overflow``: ``reroute`` exchanges every device's whole buffer
that step (``lax.cond`` on the overflow summed over the mesh), ``stop`` reads zeros for the ids past it and
refuses the update.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from .._lazy import P, jax, jnp, lax
from ..indexing import take_rows
from ..protocol import AsyncEmbGradientUpdate
from ..record import dedupe, device_record, num_unique_for, segment_rows, segment_sum, without_padding_id
from ..routing import exchange, gather_over_data, gather_over_table, route_peak, to_tokens
from ..row_update import Touched, write_rows
from .base import ROUTE_METRICS, Layout, per_device_lookup, sharded_update
from .choices import TableLayout

if TYPE_CHECKING:
    from ..context import AsyncEmbContext


class Column(Layout):
    """Every shard holds a width slice of every row; the ids are exchanged, the rows' slices travel."""

    name = "column"
    table_layout = TableLayout.column
    splits_width = True
    per_device_record = True
    metrics = ROUTE_METRICS

    def table_spec(self, ctx: AsyncEmbContext) -> Any:
        """Columns split over the table axis."""
        return P(None, ctx.table_axis)

    def state_leaf_spec(self, ctx: AsyncEmbContext, leaf: Any) -> Any:
        """Per-element state is split by width like its table; per-row scalars (an accumulator, a step count)
        are replicated over the table axis, where every shard holds every row."""
        ndim = len(getattr(leaf, "shape", ()))
        return P(None, ctx.table_axis, *([None] * (ndim - 2))) if ndim >= 2 else P()

    def most_slots(self, ctx: AsyncEmbContext, tokens: int) -> int:
        """Its distinct ids (``min(tokens, rows)``, the unique buffer less its padding slot): every shard holds
        every row, so no shard's row count bounds them. Slots are ``route_capacity`` times ``route_peak`` (the
        most distinct ids one device held in the sampled batches, scaled to ``tokens``), at least
        ``route_min_slots``, at most this."""
        return max(1, min(tokens, ctx.stored_rows))

    def exchanges_all(self, ctx: AsyncEmbContext) -> bool:
        """Without a ``route_peak`` there is no even share to guess from: the whole buffer is exchanged."""
        return ctx.route_peak is None

    def slot_base(self, ctx: AsyncEmbContext, tokens: int) -> float:
        """``route_peak`` scaled to ``tokens``, or every distinct id ``tokens`` can hold."""
        if ctx.route_peak is not None:
            return ctx.route_peak * tokens / max(1, ctx.local_tokens)
        return float(min(tokens, ctx.stored_rows))

    def capped_for(self, ctx: AsyncEmbContext, tokens: int) -> bool:
        """The exchange for a device holding ``tokens`` ids is smaller than its distinct ids can be."""
        return self.slots_for(ctx, tokens) < self.slots_for(ctx, tokens, exact=True)

    def sample_peak(self, ctx: AsyncEmbContext, rows: Any) -> int:
        """The most distinct ids one device holds in this batch of stored rows (one "shard" of every row)."""
        return route_peak(rows, ctx.mesh.size, ctx.stored_rows, 1)

    def lookup(self, ctx: AsyncEmbContext, table: jax.Array, ids: jax.Array, exact: bool = False,
               with_dedupe: bool = False) -> tuple:
        """Exchange each device's distinct ids, gather width slices, return full rows
        (``column_lookup_local``); ``(overflow, peak)``: the ids past a device's exchange summed over devices,
        and the most distinct ids one device held."""
        batch_axes = ctx.batch_axes

        def per_device(table_shard, ids_local):
            rows, (overflow, peak), *dd = column_lookup_local(ctx, table_shard, ids_local, exact, with_dedupe)
            return rows, *dd, (lax.psum(overflow, batch_axes), lax.pmax(peak, batch_axes))

        return per_device_lookup(ctx, table, ids, per_device, with_dedupe)

    def update(self, opt: Any, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table: jax.Array,
               state: Any, gate: jax.Array) -> tuple:
        """Each shard gets its width slice of every device's summed gradients and updates that slice. Records
        ``route_refused``: with ``"stop"`` the distinct ids past a device's exchange (summed over devices);
        with ``"reroute"`` such a step exchanges every device's whole buffer and nothing is refused (0)."""
        return sharded_update(ctx, functools.partial(_kernel, opt, ctx), update, table, state, gate,
                              counts_refused=True)

    def min_collective_bytes(self, ctx: AsyncEmbContext, unique_device: float, unique_global: float,
                             row_stats: bool = False) -> float:
        """Every shard needs its width slice of every distinct row's gradient (and the ids); with
        ``row_stats`` also one fp32 partial sum per distinct row from each shard, the least a reduction across
        the width shards can move."""
        return unique_global * (4 * ctx.emb_width / ctx.table_shards + 4 + (4 if row_stats else 0))


def past_exchange(ctx: AsyncEmbContext, unique: jax.Array, slots: int) -> tuple[jax.Array, jax.Array]:
    """Column layout: ``(distinct, overflow)``, a device's distinct ids in its sorted unique buffer (padded with
    ``ctx.stored_rows``) and how many of them are past the first ``slots`` it exchanges."""
    distinct = jnp.sum(unique < ctx.stored_rows).astype(jnp.int32)
    return distinct, jnp.maximum(distinct - slots, 0)


def column_lookup_local(ctx: AsyncEmbContext, table_shard: jax.Array, ids: jax.Array, exact: bool = False,
                        with_dedupe: bool = False):
    """Per-device body of the column layout's lookup: ids [...] -> rows [..., width] float32. The device dedupes
    its ids (sorted, distinct ids first, padding ``ctx.stored_rows`` after them); every shard of its table group gets
    the first C of them (all-gather, ``C = ctx.slots_for(n)``) and gathers its width slice of each, and an
    all-to-all returns each device the slices of its own rows. Ids past C (``overflow``) are counted: with
    ``ctx.route_overflow="reroute"`` a step where any device has some exchanges every device's whole buffer
    instead (``lax.cond`` on the overflow summed over the mesh, so every device takes the same branch); with
    ``"stop"`` they read zeros. ``exact``: the whole buffer, nothing can overflow.

    Returns ``(rows, (overflow, peak))`` (this device's ids past C, and its distinct ids: the C this batch
    needed), and with ``with_dedupe`` ``(rows, (overflow, peak), (unique ids, segment ids))``: the device's
    dedupe without the padding id 0, its update record's (``make_update``)."""
    flat = ids.reshape(-1)
    n = flat.shape[0]
    unique, seg = dedupe(flat, ctx.stored_rows, num_unique_for(n, ctx.stored_rows), pad_id=None)  # bad ids: -1
    size = unique.shape[0]
    slots = ctx.slots_for(n, exact)
    distinct, overflow = past_exchange(ctx, unique, slots)

    def fetch(c: int) -> jax.Array:  # [U, width]: the first c unique ids' rows; the rest zeros
        wanted = gather_over_table(ctx, unique[:c])  # [shards, c]: every table-group device's ids
        part = take_rows(table_shard, wanted).astype(jnp.float32)  # [shards, c, width / shards]
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
        return out, (overflow, distinct), without_padding_id(unique, seg, ctx.stored_rows)
    return out, (overflow, distinct)


def _kernel(opt: Any, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table, state, gate, local: bool = True):
    """The column layout's per-device kernel: this device's fp32 segment-summed gradients of its unique rows,
    split by width; an all-to-all gives every shard its slice of every table-group device's rows (and an
    all-gather their ids); each shard sums what all devices (of every data group) sent for the same row and
    applies the rule to its slice of those rows. Every shard sees the same ids in the same order, so the
    per-row sums over the full width the rule needs (``width_sum``, the norm) are one psum over the table axis.

    Only the first C = ``ctx.slots_for(n)`` unique ids (the distinct ones come first) and their gradient slices
    are exchanged; the record keeps its size. A device with more distinct ids than C: with ``reroute`` (the
    default) every device exchanges its whole buffer that step (``lax.cond`` on the overflow summed over the
    mesh; the table is written outside it), and the rule's width sums psum the whole owner buffer only then;
    with ``stop`` the update is refused whole and the ids past C (summed over devices) are returned last."""
    unique, seg = device_record(ctx, update, local)
    n, size = seg.shape[0], unique.shape[0]  # this device's tokens and its unique buffer
    shards, width = ctx.table_shards, ctx.emb_width
    slots = ctx.slots_for(n)
    g = segment_sum(update.grads, seg, size)  # [U, width] fp32
    w = segment_rows(update.rows, seg, size) if ctx.compensates else None  # [U, width]: w_then (compensation)

    def owner_size(c: int) -> int:
        return min(ctx.mesh.size * c, ctx.stored_rows) + 1

    def receive(c: int, pad_to: int | None = None):
        """Exchange the first ``c`` unique ids -> (every row's id [S], every device's gradient slice summed
        [S, width / shards], and under delay compensation the rows' w_then slices, else None), padded to
        ``pad_to`` rows (ids ``ctx.stored_rows``, gradients 0)."""
        slices = lambda x: jnp.moveaxis(x[:c].reshape(c, shards, width // shards), 1, 0)  # noqa: E731
        # [shards, c, width / shards]; w_then's slices ride in the same all-to-all, after the gradient's
        sent = slices(g) if w is None else jnp.concatenate([slices(g), slices(w)], axis=-1)
        got = gather_over_data(ctx, exchange(ctx, sent)).reshape(-1, sent.shape[-1])
        g_in = got[:, :width // shards]
        rows_in = gather_over_data(ctx, gather_over_table(ctx, unique[:c])).reshape(-1)
        s = owner_size(c)
        ids, oseg = dedupe(rows_in, ctx.stored_rows, s, pad_id=None)
        g_own = segment_sum(g_in, oseg, s)  # every device's gradient slice for each row
        w_own = None if w is None else segment_rows(got[:, width // shards:], oseg, s)  # every device read the same
        if pad_to is not None and pad_to > s:  # sorted ids, padding last: stays so
            ids = jnp.concatenate([ids, jnp.full((pad_to - s,), ctx.stored_rows, ids.dtype)])
            g_own = jnp.pad(g_own, ((0, pad_to - s), (0, 0)))
            w_own = None if w_own is None else jnp.pad(w_own, ((0, pad_to - s), (0, 0)))
        return ids, g_own, w_own

    pending, live, refused = update.pending, None, jnp.zeros((), jnp.int32)
    if not ctx.column_capped_for(n):  # room for every distinct id: the whole buffer, as it is
        ids, g_own, then = receive(size)
    else:
        _, overflow = past_exchange(ctx, unique, slots)
        if ctx.reroutes:  # every device takes the same branch: the test is on the overflow summed over the mesh
            rerouted = lax.psum(overflow, ctx.batch_axes) > 0
            full = owner_size(size)
            ids, g_own, then = lax.cond(rerouted, lambda: receive(size), lambda: receive(slots, full))
            live = (owner_size(slots), rerouted)  # the width sums move the whole buffer only when rerouted
        else:  # ids past the exchange: the update is refused whole
            refused = lax.psum(overflow, ctx.batch_axes)
            ids, g_own, then = receive(slots)
            pending = pending & (refused == 0)
    owned = ids < ctx.stored_rows
    # One pass over the whole buffer (no chunks): the rule's width sums are collectives, one per chunk otherwise.
    out = write_rows(opt, ctx, Touched(ids, ids, owned, g_own, then), table, state, gate, pending, live=live)
    return (*out, refused)
