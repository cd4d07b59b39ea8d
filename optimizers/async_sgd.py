"""Plain SGD with a fused table update: ``row -= lr * (g + weight_decay * row)`` on touched rows.

Stochastic gradient descent (Robbins & Monro, 1951) on the rows a batch touches; with ``weight_decay`` the
L2 penalty is applied lazily, to touched rows only.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ._lazy import jnp
from .fields import schedule_field, weight_decay_mode_field
from .fused import FusedEmbOptimizer, RowContext
from .row_update import WeightDecayMode
from .hparams import hparam
from .schedules import Schedule


class SGDRows(NamedTuple):
    """SGD keeps no per-row state."""


@dataclasses.dataclass(frozen=True)
class AsyncSGD(FusedEmbOptimizer):
    """Plain SGD (Robbins & Monro, 1951) on the touched rows, with lazy L2 weight decay, fused."""

    learning_rate: float = hparam(0.1, "step size", low=0.0, low_open=True)
    weight_decay: float = hparam(0.0, "decay of a row, times the learning rate, applied lazily: only to the rows an update "
                                 "touches, once per update (untouched rows do not decay)", low=0.0)
    weight_decay_mode: WeightDecayMode = weight_decay_mode_field()
    schedule: Schedule = schedule_field()

    def init_rows(self, num_rows: int, width: int) -> SGDRows:
        """No state."""
        return SGDRows()

    def update_rows(self, rows, state: SGDRows, grad, rc: RowContext):
        """``row -= lr * (g + weight_decay * row)``."""
        return rows - rc.learning_rate * (grad + self.weight_decay * rows), state
