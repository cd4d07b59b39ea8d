"""Optimizer names -> classes. Adding an optimizer is one file here plus one YAML in conf/optimizer/."""
from __future__ import annotations

from .async_adagrad import AsyncAdagrad
from .async_adam import AsyncAdam
from .async_ftrl import AsyncFtrl
from .async_partial_rowwise_adam import AsyncPartialRowwiseAdam
from .async_rowwise_adagrad import AsyncRowwiseAdagrad
from .async_rowwise_adagrad_momentum import AsyncRowwiseAdagradMomentum
from .async_sgd import AsyncSGD
from .dense import Adagrad, Adam

REGISTRY: dict[str, type] = {
    "async_adam": AsyncAdam,
    "async_rowwise_adagrad": AsyncRowwiseAdagrad,
    "async_adagrad": AsyncAdagrad,
    "async_sgd": AsyncSGD,
    "async_ftrl": AsyncFtrl,
    "async_partial_rowwise_adam": AsyncPartialRowwiseAdam,
    "async_rowwise_adagrad_momentum": AsyncRowwiseAdagradMomentum,
    "adam": Adam,
    "adagrad": Adagrad,
}
FUSED = tuple(name for name in REGISTRY if name.startswith("async_"))


def create(name: str, **hparams):
    """The optimizer registered as ``name``, built with ``hparams``; a ValueError naming the known ones."""
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown embedding optimizer {name!r}; known: {', '.join(REGISTRY)}") from None
    return cls(**hparams)
