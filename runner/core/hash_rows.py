"""Rows of hash tables: where a slot's row lies, the rows a batch's ids read, and the rows given to new ids
reset (their row drawn afresh, their optimizer state as a row never trained). ``hash_tables.py`` maps ids to
slots; this module turns slots into rows of the table the fused optimizers update."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from optimizers.row_update import EmbOptState

from .embeddings import normal_block
from .hash_tables import Assigned, HashSpec, is_pad, key_hash


def slot_rows(spec: HashSpec, slots: jax.Array) -> jax.Array:
    """The row of each (global) slot: slot i is row i + 1 with one partition; slot j of partition p is row
    ``p * part_rows + 1 + j``."""
    cp = spec.part_capacity
    return (slots // cp) * spec.part_rows + 1 + slots % cp


def row_slots(spec: HashSpec, rows: jax.Array) -> jax.Array:
    """The (global) slot of each row, -1 for a row that holds no slot (padding, shared or unused, out of range):
    ``slot_rows``'s inverse."""
    part = rows // spec.part_rows
    j = rows - part * spec.part_rows - 1
    return jnp.where((rows >= 0) & (rows < spec.rows) & (j >= 0) & (j < spec.part_capacity),
                     part * spec.part_capacity + j, -1).astype(jnp.int32)


def rows_of(spec: HashSpec, slots: jax.Array, out_of_range: int) -> jax.Array:
    """The table rows of ``slots`` (``slot_rows``); no slot is the shared row (default=shared) or the
    out-of-range id ``out_of_range`` (reads zeros, updates nothing). Padding ids read row 0 in neither case:
    the caller passes their mask."""
    none = spec.shared_row if spec.default == "shared" else out_of_range
    return jnp.where(slots >= 0, slot_rows(spec, jnp.maximum(slots, 0)), none).astype(jnp.int32)


def key_rows(spec: HashSpec, keys: jax.Array, slots: jax.Array, out_of_range: int) -> jax.Array:
    """``rows_of`` the ids ``keys`` given ``slots``, padding ids on row 0."""
    return jnp.where(is_pad(keys), 0, rows_of(spec, slots, out_of_range))


def fresh_rows(spec: HashSpec, seed: jax.Array, fresh_keys: jax.Array, width: int, init_scale: float) -> jax.Array:
    """[N, width] float32: the initial row of each id, a function of (seed, id) only."""
    r = key_hash(fresh_keys[:, 0], fresh_keys[:, 1], 0x51ED)
    return normal_block(seed, r, jnp.arange(width)) * jnp.float32(init_scale)


RESET_CHUNK = 1024  # rows drawn afresh per iteration: the reset costs the new ids' rows, not the batch's


def reset_rows(spec: HashSpec, table: jax.Array, opt_state: Any, initial_state: Any, assigned: Assigned,
               seed: jax.Array, init_scale: float, row0: int | jax.Array = 0, width: int | None = None):
    """The table and optimizer state with each slot given to a new id reset: its row drawn afresh, each per-row
    leaf of its optimizer state (leading dim = the table's rows) set to ``initial_state``'s row 0 (the
    optimizer's state of a row never trained); under ``weight_decay_mode=decoupled_global`` its last touch is
    now, so its first update does not decay the fresh row for the steps before it held the slot. ``row0``: the
    global row of ``table``'s first (a row shard's). ``width``: the row's width when the table is stored wider
    (``stored_width``): the padding columns get zeros.

    The new ids are packed to the front and reset ``RESET_CHUNK`` at a time, as many chunks as there are new
    ids (none: no work), in place."""
    n, out = assigned.fresh.shape[0], table.shape[0]
    new = assigned.fresh < spec.capacity
    dest = jnp.where(new, jnp.cumsum(new) - 1, n)
    rows = jnp.full((n,), out, jnp.int32).at[dest].set(slot_rows(spec, assigned.fresh) - row0, mode="drop")
    keys = jnp.zeros((n, 2), jnp.uint32).at[dest].set(assigned.fresh_keys, mode="drop")
    k = min(RESET_CHUNK, n)

    def reset(r, leaf, init):
        if getattr(leaf, "ndim", 0) >= 1 and leaf.shape[0] == out:
            fill = jnp.broadcast_to(init[0], (r.shape[0], *leaf.shape[1:])).astype(leaf.dtype)
            return leaf.at[r].set(fill, mode="drop")
        return leaf

    def chunk(i, carry):  # the last chunk may overlap the one before: its rows get the same values again
        tab, st = carry
        start = jnp.minimum(i * k, n - k)
        r = lax.dynamic_slice_in_dim(rows, start, k)
        vals = fresh_rows(spec, seed, lax.dynamic_slice_in_dim(keys, start, k), width or tab.shape[1], init_scale)
        vals = jnp.pad(vals, ((0, 0), (0, tab.shape[1] - vals.shape[1])))  # padding columns (stored_width): zeros
        tab = tab.at[r].set(vals.astype(tab.dtype), mode="drop")
        st = jax.tree.map(lambda leaf, init: reset(r, leaf, init), st, initial_state)
        if isinstance(st, EmbOptState) and st.decay is not None:  # decoupled_global: nothing missed so far
            st = st._replace(decay=st.decay._replace(touch=st.decay.touch.at[r].set(st.decay.total, mode="drop")))
        return tab, st

    return lax.fori_loop(0, (jnp.sum(new) + k - 1) // k, chunk, (table, opt_state))


def reassigned_rows(spec: HashSpec, assigned: Assigned, num_rows: int) -> jax.Array:
    """int32 [N], ascending: the rows given to a new id this step, then ``num_rows`` (none) as padding."""
    return jnp.sort(jnp.where(assigned.fresh < spec.capacity, slot_rows(spec, assigned.fresh), num_rows))
