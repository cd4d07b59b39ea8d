"""The flush (``TrainProgram.flush``): every pending deferred update applied now, each gated like a step's, and
the skip counts that go with every table's applied or refused updates."""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp

from .diagnostics import skip_metrics
from .state import SkipCounts, TrainState


def count_skips(skips: Mapping[str, SkipCounts], valid: Mapping[str, jax.Array],
                pending: Mapping[str, jax.Array]) -> dict[str, SkipCounts]:
    """A pending update that was not applied is one more skip; an applied one ends the streak."""
    out = dict(skips)
    for n, v in valid.items():
        skipped = pending[n] & ~v
        s = skips[n]
        out[n] = SkipCounts(s.total + skipped.astype(jnp.int32),
                            jnp.where(skipped, s.streak + 1, jnp.where(v, 0, s.streak)).astype(jnp.int32))
    return out


def flush_state(program: Any, state: TrainState) -> tuple[TrainState, dict[str, jax.Array]]:
    """Apply every pending deferred update now; afterwards nothing is pending. Returns the state and the
    flush's record: ``emb/flush_grad_norm``, ``emb/flush_valid`` (and per table) and the skip counts
    after it (sync mode, where nothing is ever pending: the skip counts only)."""
    if not state.pending:
        return state, skip_metrics(state.skips)
    if program.staleness > 1:
        return _flush_queue(program, state)
    tables, emb_states, pending, applied = dict(state.tables), dict(state.emb_states), {}, {}
    ctxs = {n: c.fresh() for n, c in program.contexts.items()}
    for n, upd in state.pending.items():
        ctx = ctxs[n]
        tables[n], emb_states[n], *applied[n] = program._apply(n, ctx, upd, tables[n], emb_states[n], jnp.zeros(()))
        pending[n] = upd._replace(pending=jnp.zeros((), bool))
    skips = count_skips(state.skips, {n: a[1] for n, a in applied.items()},
                        {n: u.pending for n, u in state.pending.items()})
    return _flushed(state, tables, emb_states, pending, skips, applied, ctxs)


def _flush_queue(program: Any, state: TrainState) -> tuple[TrainState, dict[str, jax.Array]]:
    """``flush`` with a queue of k > 1 records: each table's records applied oldest first, each gated like
    a step's; afterwards none is pending.
    A table's record: the norm over its applied records, valid when every pending one was applied and one
    was."""
    tables, emb_states, skips = dict(state.tables), dict(state.emb_states), dict(state.skips)
    applied, pending, ctxs = {}, {}, {}
    for n, queue in state.pending.items():
        sq, ok, any_pending, rows = jnp.zeros(()), jnp.ones((), bool), jnp.zeros((), bool), None
        for upd in queue:  # oldest first
            ctxs[n] = program.contexts[n].fresh()
            tables[n], emb_states[n], norm, valid, rows = program._apply(n, ctxs[n], upd, tables[n],
                                                                         emb_states[n], jnp.zeros(()))
            skips.update(count_skips({n: skips[n]}, {n: valid}, {n: upd.pending}))
            sq = sq + jnp.where(upd.pending, norm * norm, 0.0)
            ok, any_pending = ok & (valid | ~upd.pending), any_pending | upd.pending
        applied[n] = (jnp.sqrt(sq), ok & any_pending, rows)
        pending[n] = tuple(upd._replace(pending=jnp.zeros((), bool)) for upd in queue)
    return _flushed(state, tables, emb_states, pending, skips, applied, ctxs)


def _flushed(state, tables, emb_states, pending, skips, applied, ctxs):
    """The flushed state and the flush's record (``flush``)."""
    norms = jnp.stack([a[0] for a in applied.values()])
    metrics = {"emb/flush_grad_norm": jnp.sqrt(jnp.sum(norms * norms)),
               "emb/flush_valid": jnp.all(jnp.stack([a[1] for a in applied.values()]))}
    for n, (norm, valid, _) in applied.items():
        if "route_refused" in ctxs[n].results:
            metrics[f"emb/route_refused/{n}"] = ctxs[n].results["route_refused"]
        metrics[f"emb/flush_grad_norm/{n}"] = norm
        metrics[f"emb/flush_valid/{n}"] = valid
    metrics.update(skip_metrics(skips))
    return state._replace(tables=tables, emb_states=emb_states, pending=pending, skips=skips), metrics
