"""Plain SGD with a fused table update: ``row -= lr * (g + weight_decay * row)`` on touched rows.

Stochastic gradient descent (Robbins & Monro, 1951) on the rows a batch touches; with ``weight_decay`` the
L2 penalty is applied lazily, to touched rows only.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ._lazy import jnp
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
    weight_decay_mode: WeightDecayMode = dataclasses.field(default=WeightDecayMode.decoupled, metadata={
        "doc": "decoupled (inside the rule, touched rows), l2 (added to the gradient) or decoupled_global "
               "(touched rows catch up on the decay they missed): optimizers.row_update.WeightDecayMode"})
    schedule: Schedule = dataclasses.field(default_factory=Schedule, metadata={
        "doc": "the learning rate's schedule over this table's updates (optimizers.schedules)"})

    def __post_init__(self):
        object.__setattr__(self, "weight_decay_mode", WeightDecayMode(self.weight_decay_mode))

    def init_rows(self, num_rows: int, width: int) -> SGDRows:
        """No state."""
        return SGDRows()

    def update_rows(self, rows, state: SGDRows, grad, rc: RowContext):
        """``row -= lr * (g + weight_decay * row)``."""
        return rows - rc.learning_rate * (grad + self.weight_decay * rows), state
