"""Lazy Adam with a fused table update.

Only the rows a batch touches move their moments. Each row counts its own updates and bias-corrects with
that count, so a row's trajectory equals ``optax.adam`` run on that row's own gradient stream. Weight
decay is decoupled (AdamW) and applied to touched rows only.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from .fused import FusedEmbOptimizer, RowContext


class AdamRows(NamedTuple):
    mu: jax.Array  # [rows, width] f32
    nu: jax.Array  # [rows, width] f32
    count: jax.Array  # [rows] int32, updates this row has received


@dataclasses.dataclass(frozen=True)
class AsyncAdam(FusedEmbOptimizer):
    learning_rate: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def init_rows(self, num_rows: int, width: int) -> AdamRows:
        return AdamRows(jnp.zeros((num_rows, width), jnp.float32), jnp.zeros((num_rows, width), jnp.float32),
                        jnp.zeros((num_rows,), jnp.int32))

    def update_rows(self, rows, state: AdamRows, grad, rc: RowContext):
        count = state.count + 1
        mu = self.b1 * state.mu + (1.0 - self.b1) * grad
        nu = self.b2 * state.nu + (1.0 - self.b2) * grad * grad
        t = count.astype(jnp.float32)[:, None]
        mu_hat = mu / (1.0 - self.b1 ** t)
        nu_hat = nu / (1.0 - self.b2 ** t)
        step = mu_hat / (jnp.sqrt(nu_hat) + self.eps) + self.weight_decay * rows
        return rows - self.learning_rate * step, AdamRows(mu, nu, count)
