"""Embedding-optimizer library: the AsyncEmbOptimizer protocol, the shared fused machinery, one file per
optimizer, one module per table layout. Knows nothing of Hydra or the runner.

The public surface is what a user, a plug-in author or the runner needs: the protocol and its update record,
the context and the layouts (``optimizers.layouts``) with the words that select them, the optimizers, the
base classes to subclass (``FusedEmbOptimizer``: write a per-row rule; ``OptaxEmbOptimizer``: wrap a dense
optax transformation), the registry, the dedupe and record helpers, stochastic rounding's hash, the XLA
options a table-updating step needs, id permutation, and the hyperparameter declarations. Importing it
imports no JAX (``optimizers._lazy``).
"""
from . import layouts
from .async_adagrad import AsyncAdagrad
from .async_adam import AsyncAdam
from .async_ftrl import AsyncFtrl
from .async_partial_rowwise_adam import AsyncPartialRowwiseAdam
from .async_rowwise_adagrad import AsyncRowwiseAdagrad
from .async_rowwise_adagrad_momentum import AsyncRowwiseAdagradMomentum
from .async_sgd import AsyncSGD
from .context import AsyncEmbContext
from .dense import Adagrad, Adam, OptaxEmbOptimizer
from .fused import EmbOptState, FusedEmbOptimizer, RowContext
from .row_update import GlobalDecay, WeightDecayMode
from .hparams import Range, describe, hparam, problems, ranges
from .layouts import ROUTE_CAPACITY, ROUTE_CAPACITY_MAX, Choice, Layout, RouteOverflow, Routing, TableLayout, select
from .protocol import AsyncEmbGradientUpdate, AsyncEmbOptimizer, no_fused_update_message, supports_async_emb
from .record import (dedupe, empty_update, make_update, num_unique_for, record_for, record_token_ids, segment_rows,
                     segment_sum, without_rows)
from .registry import FUSED, REGISTRY, create
from .rounding import hash2d, stochastic_round_bf16
from .routing import permute_ids, route_peak, unpermute_ids
from .schedules import Schedule, ScheduleKind
from .xla import compiler_options

__all__ = [
    "AsyncEmbOptimizer", "AsyncEmbGradientUpdate", "supports_async_emb", "no_fused_update_message",
    "AsyncEmbContext", "layouts", "Layout", "select", "Choice", "TableLayout", "Routing", "RouteOverflow",
    "ROUTE_CAPACITY", "ROUTE_CAPACITY_MAX", "make_update", "empty_update", "without_rows", "dedupe", "num_unique_for", "segment_sum",
    "segment_rows", "record_for", "record_token_ids", "FusedEmbOptimizer", "EmbOptState", "RowContext",
    "OptaxEmbOptimizer", "AsyncAdam",
    "AsyncRowwiseAdagrad", "AsyncAdagrad", "AsyncSGD", "AsyncFtrl", "AsyncPartialRowwiseAdam",
    "AsyncRowwiseAdagradMomentum", "Adam", "Adagrad", "REGISTRY", "FUSED", "create",
    "hparam", "Range", "problems", "ranges", "describe", "hash2d", "stochastic_round_bf16", "permute_ids",
    "unpermute_ids", "route_peak", "compiler_options", "Schedule", "ScheduleKind",
    "WeightDecayMode", "GlobalDecay",
]
