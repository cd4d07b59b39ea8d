"""The flush (``TrainProgram.flush``): every pending deferred update applied now, each gated like a step's, and
the skip counts that go with every table's applied or refused updates."""
from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from jax import lax

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
        tables[n], emb_states[n], norm, valid, _ = program._apply(n, ctx, upd, tables[n], emb_states[n],
                                                                  jnp.zeros(()))
        applied[n] = (norm, valid)
        pending[n] = upd._replace(pending=jnp.zeros((), bool))
    skips = count_skips(state.skips, {n: a[1] for n, a in applied.items()},
                        {n: u.pending for n, u in state.pending.items()})
    return _flushed(state, tables, emb_states, pending, skips, applied, {n: c.results for n, c in ctxs.items()})


def _flush_queue(program: Any, state: TrainState) -> tuple[TrainState, dict[str, jax.Array]]:
    """``flush`` with a queue of k > 1 records: each table's records applied oldest first, each gated like
    a step's; afterwards none is pending. The records are stacked and applied by one ``lax.scan``, so the flush
    compiles one update a table whatever k is (unrolled, a queue of 64 took minutes to compile).
    A table's record: the norm over its applied records, valid when every pending one was applied and one
    was; its rows refused by the routing (``emb/route_refused``) summed over the records."""
    tables, emb_states, skips = dict(state.tables), dict(state.emb_states), dict(state.skips)
    applied, pending, results = {}, {}, {}
    for n, queue in state.pending.items():
        def body(carry, upd, n=n):
            table, emb_state, skip, sq, ok, any_pending = carry
            ctx = program.contexts[n].fresh()
            table, emb_state, norm, valid, _ = program._apply(n, ctx, upd, table, emb_state, jnp.zeros(()))
            skip = count_skips({n: skip}, {n: valid}, {n: upd.pending})[n]
            sq = sq + jnp.where(upd.pending, norm * norm, 0.0)
            ok, any_pending = ok & (valid | ~upd.pending), any_pending | upd.pending
            refused = ctx.results.get("route_refused")
            return (table, emb_state, skip, sq, ok, any_pending), refused

        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *queue)  # oldest first
        start = (tables[n], emb_states[n], skips[n], jnp.zeros(()), jnp.ones((), bool), jnp.zeros((), bool))
        (tables[n], emb_states[n], skips[n], sq, ok, any_pending), refused = lax.scan(body, start, stacked)
        applied[n] = (jnp.sqrt(sq), ok & any_pending)
        if refused is not None:
            results[n] = {"route_refused": jnp.sum(refused)}
        pending[n] = tuple(upd._replace(pending=jnp.zeros((), bool)) for upd in queue)
    return _flushed(state, tables, emb_states, pending, skips, applied, results)


def _flushed(state, tables, emb_states, pending, skips, applied, results):
    """The flushed state and the flush's record (``flush``); ``results``: each table's update results
    (``AsyncEmbContext.results``) that the record reports."""
    norms = jnp.stack([a[0] for a in applied.values()])
    metrics = {"emb/flush_grad_norm": jnp.sqrt(jnp.sum(norms * norms)),
               "emb/flush_valid": jnp.all(jnp.stack([a[1] for a in applied.values()]))}
    for n, (norm, valid) in applied.items():
        if "route_refused" in results.get(n, {}):
            metrics[f"emb/route_refused/{n}"] = results[n]["route_refused"]
        metrics[f"emb/flush_grad_norm/{n}"] = norm
        metrics[f"emb/flush_valid/{n}"] = valid
    metrics.update(skip_metrics(skips))
    return state._replace(tables=tables, emb_states=emb_states, pending=pending, skips=skips), metrics
