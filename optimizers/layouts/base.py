"""The interface every table layout implements, and the plumbing the sharded ones share.

A layout says where a table's rows and columns live on the mesh (its ``PartitionSpec`` and its state's), how a
batch's ids reach them (``lookup``) and how an update reaches them (``update``), which metrics it reports and
what it costs (its per-device memory and the least bytes its collectives must move). One instance of each
layout is registered in ``optimizers.layouts.REGISTRY``; an ``AsyncEmbContext`` holds the one its config words
select (``optimizers.layouts.select``) and asks it every layout question, so no code outside the registry
compares layout names. The layouts follow TorchRec's sharding types, one module each
(``torchrec/distributed/sharding/rw_sharding.py``, ``cw_sharding.py``).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from .._lazy import P, jax, jnp
from ..protocol import AsyncEmbGradientUpdate
from .choices import Routing, TableLayout

if TYPE_CHECKING:
    from ..context import AsyncEmbContext

# What a layout that counts its routing reports per table, each ``emb/<name>/<table>`` (``Layout.metrics``).
ROUTE_METRICS = ("route_overflow", "route_peak", "route_refused")


class Layout:
    """One way to place a table on the mesh: its shapes and specs, lookup, update, metrics and cost model.

    Subclasses set the class attributes and implement ``lookup`` and ``update``; the defaults describe a table
    every device holds whole.

    Attributes:
        name: the registry key.
        table_layout: the ``mesh.table_layout`` word that selects it (None: the one-device layout, selected
            whenever the table axis holds one shard).
        routing: the ``mesh.routing`` word it also needs (None: any).
        splits_rows: each shard holds a block of rows (the row count must divide over the shards).
        splits_width: each shard holds a slice of every row's width (the width must divide).
        routes_to_owners: each device sends its ids only to the shard that owns their row.
        per_device_record: each device dedupes only its own tokens, for its lookup and its update record.
        metrics: what it reports per table and step (``emb/<metric>/<table>``), besides every layout's.
    """

    name: ClassVar[str] = ""
    table_layout: ClassVar[TableLayout | None] = None
    routing: ClassVar[Routing | None] = None
    splits_rows: ClassVar[bool] = False
    splits_width: ClassVar[bool] = False
    routes_to_owners: ClassVar[bool] = False
    per_device_record: ClassVar[bool] = False
    metrics: ClassVar[tuple[str, ...]] = ()

    def __repr__(self) -> str:
        return f"<layout {self.name}>"

    # ----- shapes and specs ------------------------------------------------------------------------------
    def shard_rows(self, ctx: AsyncEmbContext) -> int:
        """Rows of the table one shard holds."""
        return ctx.stored_rows // ctx.table_shards if self.splits_rows else ctx.stored_rows

    def shard_width(self, ctx: AsyncEmbContext) -> int:
        """Columns of the table one shard holds."""
        return ctx.emb_width // ctx.table_shards if self.splits_width else ctx.emb_width

    def table_spec(self, ctx: AsyncEmbContext) -> Any:
        """The table's ``PartitionSpec``."""
        return P()

    def state_leaf_spec(self, ctx: AsyncEmbContext, leaf: Any) -> Any:
        """The ``PartitionSpec`` of one leaf of the optimizer state (per-row leaves follow the table)."""
        return P()

    # ----- routing capacity --------------------------------------------------------------------------------
    def slots_for(self, ctx: AsyncEmbContext, tokens: int, exact: bool = False) -> int:
        """Per-destination slots C for a device holding ``tokens`` ids: ``route_capacity`` times the measured
        ``route_peak`` (scaled to ``tokens``), or without one times the even share of its ids (tokens /
        shards); at least ``route_min_slots``, at most what can ever be needed (its distinct ids, or the rows
        one shard owns); ``exact``: that most, so nothing can overflow."""
        most = self.most_slots(ctx, tokens)
        if exact or self.exchanges_all(ctx):
            return most
        return max(1, min(most, max(math.ceil(ctx.route_capacity * self.slot_base(ctx, tokens)),
                                    ctx.route_min_slots)))

    def most_slots(self, ctx: AsyncEmbContext, tokens: int) -> int:
        """The most slots a device holding ``tokens`` ids can ever need: its distinct ids, or the rows one
        shard owns."""
        return max(1, min(tokens, ctx.stored_rows, ctx.shard_rows))

    def exchanges_all(self, ctx: AsyncEmbContext) -> bool:
        """Whether every slot ``most_slots`` allows is always exchanged (no capacity to apply)."""
        return False

    def slot_base(self, ctx: AsyncEmbContext, tokens: int) -> float:
        """What ``route_capacity`` multiplies: ``route_peak`` scaled to ``tokens``, or the even share."""
        if ctx.route_peak is not None:
            return ctx.route_peak * tokens / max(1, ctx.local_tokens)
        return min(tokens, ctx.stored_rows) / ctx.table_shards

    def capped_for(self, ctx: AsyncEmbContext, tokens: int) -> bool:
        """Whether a device holding ``tokens`` ids exchanges fewer of its distinct ids than it may hold (a step
        with more overflows; ``route_overflow`` says what happens then). Only the column layout caps that."""
        return False

    def sample_peak(self, ctx: AsyncEmbContext, rows: Any) -> int | None:
        """Host-side: the peak ``route_capacity`` multiplies, measured on one batch of stored rows (the most
        distinct ids one device sends one shard, or holds); None for a layout with nothing to size."""
        return None

    # ----- lookup and update -------------------------------------------------------------------------------
    def lookup(self, ctx: AsyncEmbContext, table: jax.Array, ids: jax.Array, exact: bool = False,
               with_dedupe: bool = False) -> tuple:
        """Rows of ``ids`` (stored rows, out-of-range ones already ``ctx.stored_rows``; the batch split over
        every mesh axis) -> ``(rows [..., width] float32, (overflow, peak))`` and, with ``with_dedupe`` (only
        ``per_device_record`` layouts), each device's (unique ids, segment ids) as ``make_update`` builds
        them. ``overflow`` and ``peak`` are 0 on layouts that do not count routes; ``exact``: room for every id.
        """
        raise NotImplementedError  # pragma: no cover - abstract

    def update(self, opt: Any, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table: jax.Array,
               state: Any, gate: jax.Array) -> tuple:
        """Apply ``update`` to the touched rows through ``opt``'s per-row rule; returns ``(table, state, norm,
        valid, rows_updated_per_shard)``. A layout that counts routes also records ``ctx.results
        ["route_refused"]``: the ids it could not deliver, which refused the update whole."""
        raise NotImplementedError  # pragma: no cover - abstract

    # ----- memory and traffic model ------------------------------------------------------------------------
    def shard_shape(self, ctx: AsyncEmbContext) -> tuple[int, int]:
        """``(rows, width)`` of the block of the table each device holds (its stored width: padding included)."""
        return self.shard_rows(ctx), self.shard_width(ctx) if self.splits_width else ctx.stored_width

    def table_bytes(self, ctx: AsyncEmbContext, itemsize: int = 4) -> int:
        """Bytes of the table on each device, at ``itemsize`` bytes a value."""
        rows, width = self.shard_shape(ctx)
        return rows * width * itemsize

    def min_collective_bytes(self, ctx: AsyncEmbContext, unique_device: float, unique_global: float,
                             row_stats: bool = False) -> float:
        """The least bytes a device must put into collectives per update step: none for a table it holds whole.

        Args:
            ctx: the table's context.
            unique_device: distinct ids one device holds per step (mean).
            unique_global: distinct ids of the whole batch per step (mean).
            row_stats: the optimizer's rule needs a statistic over the whole row (row-wise Adagrad's sum of
                g**2 over the width), which a width-split layout must reduce across its shards.
        """
        return 0.0


def sharded_update(ctx: AsyncEmbContext, body: Callable, update: AsyncEmbGradientUpdate, table: jax.Array,
                   state: Any, gate: jax.Array, counts_refused: bool) -> tuple:
    """Run the per-shard ``body(update, table_shard, state_shard, gate, local)`` under ``jax.shard_map``;
    ``local``: the record is per device (``ctx.local_record``). ``counts_refused``: ``body`` also returns the
    ids it could not deliver, recorded as ``ctx.results["route_refused"]``."""
    specs_state = ctx.state_specs(state)
    local = ctx.local_record(update)  # a per-device record (routed row or column layout), used as it is
    extra = (P(),) if counts_refused else ()
    kernel = jax.shard_map(
        lambda u, t, s, g: body(u, t, s, g, local),
        mesh=ctx.mesh,
        in_specs=(AsyncEmbGradientUpdate(*ctx.update_specs(local)), ctx.table_spec(), specs_state, P()),
        out_specs=(ctx.table_spec(), specs_state, P(), P(), P(ctx.table_axis), *extra),
        check_vma=False,
    )
    out = kernel(update, table, state, jnp.ravel(gate)[0])
    if extra:
        *out, ctx.results["route_refused"] = out
    return tuple(out)


def per_device_lookup(ctx: AsyncEmbContext, table: jax.Array, ids: jax.Array, body: Callable,
                      with_dedupe: bool) -> tuple:
    """Run a per-device lookup ``body(table_shard, ids_local) -> (rows, *dedupe, (overflow, peak))`` under
    ``jax.shard_map`` (ids split over every mesh axis); returns ``(rows, (overflow, peak), *dedupe)``."""
    batch_axes = ctx.batch_axes
    dd_specs = ((P(batch_axes), P(batch_axes)),) if with_dedupe else ()
    rows, *dd, (overflow, peak) = jax.shard_map(
        body, mesh=ctx.mesh, in_specs=(ctx.table_spec(), P(batch_axes, None)),
        out_specs=(P(batch_axes, None, None), *dd_specs, (P(), P())), check_vma=False)(table, ids)
    return rows, (overflow, peak), *dd
