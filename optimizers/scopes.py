"""Named scopes of the fused update's phases, so a profile says where an update spends its time.

Every op of the fused update runs under one ``jax.named_scope`` named ``emb_<phase>``: the batch's dedupe, the
fp32 segment-sum of its gradients, the routing of ids and gradients between devices (bucketing and
collectives), the gather of the touched rows and their state, the optimizer's per-row rule, the gate's checks
(norm and finiteness of what the rule produced) and the in-place scatter. The scopes land in each compiled
op's ``op_name`` metadata, which TensorBoard's and Perfetto's traces show, and which
``benchmarks/phases.py`` reads to print time per phase. A scope costs nothing at run time.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from ._lazy import jax

PREFIX = "emb_"
PHASES = ("dedupe", "segment_sum", "routing", "gather", "rule", "gate", "scatter")


def phase(name: str) -> Any:
    """The context manager that puts the ops traced inside it in phase ``name`` (one of ``PHASES``)."""
    if name not in PHASES:
        raise ValueError(f"unknown phase {name!r} (one of {', '.join(PHASES)})")
    return jax.named_scope(PREFIX + name)


def in_phase(name: str) -> Callable[[Callable], Callable]:
    """Decorator: every call of the function traces its ops in phase ``name`` (``phase``)."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def scoped(*args: Any, **kwargs: Any) -> Any:
            with phase(name):
                return fn(*args, **kwargs)

        return scoped

    return wrap


def phase_of(op_name: str) -> str | None:
    """The innermost phase named in an op's ``op_name`` metadata (``jit(step)/emb_rule/mul``), or None."""
    found = None
    for part in op_name.split("/"):
        if part.startswith(PREFIX) and part[len(PREFIX):] in PHASES:
            found = part[len(PREFIX):]
    return found
