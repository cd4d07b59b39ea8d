"""Row-wise Adagrad with momentum, fused: one accumulator per row and a momentum buffer per element.

Row-wise Adagrad (one accumulator per row, as FBGEMM's ``EXACT_ROWWISE_ADAGRAD``) whose adaptive step feeds a
heavy-ball momentum buffer (Polyak, 1964), as optax's ``adagrad`` chained with ``trace`` would do per row:

    accum += mean(g**2 over the row)
    m = momentum * m + g / (sqrt(accum) + eps)
    row -= lr * (m + weight_decay * row)

Only touched rows move: a row's momentum decays only when the row is touched (lazily, like its accumulator).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ._lazy import jax, jnp
from .fields import schedule_field, weight_decay_mode_field
from .fused import FusedEmbOptimizer, RowContext
from .row_update import WeightDecayMode
from .hparams import hparam
from .schedules import Schedule


class RowwiseAdagradMomentumRows(NamedTuple):
    """Per-row state: one accumulator per row and the momentum buffer per element."""

    accum: jax.Array  # [rows] f32
    momentum: jax.Array  # [rows, width] f32


@dataclasses.dataclass(frozen=True)
class AsyncRowwiseAdagradMomentum(FusedEmbOptimizer):
    """Row-wise Adagrad (one accumulator per row) with heavy-ball momentum per element, fused."""

    learning_rate: float = hparam(0.05, "step size", low=0.0, low_open=True)
    momentum: float = hparam(0.9, "decay of the momentum buffer per touch; 0 = row-wise Adagrad", low=0.0,
                             high=1.0, high_open=True)
    eps: float = hparam(1e-10, "added to sqrt(accumulator): keeps the step finite for a zero gradient",
                        low=0.0, low_open=True)
    initial_accumulator_value: float = hparam(0.0, "every row's accumulator before its first touch", low=0.0)
    weight_decay: float = hparam(0.0, "decay of a row, times the learning rate, applied lazily: only to the rows "
                                      "an update touches, once per update", low=0.0)
    weight_decay_mode: WeightDecayMode = weight_decay_mode_field()
    schedule: Schedule = schedule_field()

    def init_rows(self, num_rows: int, width: int) -> RowwiseAdagradMomentumRows:
        """Accumulators at ``initial_accumulator_value``, zero momentum."""
        return RowwiseAdagradMomentumRows(jnp.full((num_rows,), self.initial_accumulator_value, jnp.float32),
                                          jnp.zeros((num_rows, width), jnp.float32))

    def update_rows(self, rows, state: RowwiseAdagradMomentumRows, grad, rc: RowContext):
        """Add the row's mean g**2, scale g by it, fold it into the momentum, step the row by the momentum."""
        accum = state.accum + rc.grad_sq_sum() / rc.emb_width
        m = self.momentum * state.momentum + grad * (1.0 / (jnp.sqrt(accum) + self.eps))[:, None]
        return rows - rc.learning_rate * (m + self.weight_decay * rows), RowwiseAdagradMomentumRows(accum, m)
