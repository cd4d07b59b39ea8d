"""FTRL-Proximal with a fused table update: per element an accumulator ``n`` and a linear term ``z``.

The algorithm is FTRL-Proximal (McMahan et al., 2013, "Ad Click Prediction: a View from the Trenches",
Algorithm 1), per coordinate, with TensorFlow's generalisations (``lr_power``, ``beta``, the
``multiply_linear_by_learning_rate`` form), applied lazily: only touched rows move. With ``p = lr_power``:

    n' = n + g**2
    sigma = (n'**(-p) - n**(-p)) / learning_rate
    z' = z + g - sigma * w
    w' = 0 if |z'| <= l1 else -(z' - sign(z') * l1) / ((beta + n'**(-p)) / learning_rate + L2)

**The l2 convention.** ``L2 = 2 * l2`` by default (``tensorflow_l2=true``): TensorFlow's and Keras' FTRL
and jax-tpu-embedding take the derivative of ``l2 * w**2``. ``tensorflow_l2=false`` gives the paper's
``L2 = l2``: the same model with half the l2 strength. Both are tested against a numpy reference of the
equations above.

**Initial values are kept.** FTRL's weights are a function of ``z`` and ``n`` alone; starting every row at
``z = 0`` (as TensorFlow does) makes the first update scale a row's initial value by
``1 - sqrt(n / n')``, which all but wipes it when ``initial_accumulator`` is large next to ``g**2``. Here a
row's ``z`` is set at its first touch to the value that gives back its current weights
(``z = -(w * ((beta + n**(-p)) / learning_rate + L2) + sign(w) * l1)``), so the first update is a proximal
step from the initial embedding, ``w' = w - g / ((beta + n'**(-p)) / learning_rate + L2)`` (for
``|z'| > l1``), never a reset. Each row counts its updates to know its first.

``multiply_linear_by_learning_rate`` stores ``learning_rate * z`` instead of ``z`` (TensorFlow's variant): the
same weights up to float rounding at a constant learning rate.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ._lazy import jax, jnp
from .fields import schedule_field
from .fused import FusedEmbOptimizer, RowContext
from .hparams import hparam
from .schedules import Schedule


# The lowest lr_power. The rule raises each accumulator n (a sum of squared gradients, which only grows) to
# -lr_power in float32, whose largest number is about 2**128: n**(-lr_power) is finite for n below
# 2**(128 / -lr_power) (a little less once the denominator divides it by a learning rate below 1). At -4 that is
# 2**32, about 4e9: four billion touches of a unit gradient. At -10 it would be 2**12.8, about 7000, which a
# frequent id's element reaches, and from then on every update touching it would be refused as non-finite.
LR_POWER_LOW = -4.0


class FtrlRows(NamedTuple):
    """Per-element FTRL state and the row's own update count."""

    accum: jax.Array  # [rows, width] f32: n, the sum of squared gradients (from initial_accumulator)
    linear: jax.Array  # [rows, width] f32: z (times learning_rate with multiply_linear_by_learning_rate)
    count: jax.Array  # [rows] int32: updates this row has received (0: z not yet set from the row)


@dataclasses.dataclass(frozen=True)
class AsyncFtrl(FusedEmbOptimizer):
    """FTRL-Proximal (McMahan et al., 2013) per element, TensorFlow's l2 convention by default, fused."""

    learning_rate: float = hparam(0.05, "step size (alpha)", low=0.0, low_open=True)
    lr_power: float = hparam(-0.5, "the per-coordinate step is learning_rate / n**(-lr_power); -0.5 is "
                                   "the paper's 1/sqrt(n), 0 a constant step; at least -4, where n**4 stays finite "
                                   "in float32 for every accumulator n below 2**32", low=LR_POWER_LOW, high=0.0)
    l1: float = hparam(0.0, "L1 strength: a weight is exactly 0 while |z| <= l1", low=0.0)
    l2: float = hparam(0.0, "L2 strength (doubled in the denominator with tensorflow_l2)", low=0.0)
    beta: float = hparam(0.0, "added to n**(-lr_power) in the denominator: damps the first steps", low=0.0)
    initial_accumulator: float = hparam(0.1, "every element's n before its first touch (TensorFlow's default)",
                                        low=0.0, low_open=True)
    tensorflow_l2: bool = dataclasses.field(default=True, metadata={
        "doc": "l2 enters the denominator as 2 * l2 (TensorFlow, Keras, jax-tpu-embedding); false: as l2 "
               "(McMahan et al., 2013)"})
    multiply_linear_by_learning_rate: bool = dataclasses.field(default=False, metadata={
        "doc": "store learning_rate * z instead of z (TensorFlow's variant; the same weights at a constant "
               "learning rate)"})
    schedule: Schedule = schedule_field()

    def init_rows(self, num_rows: int, width: int) -> FtrlRows:
        """``n`` at ``initial_accumulator``, ``z`` at 0 (set from the row at its first touch), no updates."""
        return FtrlRows(jnp.full((num_rows, width), self.initial_accumulator, jnp.float32),
                        jnp.zeros((num_rows, width), jnp.float32), jnp.zeros((num_rows,), jnp.int32))

    def _root(self, n):
        """``n**(-lr_power)``."""
        if self.lr_power == -0.5:
            return jnp.sqrt(n)
        if self.lr_power == 0.0:
            return jnp.ones_like(n)
        return jnp.power(n, -self.lr_power)

    def update_rows(self, rows, state: FtrlRows, grad, rc: RowContext):
        """One FTRL-Proximal step per element of each touched row (module docstring)."""
        lr, l1 = rc.learning_rate, self.l1
        l2 = 2.0 * self.l2 if self.tensorflow_l2 else self.l2
        root, new_n = self._root(state.accum), state.accum + grad * grad
        new_root = self._root(new_n)
        # In units of z, times lr when the linear term is stored times lr: then every term below is times lr.
        unit = lr if self.multiply_linear_by_learning_rate else 1.0
        quad = lambda r: (self.beta + r) * (unit / lr) + l2 * unit  # noqa: E731 - the denominator, in those units
        first = (state.count == 0)[:, None]
        from_rows = -(rows * quad(root) + jnp.sign(rows) * (l1 * unit))  # the z that gives back the row
        z = jnp.where(first, from_rows, state.linear)
        z = z + unit * grad - (new_root - root) * (unit / lr) * rows
        thresh = l1 * unit
        new_rows = jnp.where(jnp.abs(z) <= thresh, 0.0, -(z - jnp.sign(z) * thresh) / quad(new_root))
        return new_rows, FtrlRows(new_n, z, state.count + 1)
