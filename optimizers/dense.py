"""Plain optax embedding optimizers applied densely to the whole table (the baseline a user would write).

They scatter the batch's gradient into a table-sized zero gradient and run an optax transformation over
every row, so their cost grows with the vocabulary. They work in sync mode only: they inherit the
protocol's raising defaults, so ``supports_async_emb`` is false and the preflight check refuses them when
``async_emb`` is on.
"""
from __future__ import annotations

import dataclasses

from ._lazy import jax, jnp, optax
from .checks import check_update
from .context import AsyncEmbContext
from .record import update_token_ids
from .hparams import hparam
from .protocol import AsyncEmbGradientUpdate, AsyncEmbOptimizer


class OptaxEmbOptimizer(AsyncEmbOptimizer):
    """Base of the dense baselines: an optax transformation over the whole table, sync mode only (it has no
    fused update: ``supports_async_emb`` is false)."""

    def transform(self) -> optax.GradientTransformation:  # pragma: no cover - abstract
        """The optax transformation applied to the dense table gradient."""
        raise NotImplementedError

    def init(self, num_rows: int, width: int):
        """The transformation's state for a ``num_rows`` x ``width`` float32 table."""
        return self.transform().init(jax.ShapeDtypeStruct((num_rows, width), jnp.float32))

    def apply_dense(self, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table, state):
        """Returns (table, state, norm, valid); a non-pending update, a non-finite gradient, or an update
        whose new table or state would not be finite (e.g. a learning rate that overflows) changes nothing, and
        ``valid`` is false. Hyperparameters outside their ranges (eps=0, b1=1, a negative learning rate) are a
        ValueError when it is traced (``optimizers.checks.check_update``)."""
        check_update(self, ctx, update, table, state)
        dense_g = dense_gradient(ctx, update, table.shape)
        norm = jnp.sqrt(jnp.sum(dense_g * dense_g))
        valid = jnp.isfinite(norm) & update.pending

        def apply(args):
            table, state = args
            updates, new_state = self.transform().update(dense_g, state, table.astype(jnp.float32))
            new_table = (table.astype(jnp.float32) + updates).astype(table.dtype)
            finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves((new_table, new_state))
                                        if jnp.issubdtype(x.dtype, jnp.inexact)]))
            out = jax.lax.cond(finite, lambda: (new_table, new_state), lambda: (table, state))
            return (*out, finite)

        table, state, ok = jax.lax.cond(valid, apply, lambda a: (*a, jnp.zeros((), bool)), (table, state))
        return table, state, norm, valid & ok


def dense_gradient(ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, shape: tuple[int, int]) -> jax.Array:
    """The whole batch's fp32 gradient of the table ``[rows, width]``: every token's gradient added into its row,
    from a record of either kind (per device on the routed row and the column layout, ``update_token_ids``).
    On a sharded table it is split as the table is, so no device holds all of it."""
    ids = update_token_ids(ctx, update)
    grads = update.grads.astype(jnp.float32)
    if grads.shape[-1] != shape[1]:  # a padded table (ctx.stored_width): zero gradient in the padding columns
        grads = jnp.pad(grads, ((0, 0), (0, shape[1] - grads.shape[-1])))
    g = jnp.zeros(shape, jnp.float32).at[ids].add(grads, mode="drop")
    if ctx.sharded:
        g = jax.lax.with_sharding_constraint(g, jax.sharding.NamedSharding(ctx.mesh, ctx.table_spec()))
    return g


@dataclasses.dataclass(frozen=True)
class Adam(OptaxEmbOptimizer):
    """``optax.adamw`` over the whole table (Kingma & Ba, 2015; decoupled decay, Loshchilov & Hutter, 2019).

    Its moments are per row, its step count is the table's (optax keeps one): a row first updated late in a run,
    or a hash table's row given to a new id (whose moments are reset, docs/guide/hash_tables.md), is
    bias-corrected by the table's count, so its first updates are not those of a row started afresh (late in a
    run up to 6.6x larger with the default b1 and b2). ``AsyncAdam`` counts each row's own updates."""

    learning_rate: float = hparam(1e-3, "step size", low=0.0, low_open=True)
    b1: float = hparam(0.9, "decay of the first-moment (mean) estimate", low=0.0, high=1.0, high_open=True)
    b2: float = hparam(0.999, "decay of the second-moment estimate", low=0.0, high=1.0, high_open=True)
    eps: float = hparam(1e-8, "added to sqrt(second moment)", low=0.0, low_open=True)
    weight_decay: float = hparam(0.0, "decoupled decay of every row, times the learning rate", low=0.0)

    def transform(self):
        """``optax.adamw`` with these hyperparameters."""
        return optax.adamw(self.learning_rate, self.b1, self.b2, self.eps, weight_decay=self.weight_decay)


@dataclasses.dataclass(frozen=True)
class Adagrad(OptaxEmbOptimizer):
    """``optax.adagrad`` over the whole table (Duchi, Hazan & Singer, 2011)."""

    learning_rate: float = hparam(0.05, "step size", low=0.0, low_open=True)
    initial_accumulator_value: float = hparam(0.1, "every element's accumulator at the start", low=0.0)
    eps: float = hparam(1e-7, "added to sqrt(accumulator)", low=0.0, low_open=True)

    def transform(self):
        """``optax.adagrad`` with these hyperparameters."""
        return optax.adagrad(self.learning_rate, self.initial_accumulator_value, self.eps)
