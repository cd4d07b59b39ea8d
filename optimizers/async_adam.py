"""Lazy (sparse) Adam with a fused table update.

The algorithm is Adam (Kingma & Ba, 2015, "Adam: A Method for Stochastic Optimization") applied lazily, as
TensorFlow's ``LazyAdamOptimizer`` and PyTorch's ``SparseAdam`` do for embeddings: only the rows a batch
touches move their moments. ``bias_correction`` picks the count Adam's bias correction uses:

- ``per_row`` (default): each row's own update count, so a row's trajectory equals ``optax.adam`` run on that
  row's own gradient stream; a rarely seen row is corrected as fresh for its first touches.
- ``global``: the table's update count, as TF LazyAdam, PyTorch SparseAdam and FBGEMM do: a row first
  touched late in training gets (almost) no correction, so its first step is ``(1 - b1) / sqrt(1 - b2)`` of a
  bias-corrected one: about 3.2x with the default b1 and b2.

Weight decay is decoupled (AdamW, Loshchilov & Hutter, 2019) and applied to touched rows only, as they are
touched.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ._lazy import jax, jnp
from .fields import (BiasCorrection, as_bias_correction, bias_correction_field, bias_counts, schedule_field,
                     weight_decay_mode_field)
from .fused import FusedEmbOptimizer, RowContext
from .row_update import WeightDecayMode
from .hparams import hparam
from .schedules import Schedule


class AdamRows(NamedTuple):
    """Per-row Adam state: both moments per element and the row's own update count."""

    mu: jax.Array  # [rows, width] f32
    nu: jax.Array  # [rows, width] f32
    count: jax.Array  # [rows] int32, updates this row has received


@dataclasses.dataclass(frozen=True)
class AsyncAdam(FusedEmbOptimizer):
    """Lazy Adam (Kingma & Ba, 2015) with decoupled weight decay (AdamW), per touched row, fused."""

    learning_rate: float = hparam(1e-3, "step size", low=0.0, low_open=True)
    b1: float = hparam(0.9, "decay of the first-moment (mean) estimate", low=0.0, high=1.0, high_open=True)
    b2: float = hparam(0.999, "decay of the second-moment estimate", low=0.0, high=1.0, high_open=True)
    eps: float = hparam(1e-8, "added to sqrt(second moment): keeps the step finite for a zero gradient",
                        low=0.0, low_open=True)
    weight_decay: float = hparam(0.0, "decoupled (AdamW) decay of a row, times the learning rate, applied lazily: only to the rows an update "
                                 "touches, once per update (untouched rows do not decay)",
                                 low=0.0)
    bias_correction: BiasCorrection = bias_correction_field("the table's (TF LazyAdam, SparseAdam, FBGEMM)")
    weight_decay_mode: WeightDecayMode = weight_decay_mode_field()
    schedule: Schedule = schedule_field()

    native_rule = "adam"

    def native_attrs(self) -> dict:
        """b1, b2, 1 - b1 and 1 - b2 (in float64, as ``update_rows`` takes them), eps and the bias correction's
        count (the native kernel's)."""
        return dict(b1=self.b1, b2=self.b2, one_minus_b1=1.0 - self.b1, one_minus_b2=1.0 - self.b2, eps=self.eps,
                    per_row=as_bias_correction(self.bias_correction) is BiasCorrection["per_row"])

    def init_rows(self, num_rows: int, width: int) -> AdamRows:
        """Zero moments and update counts."""
        return AdamRows(jnp.zeros((num_rows, width), jnp.float32), jnp.zeros((num_rows, width), jnp.float32),
                        jnp.zeros((num_rows,), jnp.int32))

    def update_rows(self, rows, state: AdamRows, grad, rc: RowContext):
        """One Adam step of each touched row, bias-corrected with the row's own or the table's update count."""
        count = state.count + 1
        mu = self.b1 * state.mu + (1.0 - self.b1) * grad
        nu = self.b2 * state.nu + (1.0 - self.b2) * grad * grad
        t = bias_counts(self.bias_correction, count, rc.step)
        t = t[:, None] if t.ndim else t
        mu_hat = mu / (1.0 - self.b1 ** t)
        nu_hat = nu / (1.0 - self.b2 ** t)
        step = mu_hat / (jnp.sqrt(nu_hat) + self.eps) + self.weight_decay * rows
        return rows - rc.learning_rate * step, AdamRows(mu, nu, count)
