"""The train state: one pytree, checkpointable and shardable as a whole."""
from __future__ import annotations

from typing import Any, NamedTuple

import jax

from optimizers import AsyncEmbGradientUpdate


class SkipCounts(NamedTuple):
    """One table's refused updates: pending updates its optimizer did not apply (``valid`` false: a
    non-finite gradient, or new rows or state that would not be finite)."""

    total: jax.Array  # int32 scalar: refused since the run started
    streak: jax.Array  # int32 scalar: refused in a row, since the last applied update


class TrainState(NamedTuple):
    """Everything a step reads and writes, as one pytree (after big_vision's and maxtext's train states): the
    step is ``step(state, batch) -> (state, metrics)``, and a checkpoint saves and restores it whole."""

    step: jax.Array  # int32 scalar: steps completed
    params: Any  # dense model parameters
    opt_state: Any  # optax state of the dense parameters
    tables: dict[str, jax.Array]  # embedding tables by name, sharded over the mesh's table axis
    emb_states: dict[str, Any]  # each table's embedding-optimizer state, sharded like its table
    pending: dict[str, AsyncEmbGradientUpdate]  # async mode: the deferred update of the last step ({} in sync)
    rng: jax.Array  # uint32 key data; per-step randomness is fold_in(rng, step)
    skips: dict[str, SkipCounts]  # each table's refused updates (emb/skipped_updates), replicated
    hashed: dict[str, Any] = {}  # kind=hash tables: slots and sketch (``hash_tables.HashState``), by partition
