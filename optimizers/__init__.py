"""Embedding-optimizer library: the AsyncEmbOptimizer protocol, the shared fused machinery, one file per
optimizer. Knows nothing of Hydra or the runner.

The public surface is what a user or a plug-in author needs: the protocol and its update record, the
context, the optimizers, the base classes to subclass (``FusedEmbOptimizer``: write a per-row rule;
``OptaxEmbOptimizer``: wrap a dense optax transformation) and the registry. Internals (dedupe,
segment-sum, ``RowContext``, bf16 rounding) stay importable from their modules (``optimizers.fused``).
"""
from .async_adagrad import AsyncAdagrad
from .async_adam import AsyncAdam
from .async_rowwise_adagrad import AsyncRowwiseAdagrad
from .async_sgd import AsyncSGD
from .context import AsyncEmbContext
from .dense import Adagrad, Adam, OptaxEmbOptimizer
from .fused import FusedEmbOptimizer, empty_update, make_update
from .protocol import AsyncEmbGradientUpdate, AsyncEmbOptimizer, supports_async_emb
from .registry import FUSED, REGISTRY, create

__all__ = [
    "AsyncEmbOptimizer", "AsyncEmbGradientUpdate", "supports_async_emb", "AsyncEmbContext", "make_update",
    "empty_update", "FusedEmbOptimizer", "OptaxEmbOptimizer", "AsyncAdam", "AsyncRowwiseAdagrad", "AsyncAdagrad",
    "AsyncSGD", "Adam", "Adagrad", "REGISTRY", "FUSED", "create",
]
