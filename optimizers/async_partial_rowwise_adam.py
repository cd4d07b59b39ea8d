"""Partial row-wise Adam with a fused table update: the first moment per element, the second one per row.

FBGEMM's ``PARTIAL_ROWWISE_ADAM``: Adam (Kingma & Ba, 2015) whose second moment is one number per row, the
running mean over the row's width of ``g**2``, so the state is ``width + 1`` floats a row instead of Adam's
``2 * width``:

    m = b1 * m + (1 - b1) * g                    (per element)
    v = b2 * v + (1 - b2) * mean(g**2 over the row)   (per row)
    row -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * row)

with ``m_hat``, ``v_hat`` bias-corrected by the row's own update count (``bias_correction=per_row``, as
``async_adam`` does) or the table's (``global``, FBGEMM's choice). Only touched rows move.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

from ._lazy import jax, jnp
from .fields import BiasCorrection, bias_correction_field, bias_counts, schedule_field, weight_decay_mode_field
from .fused import FusedEmbOptimizer, RowContext
from .row_update import WeightDecayMode
from .hparams import hparam
from .schedules import Schedule


class PartialRowwiseAdamRows(NamedTuple):
    """Per-row state: the first moment per element, the second moment and the update count per row."""

    mu: jax.Array  # [rows, width] f32
    nu: jax.Array  # [rows] f32: mean over the width of g**2, averaged over updates
    count: jax.Array  # [rows] int32, updates this row has received


@dataclasses.dataclass(frozen=True)
class AsyncPartialRowwiseAdam(FusedEmbOptimizer):
    """Adam with a per-row second moment (FBGEMM's PARTIAL_ROWWISE_ADAM), lazy, fused."""

    learning_rate: float = hparam(1e-3, "step size", low=0.0, low_open=True)
    b1: float = hparam(0.9, "decay of the first-moment (mean) estimate", low=0.0, high=1.0, high_open=True)
    b2: float = hparam(0.999, "decay of the per-row second-moment estimate", low=0.0, high=1.0, high_open=True)
    eps: float = hparam(1e-8, "added to sqrt(second moment): keeps the step finite for a zero gradient",
                        low=0.0, low_open=True)
    weight_decay: float = hparam(0.0, "decoupled decay of a row, times the learning rate, applied lazily: only to "
                                      "the rows an update touches, once per update", low=0.0)
    bias_correction: BiasCorrection = bias_correction_field("the table's (FBGEMM)")
    weight_decay_mode: WeightDecayMode = weight_decay_mode_field()
    schedule: Schedule = schedule_field()

    def init_rows(self, num_rows: int, width: int) -> PartialRowwiseAdamRows:
        """Zero moments and update counts."""
        return PartialRowwiseAdamRows(jnp.zeros((num_rows, width), jnp.float32), jnp.zeros((num_rows,), jnp.float32),
                                      jnp.zeros((num_rows,), jnp.int32))

    def update_rows(self, rows, state: PartialRowwiseAdamRows, grad, rc: RowContext):
        """One step: per-element first moment, per-row second moment of mean(g**2), bias-corrected."""
        count = state.count + 1
        mu = self.b1 * state.mu + (1.0 - self.b1) * grad
        nu = self.b2 * state.nu + (1.0 - self.b2) * (rc.grad_sq_sum() / rc.emb_width)
        t = bias_counts(self.bias_correction, count, rc.step)  # [rows] (per_row) or a scalar (global)
        mu_hat, nu_hat = mu / (1.0 - self.b1 ** (t[:, None] if t.ndim else t)), nu / (1.0 - self.b2 ** t)
        step = mu_hat / (jnp.sqrt(nu_hat) + self.eps)[:, None] + self.weight_decay * rows
        return rows - rc.learning_rate * step, PartialRowwiseAdamRows(mu, nu, count)
