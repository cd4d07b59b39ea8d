"""Hash tables in the train step (``TrainProgram.step_core`` and ``predict``): the batch's raw ids mapped to rows
before the lookup, the rows given to new ids reset, a deferred update of a row given away dropped.

On one device (or with the table replicated over a data-parallel mesh) the mapping runs on the whole batch
(``hash_tables.assign``). On a row-sharded mesh each row shard holds whole partitions of the slots (a
partition is ``hash(id) mod partitions``; ``model.tables.<name>.partitions``, by default one per shard) with
their keys, metadata, sketch and rows: inside ``jax.shard_map`` every device gathers the batch's keys over the
mesh, runs the step for the partitions it holds (the others' ids are left to their shards), and a max over the
table axis gives every device each id's slot; a row given to a new id is reset on the shard that holds it. The
rows then reach their owners by the row layout's own routing, as a dense table's ids do. Shards that hold the
same partitions (data-parallel copies) see the same keys and make the same choices, so a sharded run maps
exactly as one device with the same partitions does. A modulo table's rows are its ids' hashes
(``modulo_rows``), colliding: ``collision_rate`` says how often.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from optimizers import without_rows

from .failures import traced
from .hash_rows import key_rows, reassigned_rows, reset_rows, row_slots
from .hash_tables import HashState, assign, find, is_pad, key_hash, keys_of, partition_of
from .id_sort import distinct_keys


def sharded(program: Any, name: str) -> bool:
    """Whether table ``name``'s slots are split over row shards (a row-sharded mesh)."""
    ctx = program.contexts[name]
    return ctx.sharded and ctx.layout.splits_rows


def state_specs(program: Any, name: str, state: HashState) -> HashState:
    """The ``PartitionSpec`` of each leaf of a hash table's ``HashState``: split by partition over the table
    axis on a row-sharded mesh (keys, metadata, per-partition sketch and fill counts), else replicated."""
    if not sharded(program, name):
        return jax.tree.map(lambda _: P(), state)
    axis = program.contexts[name].table_axis
    return jax.tree.map(lambda x: P(axis, *([None] * (len(x.shape) - 1))), state)


def _seed(state: Any, i: int) -> jax.Array:
    return jax.random.bits(jax.random.fold_in(jax.random.wrap_key_data(state.rng), 7919 + i), (2,), jnp.uint32)


class Moved(NamedTuple):
    """Which rows of a hash table this step gave to another id. On one device (or a replicated table): the
    slots' keys ``before`` and ``after`` the step's mapping (a row changed hands exactly when its slot's key
    changed, which ``drop_moved`` checks for the rows of a deferred update alone, with no sort of the batch). On a
    row-sharded mesh, where a shard holds only its own slots' keys: ``rows``, every shard's rows given to a new
    id, ascending and padded with the table's stored rows (``reassigned_rows``)."""

    rows: jax.Array | None = None
    before: jax.Array | None = None
    after: jax.Array | None = None


def map_batch(program: Any, state: Any, raw_ids: Mapping[str, jax.Array]):
    """Each hash table's slots for this batch (``assign``): returns the state with the slots
    updated and every row given to a new id reset (its values and its optimizer state), the rows the
    batch's ids read, each table's rows given to a new id this step (``Moved``), and the step's
    counts."""
    hashed, tables, emb_states = dict(state.hashed), dict(state.tables), dict(state.emb_states)
    rows, moved, metrics = {}, {}, {}
    for i, n in enumerate(sorted(state.hashed)):
        spec = program.tables[n]
        keys = keys_of(raw_ids[n])
        with traced(program, n, "its rows given to new ids were reset"):
            initial = program.emb_optimizers[n].init(1, spec.columns)
        step = _sharded_step if sharded(program, n) else _step
        hashed[n], tables[n], emb_states[n], rows[n], moved[n], counts = step(
            program, n, state.hashed[n], tables[n], emb_states[n], keys, state.step, _seed(state, i), initial)
        metrics.update({f"emb/occupancy/{n}": counts[3].astype(jnp.float32) / spec.hash.capacity,
                        f"emb/admitted/{n}": counts[0], f"emb/evicted/{n}": counts[1],
                        f"emb/unadmitted_lookups/{n}": counts[2]})
    metrics.update(modulo_metrics(program, raw_ids))
    return state._replace(hashed=hashed, tables=tables, emb_states=emb_states), rows, moved, metrics


def _step(program, n, hstate, table, emb_state, keys, step, seed, initial):
    """One device's (or a replicated table's) mapping: ``(state, table, emb state, rows, moved, counts)``, the
    counts ``[admitted, evicted, unadmitted lookups, filled slots]``."""
    spec, out = program.tables[n], program.contexts[n].stored_rows
    before = hstate.keys
    hstate, got = assign(spec.hash, hstate, keys, step)
    table, emb_state = reset_rows(spec.hash, table, emb_state, initial, got, seed, spec.init_scale, width=spec.width)
    counts = jnp.stack([got.admitted, got.evicted, got.unadmitted, jnp.sum(hstate.filled)])
    rows = key_rows(spec.hash, keys, got.slots, out)
    return hstate, table, emb_state, rows, Moved(before=before, after=hstate.keys), counts


def _sharded_step(program, n, hstate, table, emb_state, keys, step, seed, initial):
    """``_step`` on a row-sharded mesh: each shard maps the ids of the partitions it holds (module docstring)."""
    spec, ctx = program.tables[n], program.contexts[n]
    h, out, axis = spec.hash, ctx.stored_rows, ctx.table_axis
    per = h.partitions // ctx.table_shards  # partitions a shard holds
    s_specs = state_specs(program, n, hstate)
    e_specs = ctx.state_specs(emb_state)

    def body(hs, tab, es, k, step, seed):
        keys_all = lax.all_gather(k.reshape(-1, 2), ctx.batch_axes, axis=0, tiled=True)  # the whole batch's ids
        shard = lax.axis_index(axis)
        hs, got = assign(h, hs, keys_all, step, shard * per)
        mine = partition_of(h, keys_all[:, 0], keys_all[:, 1]) // per == shard
        slots = lax.pmax(jnp.where(mine, got.slots, -2), axis)  # each id's slot, from the shard that holds it
        tab, es = reset_rows(h, tab, es, initial, got, seed, spec.init_scale, shard * per * h.part_rows, spec.width)
        moved = jnp.sort(lax.all_gather(reassigned_rows(h, got, out), axis, axis=0, tiled=True))
        counts = lax.psum(jnp.stack([got.admitted, got.evicted, got.unadmitted, jnp.sum(hs.filled)]), axis)
        return hs, tab, es, key_rows(h, keys_all, slots, out), moved, counts

    f = jax.shard_map(body, mesh=ctx.mesh,
                      in_specs=(s_specs, ctx.table_spec(), e_specs, P(ctx.batch_axes), P(), P()),
                      out_specs=(s_specs, ctx.table_spec(), e_specs, P(), P(), P()), check_vma=False)
    hstate, table, emb_state, rows, moved, counts = f(hstate, table, emb_state, keys, step, seed)
    return hstate, table, emb_state, rows.reshape(keys.shape[:-1]), Moved(rows=moved), counts


def read_rows(program: Any, state: Any, raw_ids: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The rows a batch's ids of each hash table read, changing nothing (evaluation)."""
    out = {}
    for n in state.hashed:
        spec, stored = program.tables[n], program.contexts[n].stored_rows
        keys = keys_of(raw_ids[n])
        if not sharded(program, n):
            out[n] = key_rows(spec.hash, keys, find(spec.hash, state.hashed[n], keys), stored)
            continue
        ctx, h = program.contexts[n], spec.hash
        per = h.partitions // ctx.table_shards

        def body(hs, k, h=h, per=per, axis=ctx.table_axis, batch_axes=ctx.batch_axes):
            keys_all = lax.all_gather(k.reshape(-1, 2), batch_axes, axis=0, tiled=True)
            shard = lax.axis_index(axis)
            mine = partition_of(h, keys_all[:, 0], keys_all[:, 1]) // per == shard
            return lax.pmax(jnp.where(mine, find(h, hs, keys_all, shard * per), -2), axis)

        slots = jax.shard_map(body, mesh=ctx.mesh, in_specs=(state_specs(program, n, state.hashed[n]),
                                                               P(ctx.batch_axes)),
                              out_specs=P(), check_vma=False)(state.hashed[n], keys)
        out[n] = key_rows(h, keys, slots.reshape(keys.shape[:-1]), stored)
    return out


def drop_moved(program: Any, head: Mapping[str, Any], moved: Mapping[str, Moved]):
    """Async: each hash table's deferred update without the rows given to another id since its gradient
    was computed (their gradient belongs to the id that lost the row), and how many distinct rows it dropped.

    The tokens of a dropped row are left out of the sums, the norm and the gate, and a per-device record, the
    routed row layout's, stays sorted per device, as its routing needs. On one device (or a replicated table) a
    row was given to another id exactly when its slot's key changed in this step's mapping: the record's rows
    are checked against the keys before and after it. On a row-sharded mesh, where a shard holds only its own
    slots' keys, they are searched for in the sorted rows every shard gave to new ids. Either way the dropped
    rows are closed up in the record (``without_rows``: work in the record's size, no new dedupe)."""
    out, dropped = dict(head), {}
    for n, m in moved.items():
        if n not in head:
            continue
        u, ctx = head[n], program.contexts[n]
        if m.before is not None:  # the rows whose slot's key changed (no sort)
            slots = row_slots(program.tables[n].hash, u.unique_tokens)
            at = jnp.maximum(slots, 0)
            gone = jnp.any(m.before[at] != m.after[at], axis=-1) & (slots >= 0) & u.pending
            count = jnp.sum(gone)
        else:  # found among the rows every shard gave away; a row may sit in several devices' blocks: counted once
            unique = u.unique_tokens
            at = jnp.minimum(jnp.searchsorted(m.rows, unique), m.rows.shape[0] - 1)
            gone = (m.rows[at] == unique) & (unique < ctx.stored_rows) & u.pending
            hit = jnp.zeros(m.rows.shape, bool).at[jnp.where(gone, at, m.rows.shape[0])].set(True, mode="drop")
            count = jnp.sum(hit)
        out[n] = without_rows(ctx, u, gone)
        dropped[f"emb/stale_dropped/{n}"] = count.astype(jnp.int32)
    return out, dropped


def keyed_rows(spec: Any, raw: jax.Array, hashed_rows: Mapping[str, jax.Array]) -> jax.Array:
    """The rows of a hash table's (``map_batch``/``read_rows``) or a modulo table's ids."""
    return hashed_rows[spec.name] if spec.kind == "hash" else modulo_rows(keys_of(raw), spec.vocab)


def modulo_metrics(program: Any, raw_ids: Mapping[str, jax.Array]) -> dict:
    """``emb/collision_rate/<table>`` of each modulo table (``collision_rate``)."""
    out = {}
    for n, raw in raw_ids.items():
        spec = program.logical[n]
        if spec.kind == "modulo":
            keys = keys_of(raw)
            out[f"emb/collision_rate/{n}"] = collision_rate(keys, modulo_rows(keys, spec.vocab), spec.rows)
    return out


def modulo_rows(keys: jax.Array, vocab: int) -> jax.Array:
    """kind=modulo: row ``1 + hash(id) mod (vocab - 1)`` of each id, padding row 0 (distinct ids may collide)."""
    r = key_hash(keys[..., 0], keys[..., 1], 0) % jnp.uint32(vocab - 1)
    return jnp.where(is_pad(keys), 0, r.astype(jnp.int32) + 1)


def collision_rate(keys: jax.Array, rows: jax.Array, num_rows: int) -> jax.Array:
    """1 - (distinct rows) / (distinct ids) of the batch: the share of its distinct ids that found their row
    already taken by another (0: no two ids share a row)."""
    _, _, valid, _, _ = distinct_keys(keys.reshape(-1, 2))
    ids = jnp.sum(valid)
    r = jnp.sort(jnp.where(rows.reshape(-1) > 0, rows.reshape(-1), num_rows + 1))
    distinct = jnp.sum((r != jnp.concatenate([jnp.full((1,), -1, r.dtype), r[:-1]])) & (r <= num_rows))
    return jnp.where(ids > 0, 1.0 - distinct / jnp.maximum(ids, 1), 0.0).astype(jnp.float32)
