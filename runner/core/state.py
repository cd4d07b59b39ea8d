"""The train state: one pytree, checkpointable and shardable as a whole."""
from __future__ import annotations

from typing import Any, NamedTuple

import jax

from optimizers import AsyncEmbGradientUpdate


class TrainState(NamedTuple):
    step: jax.Array  # int32 scalar: steps completed
    params: Any  # dense model parameters
    opt_state: Any  # optax state of the dense parameters
    tables: dict[str, jax.Array]  # embedding tables by name, sharded over the mesh's table axis
    emb_states: dict[str, Any]  # each table's embedding-optimizer state, sharded like its table
    pending: dict[str, AsyncEmbGradientUpdate]  # async mode: the deferred update of the last step ({} in sync)
    rng: jax.Array  # uint32 key data; per-step randomness is fold_in(rng, step)
