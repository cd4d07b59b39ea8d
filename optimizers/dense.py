"""Plain optax embedding optimizers applied densely to the whole table (the baseline a user would write).

They scatter the batch's gradient into a table-sized zero gradient and run an optax transformation over
every row, so their cost grows with the vocabulary. They work in sync mode only: they inherit the
protocol's raising defaults, so ``supports_async_emb`` is false and the preflight check refuses them when
``async_emb`` is on.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from .context import AsyncEmbContext
from .fused import segment_sum
from .protocol import AsyncEmbGradientUpdate, AsyncEmbOptimizer


class OptaxEmbOptimizer(AsyncEmbOptimizer):
    def transform(self) -> optax.GradientTransformation:  # pragma: no cover - abstract
        raise NotImplementedError

    def init(self, num_rows: int, width: int):
        return self.transform().init(jax.ShapeDtypeStruct((num_rows, width), jnp.float32))

    def apply_dense(self, ctx: AsyncEmbContext, update: AsyncEmbGradientUpdate, table, state):
        """Returns (table, state, norm, valid); a non-finite or non-pending update changes nothing."""
        g = segment_sum(update.grads, update.segment_ids, ctx.num_unique)
        norm = jnp.sqrt(jnp.sum(g * g))
        valid = jnp.isfinite(norm) & update.pending

        def apply(args):
            table, state = args
            dense_g = jnp.zeros(table.shape, jnp.float32).at[update.unique_tokens].add(g, mode="drop")
            updates, state = self.transform().update(dense_g, state, table.astype(jnp.float32))
            return (table.astype(jnp.float32) + updates).astype(table.dtype), state

        table, state = jax.lax.cond(valid, apply, lambda a: a, (table, state))
        return table, state, norm, valid


@dataclasses.dataclass(frozen=True)
class Adam(OptaxEmbOptimizer):
    learning_rate: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def transform(self):
        return optax.adamw(self.learning_rate, self.b1, self.b2, self.eps, weight_decay=self.weight_decay)


@dataclasses.dataclass(frozen=True)
class Adagrad(OptaxEmbOptimizer):
    learning_rate: float = 0.05
    initial_accumulator_value: float = 0.1
    eps: float = 1e-7

    def transform(self):
        return optax.adagrad(self.learning_rate, self.initial_accumulator_value, self.eps)
