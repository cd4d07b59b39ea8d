"""Element-wise Adagrad with a fused table update: ``accum += g**2``, ``row -= lr * g / (sqrt(accum) + eps)``.

Decoupled weight decay on touched rows only.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .fused import FusedEmbOptimizer, RowContext


class AdagradRows(NamedTuple):
    accum: jax.Array  # [rows, width] f32


@dataclasses.dataclass(frozen=True)
class AsyncAdagrad(FusedEmbOptimizer):
    learning_rate: float = 0.05
    eps: float = 1e-10
    initial_accumulator_value: float = 0.1
    weight_decay: float = 0.0

    def init_rows(self, num_rows: int, width: int) -> AdagradRows:
        return AdagradRows(jnp.full((num_rows, width), self.initial_accumulator_value, jnp.float32))

    def update_rows(self, rows, state: AdagradRows, grad, rc: RowContext):
        accum = state.accum + grad * grad
        step = grad / (jnp.sqrt(accum) + self.eps) + self.weight_decay * rows
        return rows - self.learning_rate * step, AdagradRows(accum)
