"""Row-wise Adagrad with a fused table update: one fp32 accumulator per row.

The algorithm is Adagrad (Duchi, Hazan & Singer, 2011) with one accumulator per embedding row instead of
one per element, as FBGEMM's ``EXACT_ROWWISE_ADAGRAD`` and TorchRec's fused row-wise Adagrad do: the
state is 4 bytes a row, and every element of a row takes the same adaptive step.

``accum = accum * decay**k + mean(g**2 over the width)``, then ``row -= lr * (g / (sqrt(accum) + eps)
+ weight_decay * row)``. ``decay = exp(-ln2 / half_life_steps)`` (1 when ``half_life_steps <= 0``);
``k`` is 1 per touch, or with ``lazy_decay`` the number of updates since the row was last touched, so a
rarely seen row decays as if it had been decayed every step. Only touched rows move.
"""
from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

from ._lazy import jax, jnp
from .fields import schedule_field, weight_decay_mode_field
from .fused import FusedEmbOptimizer, RowContext
from .row_update import WeightDecayMode
from .hparams import hparam
from .schedules import Schedule


class RowwiseAdagradRows(NamedTuple):
    """Per-row state: one accumulator and the update count at the row's last touch."""

    accum: jax.Array  # [rows] f32
    last_step: jax.Array  # [rows] int32, update count when the row was last touched


@dataclasses.dataclass(frozen=True)
class AsyncRowwiseAdagrad(FusedEmbOptimizer):
    """Row-wise Adagrad (Duchi et al., 2011; one accumulator per row as FBGEMM/TorchRec), fused."""

    learning_rate: float = hparam(0.1, "step size", low=0.0, low_open=True)
    eps: float = hparam(1e-10, "added to sqrt(accumulator): keeps the step finite for a zero gradient",
                        low=0.0, low_open=True)
    initial_accumulator_value: float = hparam(0.0, "every row's accumulator before its first touch", low=0.0)
    half_life_steps: float = hparam(0.0, "the accumulator halves every this many touches (or steps, with "
                                         "lazy_decay); 0 = no decay", low=0.0)
    lazy_decay: bool = dataclasses.field(default=True, metadata={
        "doc": "decay by the updates since the row's last touch, not once per touch"})
    weight_decay: float = hparam(0.0, "decay of a row, times the learning rate, applied lazily: only to the rows an update "
                                 "touches, once per update (untouched rows do not decay)", low=0.0)
    weight_decay_mode: WeightDecayMode = weight_decay_mode_field()
    schedule: Schedule = schedule_field()

    native_rule = "rowwise_adagrad"

    def native_attrs(self) -> dict:
        """eps, decay, lazy (the native kernel's; weight decay comes from the caller, by its mode)."""
        return dict(eps=self.eps, decay=self.decay, lazy=self.lazy_decay)

    @property
    def decay(self) -> float:
        """The accumulator's decay per update, from ``half_life_steps`` (1: none)."""
        return math.exp(-math.log(2.0) / self.half_life_steps) if self.half_life_steps > 0 else 1.0

    def init_rows(self, num_rows: int, width: int) -> RowwiseAdagradRows:
        """Accumulators at ``initial_accumulator_value``, last touch at update 0."""
        return RowwiseAdagradRows(jnp.full((num_rows,), self.initial_accumulator_value, jnp.float32),
                                  jnp.zeros((num_rows,), jnp.int32))

    def update_rows(self, rows, state: RowwiseAdagradRows, grad, rc: RowContext):
        """Decay the accumulator, add the row's mean g**2, step every element by the same adaptive scale."""
        if self.decay == 1.0:
            factor = 1.0
        elif self.lazy_decay:
            factor = jnp.power(jnp.float32(self.decay), (rc.step - state.last_step).astype(jnp.float32))
        else:
            factor = jnp.float32(self.decay)
        accum = state.accum * factor + rc.grad_sq_sum() / rc.emb_width
        scale = 1.0 / (jnp.sqrt(accum) + self.eps)
        new_rows = rows - rc.learning_rate * (grad * scale[:, None] + self.weight_decay * rows)
        return new_rows, RowwiseAdagradRows(accum, jnp.broadcast_to(rc.step, state.last_step.shape))
