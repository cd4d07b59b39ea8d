"""What the train step reports beside its loss: skipped-update counts, which steps log their details, and
the rows a batch reads that still wait for a deferred update (``emb/stale_rows``)."""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Mapping

import jax
import jax.numpy as jnp

from optimizers import AsyncEmbContext, dedupe

from .state import SkipCounts

def skip_metrics(skips: Mapping[str, SkipCounts]) -> dict[str, jax.Array]:
    """``emb/skipped_updates`` (all tables, since the start) and per table: ``emb/skipped_updates/<t>`` and
    ``emb/consecutive_skips/<t>`` (refused in a row; trainer.max_skipped_updates stops the run on it)."""
    out = {"emb/skipped_updates": sum(s.total for s in skips.values()) if skips else jnp.zeros((), jnp.int32)}
    for n, s in skips.items():
        out[f"emb/skipped_updates/{n}"] = s.total
        out[f"emb/consecutive_skips/{n}"] = s.streak
    return out


def is_log_step(step, interval: int, last: int):
    """Whether the loop logs 1-based ``step``: every ``interval``-th and the last. Python ints or jax arrays."""
    return (step % interval == 0) | (step == last)


def routed_diagnostics(ids: jax.Array, ctx: AsyncEmbContext, pending: list[tuple[jax.Array, jax.Array]] | None):
    """A routed table's (distinct ids of the batch, rows it reads that still have a pending update, or -1
    without one), from one dedupe of the whole batch (run on logged steps only)."""
    unique = dedupe(ids, ctx.stored_rows, ctx.num_unique)[0]
    stale = overlap(unique, pending, ctx.stored_rows, per_device=True) if pending is not None else jnp.int32(-1)
    return jnp.sum(unique < ctx.stored_rows).astype(jnp.int32), stale


def overlap(unique: jax.Array, pending: list[tuple[jax.Array, jax.Array]], rows: int,
             per_device: bool = False) -> jax.Array:
    """Rows this batch reads that still have a pending (not yet applied) update in any of the ``pending``
    records (one, or the queue's k), each given as (its unique ids, whether it is pending). ``per_device``: a
    record holds each device's own sorted ids (routed), sorted together here (repeats do no harm)."""
    hit = jnp.zeros(unique.shape, bool)
    for tokens, is_pending in pending:
        p = jnp.sort(tokens) if per_device else tokens
        pos = jnp.clip(jnp.searchsorted(p, unique, method="scan"), 0, p.shape[0] - 1)
        hit = hit | ((p[pos] == unique) & is_pending)
    return jnp.sum(hit & (unique < rows)).astype(jnp.int32)


def settings_of(opt: Any) -> str:
    """An embedding optimizer as a message shows it: its class and the settings that differ from the class's
    defaults, an enum by its value (``AsyncSGD(learning_rate=1e+38)``, where the dataclass repr lists every field,
    enums and the schedule's included); ``repr`` for one that is not a dataclass."""
    if not dataclasses.is_dataclass(opt) or isinstance(opt, type):
        return repr(opt)
    shown = []
    for f in dataclasses.fields(opt):
        value = getattr(opt, f.name)
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        try:
            same = default is not dataclasses.MISSING and bool(value == default)
        except Exception:  # noqa: BLE001 - an array field: shown
            same = False
        if not f.repr or same:
            continue
        text = settings_of(value) if dataclasses.is_dataclass(value) else (
            str(value.value) if isinstance(value, enum.Enum) else repr(value))
        shown.append(f"{f.name}={text}")
    return f"{type(opt).__name__}({', '.join(shown)})"
