"""The dataclass fields fused optimizers declare alike: the learning-rate schedule, the weight-decay mode and
the Adams' bias-correction count (each optimizer file declares its own hyperparameters with
``hparams.hparam``). ``FusedEmbOptimizer.__post_init__`` turns a word given for an Enum field into the Enum."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any

from ._lazy import jax, jnp
from .row_update import WeightDecayMode
from .schedules import Schedule


def schedule_field() -> Any:
    """``schedule: Schedule``: constant by default (``optimizers.schedules``); ``hparams.problems`` names a value
    that is not a ``Schedule`` (``instance_of``)."""
    return dataclasses.field(default_factory=Schedule, metadata={
        "doc": "the learning rate's schedule over this table's updates (optimizers.schedules)",
        "instance_of": Schedule})


def weight_decay_mode_field() -> Any:
    """``weight_decay_mode: WeightDecayMode``: decoupled by default (``optimizers.row_update``)."""
    return dataclasses.field(default=WeightDecayMode.decoupled, metadata={
        "doc": "decoupled (inside the rule, touched rows), l2 (added to the gradient) or decoupled_global "
               "(touched rows catch up on the decay they missed): optimizers.row_update.WeightDecayMode"})


# Which update count an Adam's bias correction uses: the row's own (per_row) or the table's (global); "global"
# is a keyword, hence the call form.
BiasCorrection = enum.Enum("BiasCorrection", [("per_row", "per_row"), ("global", "global")], type=str,
                           module=__name__)


def as_choice(kind: type[enum.Enum], value: Any, name: str) -> Any:
    """``value`` (a word or a member) as a member of ``kind``; a ValueError naming the field ``name``, the value
    and the words ``kind`` takes otherwise."""
    try:
        return kind(getattr(value, "value", value))
    except ValueError:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(m.value for m in kind)}") from None


def as_bias_correction(value) -> BiasCorrection:
    """``value`` (a word or the Enum) as a :data:`BiasCorrection`; a ValueError naming the choices otherwise."""
    return as_choice(BiasCorrection, value, "bias_correction")


def as_weight_decay_mode(value) -> WeightDecayMode:
    """``value`` (a word or the Enum) as a :class:`WeightDecayMode`; a ValueError naming the choices otherwise."""
    return as_choice(WeightDecayMode, value, "weight_decay_mode")


def bias_correction_field(global_means: str) -> Any:
    """``bias_correction: BiasCorrection``: per_row by default; ``global_means`` says whose count global is."""
    return dataclasses.field(default=BiasCorrection["per_row"], metadata={
        "doc": f"per_row: each row's own update count; global: {global_means}"})


def bias_counts(kind: BiasCorrection, count: jax.Array, step: jax.Array) -> jax.Array:
    """The float32 count each touched row's bias correction uses: its own ``count`` ([rows], per_row) or the
    table's update ``step`` (a scalar, global)."""
    return count.astype(jnp.float32) if kind is BiasCorrection["per_row"] else jnp.asarray(step, jnp.float32)
