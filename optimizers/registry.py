"""Optimizer names -> classes. Adding an optimizer is one file here plus one YAML in conf/optimizer/."""
from __future__ import annotations

import dataclasses
import difflib

from .async_adagrad import AsyncAdagrad
from .async_adam import AsyncAdam
from .async_ftrl import AsyncFtrl
from .async_partial_rowwise_adam import AsyncPartialRowwiseAdam
from .async_rowwise_adagrad import AsyncRowwiseAdagrad
from .async_rowwise_adagrad_momentum import AsyncRowwiseAdagradMomentum
from .async_sgd import AsyncSGD
from .dense import Adagrad, Adam
from .hparams import problems

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
    """The optimizer registered as ``name``, built with ``hparams`` and checked: a ValueError for an unknown name
    (naming the known ones), for a hyperparameter the optimizer does not have (naming the ones it has), and for
    values :func:`optimizers.problems` finds (its lines, joined by ``"; "``), e.g. ``create("async_sgd",
    learning_rate=-1.0)`` raises ``learning_rate=-1.0 is outside (0, inf) (step size)``.

    Building the class itself (``optimizers.AsyncSGD(learning_rate=-1.0)``) does not check the values, so that a
    caller can report their problems in its own words (the runner's preflight names its config keys,
    ``optimizer.learning_rate=...``). Its update still does, when it is traced (``optimizers.checks.check_hparams``,
    for the fused and the dense optimizers alike): ``AsyncSGD: learning_rate=-1.0 is outside (0, inf) (step size);
    build it with values in range ...``, rather than training silently wrong."""
    try:
        cls = REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown embedding optimizer {name!r}; known: {', '.join(REGISTRY)}") from None
    if dataclasses.is_dataclass(cls):
        known = [f.name for f in dataclasses.fields(cls) if f.init]
        if unknown := [_unknown(key, known) for key in hparams if key not in known]:
            raise ValueError(f"{name} has no hyperparameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                             f"its hyperparameters: {', '.join(known)}")
    opt = cls(**hparams)
    if bad := problems(opt):
        raise ValueError("; ".join(bad))
    return opt


def _unknown(key: str, known: list[str]) -> str:
    """``'key'``, with the closest known name when one is close."""
    near = difflib.get_close_matches(key, known, n=1)
    return f"{key!r} (did you mean {near[0]}?)" if near else repr(key)
