"""The one-device layout: every device holds the whole table (no table axis, or one shard of it)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._lazy import jax, jnp
from ..indexing import take_rows
from ..protocol import AsyncEmbGradientUpdate
from ..record import segment_rows, segment_sum
from ..row_update import Touched, write_rows
from .base import Layout

if TYPE_CHECKING:
    from ..context import AsyncEmbContext


class Single(Layout):
    """The table replicated: a lookup is one gather, an update one dedupe-sum-rule-scatter, nothing crosses
    devices. Selected whenever the table axis holds at most one shard, whatever the config words say."""

    name = "single"

    def lookup(self, ctx: AsyncEmbContext, table: jax.Array, ids: jax.Array, exact: bool = False,
               with_dedupe: bool = False) -> tuple:
        """One gather; ids outside the table read zeros. Nothing is routed: ``(overflow, peak)`` are 0."""
        none = jnp.zeros((), jnp.int32)
        return ctx.narrow(take_rows(table, ids)).astype(jnp.float32), (none, none)

    def update(self, opt: Any, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table: jax.Array,
               state: Any, gate: jax.Array) -> tuple:
        """Segment-sum the record's gradients into its unique rows, then the shared rule and scatter."""
        ids = update.unique_tokens
        g = segment_sum(update.grads, update.segment_ids, ctx.num_unique)  # [U, width]
        then = segment_rows(update.rows, update.segment_ids, ctx.num_unique) if ctx.compensates else None
        return write_rows(opt, ctx, Touched(ids, ids, ids < ctx.stored_rows, g, then), table, state, gate,
                          update.pending)
