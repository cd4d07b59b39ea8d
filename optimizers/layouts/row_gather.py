"""The row layout with gathered ids: every shard sees every id of its data group (the older path)."""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from .._lazy import P, jax, jnp, lax
from ..indexing import take_rows
from ..protocol import AsyncEmbGradientUpdate
from ..record import segment_rows, segment_sum
from ..row_update import Touched, write_rows
from .base import sharded_update
from .choices import Routing
from .row import RowLayout

if TYPE_CHECKING:
    from ..context import AsyncEmbContext


class RowGather(RowLayout):
    """Rows split over the table axis; a lookup all-gathers the data group's ids over the table axis, each
    shard gathers the rows it owns (zeros elsewhere) and a reduce-scatter returns every device its own tokens'
    full rows. The update record is the whole batch's: each shard sums and updates the rows it owns."""

    name = "row_gather"
    routing = Routing.gather

    def lookup(self, ctx: AsyncEmbContext, table: jax.Array, ids: jax.Array, exact: bool = False,
               with_dedupe: bool = False) -> tuple:
        """All-gather the ids, gather owned rows, reduce-scatter them back; nothing overflows."""
        axis, batch_axes = ctx.table_axis, ctx.batch_axes

        def local(table_shard, ids_local):
            group_ids = lax.all_gather(ids_local, axis, axis=0, tiled=True)  # this data group's ids
            local_ids = group_ids - lax.axis_index(axis) * ctx.shard_rows
            owned = (local_ids >= 0) & (local_ids < ctx.shard_rows)
            rows = ctx.narrow(take_rows(table_shard, jnp.where(owned, local_ids, ctx.shard_rows)))
            return lax.psum_scatter(rows.astype(jnp.float32), axis, scatter_dimension=0, tiled=True)

        none = jnp.zeros((), jnp.int32)
        return jax.shard_map(local, mesh=ctx.mesh, in_specs=(ctx.table_spec(), P(batch_axes, None)),
                             out_specs=P(batch_axes, None, None), check_vma=False)(table, ids), (none, none)

    def update(self, opt: Any, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table: jax.Array,
               state: Any, gate: jax.Array) -> tuple:
        """Per shard: keep the record's rows this shard owns, sum their gradients, the shared rule and scatter."""
        return sharded_update(ctx, functools.partial(_kernel, opt, ctx), update, table, state, gate,
                              counts_refused=False)


def _kernel(opt: Any, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table, state, gate, local: bool):
    """The per-shard kernel: segment-sum the owned rows' gradients, norm, gather, rule, gated scatter."""
    ids, seg = update.unique_tokens, update.segment_ids
    offset = lax.axis_index(ctx.table_axis) * ctx.shard_rows
    rows = ids - offset
    owned = (rows >= 0) & (rows < ctx.shard_rows)
    seg = jnp.where(take_rows(owned, seg, False), seg, -1)  # sum only the rows we own
    g = segment_sum(update.grads, seg, ctx.num_unique)  # [U, width]
    then = segment_rows(update.rows, seg, ctx.num_unique) if ctx.compensates else None
    return write_rows(opt, ctx, Touched(ids, rows, owned, g, then), table, state, gate, update.pending)
