"""Element-wise Adagrad with a fused table update: ``accum += g**2``, ``row -= lr * g / (sqrt(accum) + eps)``.

The algorithm is Adagrad (Duchi, Hazan & Singer, 2011), applied lazily: only touched rows accumulate and
move. Decoupled weight decay on touched rows only.
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


class AdagradRows(NamedTuple):
    """Per-element Adagrad state: the running sum of squared gradients."""

    accum: jax.Array  # [rows, width] f32


@dataclasses.dataclass(frozen=True)
class AsyncAdagrad(FusedEmbOptimizer):
    """Element-wise Adagrad (Duchi, Hazan & Singer, 2011) on the touched rows, fused."""

    learning_rate: float = hparam(0.05, "step size", low=0.0, low_open=True)
    eps: float = hparam(1e-10, "added to sqrt(accumulator): keeps the step finite for a zero gradient",
                        low=0.0, low_open=True)
    initial_accumulator_value: float = hparam(0.1, "every element's accumulator before its first touch", low=0.0)
    weight_decay: float = hparam(0.0, "decay of a row, times the learning rate, applied lazily: only to the rows an update "
                                 "touches, once per update (untouched rows do not decay)", low=0.0)
    weight_decay_mode: WeightDecayMode = weight_decay_mode_field()
    schedule: Schedule = schedule_field()

    def init_rows(self, num_rows: int, width: int) -> AdagradRows:
        """Every accumulator at ``initial_accumulator_value``."""
        return AdagradRows(jnp.full((num_rows, width), self.initial_accumulator_value, jnp.float32))

    def update_rows(self, rows, state: AdagradRows, grad, rc: RowContext):
        """``accum += g**2``; ``row -= lr * (g / (sqrt(accum) + eps) + weight_decay * row)``."""
        accum = state.accum + grad * grad
        step = grad / (jnp.sqrt(accum) + self.eps) + self.weight_decay * rows
        return rows - rc.learning_rate * step, AdagradRows(accum)
