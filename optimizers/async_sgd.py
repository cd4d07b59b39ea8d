"""Plain SGD with a fused table update: ``row -= lr * (g + weight_decay * row)`` on touched rows."""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax.numpy as jnp

from .fused import FusedEmbOptimizer, RowContext


class SGDRows(NamedTuple):
    pass


@dataclasses.dataclass(frozen=True)
class AsyncSGD(FusedEmbOptimizer):
    learning_rate: float = 0.1
    weight_decay: float = 0.0

    def init_rows(self, num_rows: int, width: int) -> SGDRows:
        return SGDRows()

    def update_rows(self, rows, state: SGDRows, grad, rc: RowContext):
        return rows - self.learning_rate * (grad + self.weight_decay * rows), state
