"""The dataclass fields every fused optimizer declares alike: its learning-rate schedule and its weight-decay
mode (each optimizer file declares its own hyperparameters with ``hparams.hparam``)."""
from __future__ import annotations

import dataclasses
from typing import Any

from .row_update import WeightDecayMode
from .schedules import Schedule


def schedule_field() -> Any:
    """``schedule: Schedule``: constant by default (``optimizers.schedules``)."""
    return dataclasses.field(default_factory=Schedule, metadata={
        "doc": "the learning rate's schedule over this table's updates (optimizers.schedules)"})


def weight_decay_mode_field() -> Any:
    """``weight_decay_mode: WeightDecayMode``: decoupled by default (``optimizers.row_update``)."""
    return dataclasses.field(default=WeightDecayMode.decoupled, metadata={
        "doc": "decoupled (inside the rule, touched rows), l2 (added to the gradient) or decoupled_global "
               "(touched rows catch up on the decay they missed): optimizers.row_update.WeightDecayMode"})
