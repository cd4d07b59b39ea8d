"""Embedding-optimizer library: the AsyncEmbOptimizer protocol, the shared fused machinery, one file per
optimizer. Knows nothing of Hydra or the runner."""
from .async_adagrad import AsyncAdagrad
from .async_adam import AsyncAdam
from .async_rowwise_adagrad import AsyncRowwiseAdagrad
from .async_sgd import AsyncSGD
from .context import COLUMN, ROW, AsyncEmbContext, num_unique_for
from .dense import Adagrad, Adam, OptaxEmbOptimizer
from .fused import EmbOptState, FusedEmbOptimizer, RowContext, dedupe, empty_update, make_update, segment_sum
from .protocol import (NO_FUSED_UPDATE, AsyncEmbGradientUpdate, AsyncEmbOptimizer, no_fused_update_message,
                       supports_async_emb)
from .registry import FUSED, REGISTRY, create

__all__ = [
    "AsyncAdagrad", "AsyncAdam", "AsyncRowwiseAdagrad", "AsyncSGD", "Adagrad", "Adam", "OptaxEmbOptimizer",
    "COLUMN", "ROW", "AsyncEmbContext", "num_unique_for", "EmbOptState", "FusedEmbOptimizer", "RowContext",
    "dedupe", "empty_update", "make_update", "segment_sum", "NO_FUSED_UPDATE", "AsyncEmbGradientUpdate",
    "AsyncEmbOptimizer", "no_fused_update_message", "supports_async_emb", "FUSED", "REGISTRY", "create",
]
